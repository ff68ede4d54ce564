-- Allocates instances (docs/allocation.md): for each request, picks a ready instance of a
-- service that matches the selector, marks it allocated with the payload and answers where
-- it runs. serverdir sends the requests that arrived while the cluster's previous call ran
-- in one call (group commit, api_alloc.c), in their order; a lone request is a group of 1.
-- KEYS[1]: the cluster's key base.
-- ARGV: 1 assignments channel, 2 cluster name, 3 confirm timeout ms when the spec names
--   none, 4 idempotency key ttl ms; then 9 per request: service, mode (ready|join),
--   strategy (packed|distributed), players, machine labels (JSON object or ''), metadata
--   (JSON object or ''), payload (compact JSON), idempotency key (''), the request's
--   canonical text (what a replay must repeat), the caller's principal (recorded as the
--   allocation's owner), the principal whose allocations it may replay ('' any: ops).
--   A key of an allocation another principal owns answers {'not_yours'}, as if unused.
-- Returns one reply per request, in order: {'created', field, value, ...} |
--   {'replayed', field, value, ...} | {'idempotency_conflict', id} |
--   {'no_capacity', looked_at} | {'no_such_service'} | {'not_yours'} | {'failed', error} (that request's
--   Redis error; the others go on).
-- The search is bounded: 64 machines in strategy order (read 8 first) and 64 instances per
-- machine (join: 64 instances in capacity order). Every Redis call counts (bench/README.md,
-- "allocations"): the common request, without selector, takes its instance with one SPOP;
-- the clock, the services' records, the machines' leases, the demand counter and the
-- assignment documents are read or written once per call, not per request, and the last
-- request time at most once a second.
local base = KEYS[1]
key_layout(base)
local chan, cluster, confirm_default, key_ttl = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local now = now_ms()
local function s(n) return string.format('%d', n) end

