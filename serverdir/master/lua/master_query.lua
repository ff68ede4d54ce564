-- One batch of the master list in cursor (address) order, filtered.
-- KEYS[1] = "<prefix>master:" (P)
-- ARGV: now_ms, after ("" = start), limit, budget, want ("j" JSON or "a" address),
--       game (lowercased; "" = all: walk P list, else the game's index P g:<game>),
--       nterms, then nterms triples (op, a, b) of the filter program:
--   eq COLUMN VALUE | notempty | notfull | tags - T1,T2 (all present) | true |
--   nor N | nand N  (nor/nand take the next N terms; top-level terms are ANDed).
-- Reads column-wise: per chunk of up to 256 addresses one ZMSCORE for the expiries and one HMGET
-- per column the filter uses, then the wanted JSON of the matches only. Looks at no more
-- than `budget` entries, so a batch may hold fewer than `limit` servers while more
-- remain. Expired entries not yet swept are skipped; a few are swept.
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

-- The columns the terms read.
local needed, NEEDED = {}, {}
local function need(c)
  if not needed[c] then
    needed[c] = true
    NEEDED[#NEEDED + 1] = c
  end
end
for _, t in ipairs(terms) do
  if t[1] == 'eq' then need(t[2])
  elseif t[1] == 'notempty' then need('p')
  elseif t[1] == 'notfull' then need('p'); need('x')
  elseif t[1] == 'tags' then need('t')
  end
end

local col = {}

-- Evaluates the term at i for row r; returns the result and the index of the term after
-- it (groups consume their members).
local function eval(i, r)
  local t = terms[i]
  local op = t[1]
  if op == 'nor' or op == 'nand' then
    local n = tonumber(t[2])
    local j = i + 1
    local any, all = false, true
    for _ = 1, n do
      if not terms[j] then break end
      local res
      res, j = eval(j, r)
      any = any or res
      all = all and res
    end
    if op == 'nor' then return not any, j end
    return not all, j
  elseif op == 'eq' then
    return col[t[2]][r] == t[3], i + 1
  elseif op == 'notempty' then
    return tonumber(col['p'][r] or 0) > 0, i + 1
  elseif op == 'notfull' then
    return tonumber(col['p'][r] or 0) < tonumber(col['x'][r] or 0), i + 1
  elseif op == 'tags' then
    local have = col['t'][r] or ''
    for tag in string.gmatch(t[3], '[^,]+') do
      if not string.find(have, ',' .. tag .. ',', 1, true) then return false, i + 1 end
    end
    return true, i + 1
  elseif op == 'true' then
    return true, i + 1
  end
  return false, i + 1
end

local function match(r)
  local i = 1
  while i <= #terms do
    local res
    res, i = eval(i, r)
    if not res then return false end
  end
  return true
end

local matched = {}
local seen = 0
local cursor = after == '' and '-' or ('(' .. after)
local last = nil
local done = false
local rounds = 0
while #matched < limit and seen < budget do
  -- A first chunk little larger than what is still wanted: a small filtered batch reads
  -- few rows; a sparse filter grows the chunk on the next round.
  local chunk = math.min(256, budget - seen, (limit - #matched) * (1 + rounds) + 16)
  rounds = rounds + 1
  local keys = redis.call('ZRANGEBYLEX', index, cursor, '+', 'LIMIT', 0, chunk)
  if #keys == 0 then
    done = true
    break
  end
  local exps = redis.call('ZMSCORE', P .. 'exp', unpack(keys))
  for _, c in ipairs(NEEDED) do
    col[c] = redis.call('HMGET', P .. 'c:' .. c, unpack(keys))
  end
  local stopped_early = false
  for r, a in ipairs(keys) do
    seen = seen + 1
    last = a
    if exps[r] and tonumber(exps[r]) > now and match(r) then
      matched[#matched + 1] = a
      if #matched >= limit then
        stopped_early = r < #keys
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

local out = {(not done and last) or ''}
if want == 'a' then
  for _, a in ipairs(matched) do out[#out + 1] = a end
elseif #matched > 0 then
  -- The j column is "addr \1 expiry \1 JSON": hand back the JSON.
  local js = redis.call('HMGET', P .. 'c:j', unpack(matched))
  for r, j in ipairs(js) do
    if j then
      local sep = string.find(j, '\1', #matched[r] + 2, true)
      out[#out + 1] = string.sub(j, sep + 1)
    end
  end
end

master_sweep(P, now, 16)
return out
