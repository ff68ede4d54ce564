-- One batch of the master list in cursor (address) order, filtered.
-- KEYS[1] = "<prefix>master:"
-- ARGV: now_ms, after ("" = start), limit, budget, want ("j" JSON or "a" address),
--       game (lowercased; "" = all: walk P list, else the game's index P g:<game>),
--       nterms, then nterms triples (op, a, b) of the filter program:
--   eq FIELD VALUE | notempty | notfull | tags - T1,T2 (all present) | true |
--   nor N | nand N  (nor/nand take the next N terms; top-level terms are ANDed).
-- Looks at no more than `budget` entries, so a batch may hold fewer than `limit` servers
-- while more remain. Expired entries not yet swept are skipped; a few are swept.
-- Returns {next ("" at the end), item...}.
local P = KEYS[1]
local now = tonumber(ARGV[1])
local after = ARGV[2]
local limit, budget = tonumber(ARGV[3]), tonumber(ARGV[4])
local want = ARGV[5]
local index = ARGV[6] == '' and (P .. 'list') or (P .. 'g:' .. ARGV[6])
local nterms = tonumber(ARGV[7])

local terms = {}
for i = 0, nterms - 1 do
  terms[#terms + 1] = {ARGV[8 + i * 3], ARGV[9 + i * 3], ARGV[10 + i * 3]}
end

-- Fetch only the fields the terms read: expiry, the wanted item, and the filtered ones.
local FIELDS = {'e'}
local IDX = {e = 1}
local function need(f)
  if not IDX[f] then
    FIELDS[#FIELDS + 1] = f
    IDX[f] = #FIELDS
  end
end
for _, t in ipairs(terms) do
  if t[1] == 'eq' then need(t[2])
  elseif t[1] == 'notempty' then need('p')
  elseif t[1] == 'notfull' then need('p'); need('x')
  elseif t[1] == 'tags' then need('t')
  end
end
FIELDS[#FIELDS + 1] = want

-- Evaluates the term at i against server values v; returns the result and the index of
-- the term after it (groups consume their members).
local function eval(i, v)
  local t = terms[i]
  local op = t[1]
  if op == 'nor' or op == 'nand' then
    local n = tonumber(t[2])
    local j = i + 1
    local any, all = false, true
    for _ = 1, n do
      if not terms[j] then break end
      local r
      r, j = eval(j, v)
      any = any or r
      all = all and r
    end
    if op == 'nor' then return not any, j end
    return not all, j
  elseif op == 'eq' then
    return v[IDX[t[2]]] == t[3], i + 1
  elseif op == 'notempty' then
    return tonumber(v[IDX['p']] or 0) > 0, i + 1
  elseif op == 'notfull' then
    return tonumber(v[IDX['p']] or 0) < tonumber(v[IDX['x']] or 0), i + 1
  elseif op == 'tags' then
    local have = v[IDX['t']] or ''
    for tag in string.gmatch(t[3], '[^,]+') do
      if not string.find(have, ',' .. tag .. ',', 1, true) then return false, i + 1 end
    end
    return true, i + 1
  elseif op == 'true' then
    return true, i + 1
  end
  return false, i + 1
end

local function match(v)
  local i = 1
  while i <= #terms do
    local r
    r, i = eval(i, v)
    if not r then return false end
  end
  return true
end

local out = {''}
local found, seen = 0, 0
local cursor = after == '' and '-' or ('(' .. after)
local last = nil
local done = false
while found < limit and seen < budget do
  local chunk = math.min(256, budget - seen)
  local keys = redis.call('ZRANGEBYLEX', index, cursor, '+', 'LIMIT', 0, chunk)
  local stopped_early = false
  for idx, a in ipairs(keys) do
    seen = seen + 1
    last = a
    local v = redis.call('HMGET', P .. 's:' .. a, unpack(FIELDS))
    if v[1] and tonumber(v[1]) > now and match(v) then
      out[#out + 1] = v[#FIELDS]
      found = found + 1
      if found >= limit then
        stopped_early = idx < #keys
        break
      end
    end
  end
  if #keys < chunk then
    -- The list ends inside this chunk: done unless the limit cut the chunk short.
    done = not stopped_early
    break
  end
  cursor = '(' .. last
end
if not done and last then
  out[1] = last
end

local old = redis.call('ZRANGEBYSCORE', P .. 'exp', '-inf', now, 'LIMIT', 0, 16)
for _, a in ipairs(old) do
  local o = redis.call('HMGET', P .. 's:' .. a, 'ip', 'g')
  if o[1] then
    redis.call('ZREM', P .. 'ip:' .. o[1], a)
  end
  if o[2] then
    redis.call('ZREM', P .. 'g:' .. o[2], a)
  end
  redis.call('DEL', P .. 's:' .. a)
  redis.call('ZREM', P .. 'list', a)
  redis.call('ZREM', P .. 'exp', a)
end
return out
