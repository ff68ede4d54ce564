-- Allocates an instance (docs/allocation.md): picks a ready instance of a service that
-- matches the selector, marks it allocated with the payload and answers where it runs.
-- KEYS[1]: the cluster's key base.
-- ARGV: 1 service, 2 mode (ready|join), 3 strategy (packed|distributed), 4 players,
--   5 machine labels (JSON object or ''), 6 metadata (JSON object or ''), 7 payload
--   (compact JSON), 8 idempotency key (''), 9 the request's canonical text (what a replay
--   must repeat), 10 assignments channel, 11 cluster name, 12 confirm timeout ms when the
--   spec names none, 13 idempotency key ttl ms.
-- Returns {'created', field, value, ...} | {'replayed', field, value, ...} |
--   {'idempotency_conflict', id} | {'no_capacity', looked_at} | {'no_such_service'}.
-- The search is bounded: 64 machines in strategy order and 64 instances per machine
-- (join: 64 instances in capacity order). Every Redis call counts (one allocation is
-- about 20; bench/README.md, "allocations"): the common request, without selector, takes
-- its instance with one SPOP, and the last request time is written at most once a second.
local base = KEYS[1]
local svc, mode, strategy, need = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local key = ARGV[8]
local now = now_ms()
local function s(n) return string.format('%d', n) end

if key ~= '' then
  local id = redis.call('GET', base .. 'alloc:key:' .. key)
  if id then
    local a = redis.call('HGETALL', base .. 'alloc:' .. id)
    local req
    for i = 1, #a, 2 do if a[i] == 'req' then req = a[i + 1] end end
    if req == ARGV[9] then
      table.insert(a, 1, 'replayed')
      return a
    end
    return {'idempotency_conflict', id}
  end
end
local sk = base .. 'svc:' .. svc
local sv = redis.call('HMGET', sk, 'spec', 'last_demand_ms')
if not sv[1] then return {'no_such_service'} end
if now - tonumber(sv[2] or '0') >= 1000 then
  redis.call('HSET', sk, 'last_demand_ms', s(now))
end
local labels = ARGV[5] ~= '' and cjson.decode(ARGV[5]) or nil
local meta = ARGV[6] ~= '' and cjson.decode(ARGV[6]) or nil

-- A machine the instance may run on: lease running, labels carried (cached per call).
local mcache, maddr = {}, {}
local function machine_ok(m)
  if mcache[m] ~= nil then return mcache[m] end
  local h = redis.call('HMGET', base .. 'machine:' .. m, 'expires_at_ms', 'labels', 'address')
  maddr[m] = h[3] or ''
  local ok = tonumber(h[1] or '0') > now
  if ok and labels then
    local have = h[2] and cjson.decode(h[2]) or {}
    for k, v in pairs(labels) do
      if have[k] ~= v then ok = false end
    end
  end
  mcache[m] = ok
  return ok
end

-- Whether instance i carries the metadata and the free player slots asked for.
local function inst_ok(i)
  local h = redis.call('HMGET', base .. 'proc:' .. i, 'state', 'status', 'players', 'max_players')
  if h[1] ~= 'ready' or not meta_match(h[2], meta) then return false end
  if need > 0 then
    if not h[4] then return false end
    return tonumber(h[4]) - tonumber(h[3] or '0') >= need
  end
  return true
end

local pick, looked, popped = nil, 0, nil
if mode == 'join' then
  local c
  if strategy == 'packed' then
    c = redis.call('ZRANGEBYSCORE', base .. 'cap:' .. svc, need, '+inf', 'LIMIT', 0, 64)
  else
    c = redis.call('ZREVRANGEBYSCORE', base .. 'cap:' .. svc, '+inf', need, 'LIMIT', 0, 64)
  end
  for _, i in ipairs(c) do
    looked = looked + 1
    local m = redis.call('HGET', base .. 'proc:' .. i, 'machine')
    if m and machine_ok(m) and inst_ok(i) then pick = i; break end
  end
else
  local ms
  if strategy == 'packed' then
    ms = redis.call('ZREVRANGE', base .. 'free:' .. svc, 0, 63)
  else
    ms = redis.call('ZRANGE', base .. 'free:' .. svc, 0, 63)
  end
  for _, m in ipairs(ms) do
    if machine_ok(m) then
      local fk = base .. 'free:' .. svc .. ':' .. m
      if not meta and need == 0 then
        looked = looked + 1
        pick = redis.call('SPOP', fk) -- taken out of the free set here (popped below)
        if pick then popped = m end
      else
        for _, i in ipairs(redis.call('SRANDMEMBER', fk, 64)) do
          looked = looked + 1
          if inst_ok(i) then pick = i; break end
        end
      end
      if pick then break end
    end
  end
end
-- pool:demand moves on every take and every miss: the primary long-polls it
-- (pool_demand.lua) to size the pools at once instead of at its next pass
if not pick then
  redis.call('INCR', base .. 'pool:demand')
  return {'no_capacity', looked}
end
redis.call('INCR', base .. 'pool:demand')

local pk = base .. 'proc:' .. pick
local p = redis.call('HMGET', pk, 'machine', 'slot', 'ports')
local m = p[1]
local id = string.format('a%012d', redis.call('INCR', base .. 'alloc:seq'))
-- a ready-mode pick comes from the free set, so it held nothing; a join may share
local ik = base .. 'alloc:i:' .. pick
local held = mode == 'join' and redis.call('SCARD', ik) or 0
redis.call('SADD', ik, id)
if held == 0 then
  local listed = pool_free_rem(base, svc, m, pick, popped == m)
  pool_alloc_count(base, svc, m, p[2], 1, not listed)
end
if mode == 'join' and need > 0 then
  redis.call('ZINCRBY', base .. 'cap:' .. svc, -need, pick)
  redis.call('HINCRBY', pk, 'players', need)
end
local confirm = tonumber(string.match(sv[1], '"confirm_timeout_ms":(%d+)') or ARGV[12])
if maddr[m] == nil then machine_ok(m) end
local rec = {'allocation', id, 'state', 'pending', 'service', svc, 'mode', mode,
             'instance', pick, 'machine', m, 'address', maddr[m],
             'ports', p[3] or '', 'slot', p[2] or '', 'players', s(need),
             'payload', ARGV[7], 'created_at_ms', s(now), 'confirm_by_ms', s(now + confirm),
             'strategy', strategy}
if key ~= '' then
  rec[#rec + 1] = 'key'
  rec[#rec + 1] = key
  rec[#rec + 1] = 'req'
  rec[#rec + 1] = ARGV[9]
  redis.call('SET', base .. 'alloc:key:' .. key, id, 'PX', ARGV[13])
end
redis.call('HSET', base .. 'alloc:' .. id, unpack(rec))
redis.call('ZADD', base .. 'allocs', 0, id)
redis.call('ZADD', base .. 'alloc:pending', now + confirm, id)
redis.call('HSET', base .. 'alloc:m:' .. m, id,
           -- ids and instances are names (no character JSON escapes), mode a word
           '{"allocation":"' .. id .. '","instance":"' .. pick .. '","mode":"' .. mode ..
           '","players":' .. s(need) .. '}\31' .. ARGV[7])
doc_touch(base, ARGV[10], ARGV[11], m)
table.insert(rec, 1, 'created')
return rec