-- The services' specs (false: no such service), the machines' leases, the machines whose
-- assignment document changed, and how many requests moved the demand counter.
local specs, leases, touched, demand = {}, {}, {}, 0
local nreq = math.floor((#ARGV - 4) / 11)
pstat_delta = {} -- the pool counters, written once at the end (pstat_flush)

-- Allocation ids: one INCRBY for this request and the ones after it in the call (an id a
-- later request does not use is skipped: ids grow, with gaps).
local id_next, id_last = 1, 0
local function new_id(i)
  if id_next > id_last then
    id_last = redis.call('INCRBY', base .. 'alloc:seq', nreq - i + 1)
    id_next = id_last - (nreq - i)
  end
  id_next = id_next + 1
  return string.format('a%012d', id_next - 1)
end

local function spec_of(svc)
  local sv = specs[svc]
  if sv == nil then
    local sk = base .. 'svc:' .. svc
    local h = redis.call('HMGET', sk, 'spec', 'last_demand_ms')
    sv = h[1] or false
    if sv and now - tonumber(h[2] or '0') >= 1000 then
      redis.call('HSET', sk, 'last_demand_ms', s(now))
    end
    specs[svc] = sv
  end
  return sv
end

local function lease_of(m)
  local l = leases[m]
  if not l then
    local h = redis.call('HMGET', base .. 'machine:' .. m, 'expires_at_ms', 'labels', 'address')
    l = {live = tonumber(h[1] or '0') > now, labels = h[2], address = h[3] or ''}
    leases[m] = l
  end
  return l
end

-- A machine the instance may run on: lease running, the labels asked for carried.
local function machine_ok(m, labels)
  local l = lease_of(m)
  if not l.live then return false end
  if labels then
    if l.have == nil then l.have = l.labels and cjson.decode(l.labels) or {} end
    for k, v in pairs(labels) do
      if l.have[k] ~= v then return false end
    end
  end
  return true
end

local function alloc_one(i)
  local o = 4 + (i - 1) * 11
  local svc, mode, strategy, need = ARGV[o + 1], ARGV[o + 2], ARGV[o + 3], tonumber(ARGV[o + 4])
  local payload, key, canon = ARGV[o + 7], ARGV[o + 8], ARGV[o + 9]
  local owner, viewer = ARGV[o + 10], ARGV[o + 11]
  if key ~= '' then
    local id = redis.call('GET', base .. 'alloc:key:' .. key)
    if id then
      local a = redis.call('HGETALL', base .. 'alloc:' .. id)
      local req, by
      for i = 1, #a, 2 do
        if a[i] == 'req' then req = a[i + 1] elseif a[i] == 'owner' then by = a[i + 1] end
      end
      if viewer ~= '' and by and by ~= viewer then return {'not_yours'} end
      if req == canon then
        table.insert(a, 1, 'replayed')
        return a
      end
      return {'idempotency_conflict', id}
    end
  end
  local spec = spec_of(svc)
  if not spec then return {'no_such_service'} end
  local labels = ARGV[o + 5] ~= '' and cjson.decode(ARGV[o + 5]) or nil
  local meta = ARGV[o + 6] ~= '' and cjson.decode(ARGV[o + 6]) or nil

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
  demand = demand + 1
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
      if m and machine_ok(m, labels) and inst_ok(i) then pick = i; break end
    end
  else
    local fz = base .. 'free:' .. svc
    -- the first 8 machines in strategy order, then up to 56 more: most requests take
    -- from the first one
    for _, r in ipairs({{0, 7}, {8, 63}}) do
      local ms
      if strategy == 'packed' then
        ms = redis.call('ZREVRANGE', fz, r[1], r[2])
      else
        ms = redis.call('ZRANGE', fz, r[1], r[2])
      end
      for _, m in ipairs(ms) do
        if machine_ok(m, labels) then
          local fk = base .. 'free/' .. svc .. '/' .. m
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
      if pick or #ms < r[2] - r[1] + 1 then break end
    end
  end
  -- pool:demand moves on every take and every miss (once per call, by `demand`): the
  -- primary long-polls it (pool_demand.lua) to size the pools at once
  if not pick then return {'no_capacity', looked} end

  local pk = base .. 'proc:' .. pick
  local p = redis.call('HMGET', pk, 'machine', 'slot', 'ports')
  local m = p[1]
  local id = new_id(i)
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
  local confirm = tonumber(string.match(spec, '"confirm_timeout_ms":(%d+)') or confirm_default)
  local rec = {'allocation', id, 'state', 'pending', 'service', svc, 'mode', mode,
               'instance', pick, 'machine', m, 'address', lease_of(m).address,
               'ports', p[3] or '', 'slot', p[2] or '', 'players', s(need),
               'payload', payload, 'created_at_ms', s(now), 'confirm_by_ms', s(now + confirm),
               'strategy', strategy, 'owner', owner}
  if key ~= '' then
    rec[#rec + 1] = 'key'
    rec[#rec + 1] = key
    rec[#rec + 1] = 'req'
    rec[#rec + 1] = canon
    redis.call('SET', base .. 'alloc:key:' .. key, id, 'PX', key_ttl)
  end
  redis.call('HSET', base .. 'alloc:' .. id, unpack(rec))
  redis.call('ZADD', base .. 'allocs', 0, id)
  redis.call('ZADD', base .. 'alloc:pending', now + confirm, id)
  redis.call('HSET', base .. 'alloc:m:' .. m, id,
             -- ids and instances are names (no character JSON escapes), mode a word
             '{"allocation":"' .. id .. '","instance":"' .. pick .. '","mode":"' .. mode ..
             '","players":' .. s(need) .. '}\31' .. payload)
  touched[m] = true
  table.insert(rec, 1, 'created')
  return rec
end

local out = {}
for i = 1, nreq do
  local ok, r = pcall(alloc_one, i)
  if not ok then
    r = {'failed', type(r) == 'table' and tostring(r.err) or tostring(r)}
  end
  out[i] = r
end
if demand > 0 then redis.call('INCRBY', base .. 'pool:demand', demand) end
pstat_flush(base)
doc_touch(base, chan, cluster, touched) -- one version for every document this call changed
return out
