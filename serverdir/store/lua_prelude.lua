-- The prelude of every serverdir script (the build puts it after the SD constants and
-- before the script; see cmake/lua_prelude.cmake): what several scripts need.

-- Now in ms by Redis TIME: the clock every serverdir copy agrees on.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The name of a lock or blob record key after its namespace ns ("<prefix>lock:"),
-- without the "{=...}" a Redis Cluster wraps an untagged name in (locks.c, ns_key).
local function lock_name(key, ns)
  local n = string.sub(key, #ns + 1)
  if string.sub(n, 1, 2) == '{=' and string.sub(n, -1) == '}' then
    return string.sub(n, 3, -2)
  end
  return n
end

-- Whether an instance credential still speaks for its instance (http/cred.h): '' when
-- pk is '' (no credential to check) or the directory's process hash pk records the
-- instance on machine m in generation g and not stopped; else why it is revoked (the
-- caller returns {'credential_revoked', why}, having changed nothing).
local function cred_revoked(pk, m, g)
  if pk == '' then return '' end
  local p = redis.call('HMGET', pk, 'state', 'machine', 'generation')
  if not p[1] then return 'the directory has no such instance' end
  if p[1] == 'stopped' then return 'the instance stopped' end
  if p[2] ~= m then return 'the instance is on another machine' end
  if (p[3] or '0') ~= g then return 'the instance runs another generation' end
  return ''
end

-- Whether the directory records a lock holder stopped (docs/locks.md, "Locks die with
-- their holder"): arg is '' (no directory to ask: the caller is bound to no cluster), the
-- holder's process hash (read here, standalone Redis / Sentinel) or "=<reason>
-- <stopped_at_ms>" (serverdir found it stopped: a Redis Cluster, where the hash is in
-- another slot). nil when it may hold locks, else {'holder_stopped', reason,
-- stopped_at_ms} for the caller to return, having changed no lock or blob. A refusal read here
-- is counted in the process hash (lock_refusals, lock_refused_at_ms: sdctl describe).
local function holder_stop(arg)
  if arg == '' then return nil end
  if string.sub(arg, 1, 1) == '=' then
    local reason, at = string.match(arg, '^=(%S*) (%d+)$')
    return {'holder_stopped', reason or '', at or '0'}
  end
  local p = redis.call('HMGET', arg, 'state', 'reason', 'stopped_at_ms')
  if p[1] ~= 'stopped' then return nil end
  redis.call('HINCRBY', arg, 'lock_refusals', 1)
  redis.call('HSET', arg, 'lock_refused_at_ms', string.format('%d', now_ms()))
  return {'holder_stopped', p[2] or '', p[3] or '0'}
end

-- Wakes one parked acquire of a lock: one token on its release list q (<record>#q),
-- trimmed to one and kept 60 s (locks.c, "waiting").
local function wake_waiter(q)
  redis.call('RPUSH', q, '1')
  redis.call('LTRIM', q, -1, -1)
  redis.call('PEXPIRE', q, 60000)
end

-- Adds every member of the set `set` to the sorted set `ix` (score 0) once, then sets
-- `flag` to 1: the name index of a list, built for data written before it existed.
local function index_once(set, ix, flag)
  if redis.call('GET', flag) == '1' then return end
  local all = redis.call('SMEMBERS', set)
  for i = 1, #all, 500 do
    local z = {'ZADD', ix}
    for k = i, math.min(i + 499, #all) do
      z[#z + 1] = '0'
      z[#z + 1] = all[k]
    end
    redis.call(unpack(z))
  end
  redis.call('SET', flag, '1')
end

-- Key layout 2: a key that carries a machine's or service's name after a word of its own
-- holds the name after '/', which names cannot hold ([A-Za-z0-9_.:@-]), so no two names
-- share a key and no name meets a fixed key: assign/<m> (was assign:<m>, where a machine
-- "version" met the counter assign:version) and free/<s>/<m> (was free:<s>:<m>, where
-- service "match" on machine "p1" met service "match:p1"'s free:match:p1). Every script
-- that touches these keys calls this first: once per cluster (keyv = 2) it moves the keys
-- of layout 1, a bounded walk of the cluster's machines and pools.
local function key_layout(base)
  if redis.call('GET', base .. 'keyv') == '2' then return end
  local function move(old, new, kind)
    if redis.call('TYPE', old).ok == kind then redis.call('RENAME', old, new) end
  end
  local ms = redis.call('SUNION', base .. 'assign:machines', base .. 'machines')
  for _, m in ipairs(ms) do move(base .. 'assign:' .. m, base .. 'assign/' .. m, 'hash') end
  for _, sv in ipairs(redis.call('SMEMBERS', base .. 'services')) do
    if redis.call('TYPE', base .. 'free:' .. sv).ok == 'zset' then
      for _, m in ipairs(redis.call('ZRANGE', base .. 'free:' .. sv, 0, -1)) do
        move(base .. 'free:' .. sv .. ':' .. m, base .. 'free/' .. sv .. '/' .. m, 'set')
      end
    end
  end
  redis.call('SET', base .. 'keyv', '2')
end

-- Machine m's lease record as {m, field, value, ...} (plus draining 1 when m is in the
-- draining set), or nil when it expired (lost longer than machine_keep); then, when
-- prune, its name leaves the machine set and the name index <base>mix.
local function machine_entry(base, m, prune)
  local h = redis.call('HGETALL', base .. 'machine:' .. m)
  if #h == 0 then
    if prune then
      redis.call('SREM', base .. 'machines', m)
      redis.call('ZREM', base .. 'mix', m)
    end
    return nil
  end
  table.insert(h, 1, m)
  if redis.call('SISMEMBER', base .. 'draining', m) == 1 then
    h[#h + 1] = 'draining'
    h[#h + 1] = '1'
  end
  return h
end

-- The fence of a primary's write to the cluster at key base `base`: nil when `epoch` is
-- the epoch of a primary whose lease is still running at `now`, else the reply
-- {'stale_epoch', current_epoch, holder ('' when none or expired)} to return as is.
local function stale_epoch(base, epoch, now)
  local p = redis.call('HMGET', base .. 'primary', 'holder', 'epoch', 'expires_at_ms')
  local holder = p[1] or ''
  if tonumber(p[3] or '0') <= now then holder = '' end
  if holder == '' or p[2] ~= epoch then
    return {'stale_epoch', p[2] or '0', holder}
  end
  return nil
end

-- The master list under P = "<prefix>master:": P s (address -> record "challenge \31
-- group \31 instance \31 expires_at_ms \31 ..."), P n (quota group -> servers listed),
-- P probe, P inst:<instance>, P sweep (the expiry sweep's place in P s), and the change
-- stream P log that serverdir copies follow (docs/master.md, "Redis layout").

-- Removes server `addr` from every index of the master list (not from the stream: the
-- caller logs what it removed with master_log).
local function master_remove(P, addr)
  local rec = redis.call('HGET', P .. 's', addr)
  if rec then
    local g, inst = string.match(rec, '^[^\31]*\31([^\31]*)\31([^\31]*)\31')
    if g and redis.call('HINCRBY', P .. 'n', g, -1) <= 0 then redis.call('HDEL', P .. 'n', g) end
    if inst and inst ~= '' and redis.call('GET', P .. 'inst:' .. inst) == addr then
      redis.call('DEL', P .. 'inst:' .. inst)
    end
    redis.call('HDEL', P .. 's', addr)
  end
  redis.call('ZREM', P .. 'probe', addr)
end

-- One change-stream entry naming the addresses whose records changed or went (a) and the
-- id of the entry before it (p, '0-0' for the first): a copy that reads an entry whose p
-- is not the last one it read knows entries were lost (a replica behind took over) and
-- reloads (master_index.c, follow). copy (optional): the serverdir copy that wrote the
-- change and applied it to its own index already (field c), which that copy skips.
local function master_log(P, addrs, maxlen, copy)
  if #addrs > 0 then
    local last = redis.call('XREVRANGE', P .. 'log', '+', '-', 'COUNT', 1)
    local prev = last[1] and last[1][1] or '0-0'
    if copy and copy ~= '' then
      redis.call('XADD', P .. 'log', 'MAXLEN', '~', maxlen, '*', 'a', table.concat(addrs, '\n'),
                 'p', prev, 'c', copy)
    else
      redis.call('XADD', P .. 'log', 'MAXLEN', '~', maxlen, '*', 'a', table.concat(addrs, '\n'),
                 'p', prev)
    end
  end
end

-- The expiry sweep: walks a share of P s from where the last call stopped (the HSCAN
-- cursor in P sweep, field c, shared by every copy) and removes the servers whose listing
-- ran out by `now`; and removes at most n whose getinfo probe (P probe: a listed Q3/DP
-- server heartbeated and did not answer the getinfo in time, as a server shutting down
-- does) is past its deadline. The walk reads about max(n, listed / 50) records (at most
-- 5n) once per period ms whichever copy calls (P sweep, field t: when the next share is
-- due), so a whole pass takes at most 50 periods up to 250,000 servers at n = 1000 (10 s at
-- the 200 ms period), and an expired server costs memory and its group's quota that long
-- at most: every copy's answers leave it out at its expiry (the record carries it).
-- No record is written to find what expires: no index per server (docs/master.md,
-- "Redis layout"). Returns the removed addresses (logged in P log).
local function master_sweep(P, now, n, maxlen, period)
  local gone = {}
  local sw = redis.call('HMGET', P .. 'sweep', 'c', 't')
  local listed = 0
  if tonumber(sw[2] or '0') <= now then listed = redis.call('HLEN', P .. 's') end
  if listed > 0 then -- (an empty list is not written to: an idle Redis stays unwritten)
    local count = math.min(math.max(n, math.floor(listed / 50)), 5 * n)
    local r = redis.call('HSCAN', P .. 's', sw[1] or '0', 'COUNT', count)
    redis.call('HSET', P .. 'sweep', 'c', r[1], 't', now + period)
    local kv = r[2]
    for i = 1, #kv, 2 do
      local e = string.match(kv[i + 1], '^[^\31]*\31[^\31]*\31[^\31]*\31([^\31]*)\31')
      if tonumber(e or '0') <= now then master_remove(P, kv[i]); gone[#gone + 1] = kv[i] end
    end
  end
  local late = redis.call('ZRANGEBYSCORE', P .. 'probe', '-inf', now, 'LIMIT', 0, n)
  for _, a in ipairs(late) do master_remove(P, a); gone[#gone + 1] = a end
  master_log(P, gone, maxlen)
  return gone
end

-- ---------- warm pools and allocations (docs/allocation.md, "Redis layout") ----------

-- Bumps the assignment document version of every machine of the set ms ({m = true, ...})
-- to one new version and publishes each on channel `chan` as "<cluster> <m>", so the
-- machine's Big Brother re-reads its allocations.
local function doc_touch(base, chan, cluster, ms)
  if not next(ms) then return end
  local v = string.format('%d', redis.call('INCR', base .. 'assign:version'))
  for m in pairs(ms) do
    redis.call('HSET', base .. 'assign/' .. m, 'version', v)
    redis.call('PUBLISH', chan, cluster .. ' ' .. m)
  end
end

-- The pool counters pstat:<s> (allocated, free) move by d, kept at 0 or more. A script
-- that moves them per request or event (alloc_create, events_apply) sets pstat_delta to a
-- table first and calls pstat_flush before it returns: the moves add up there and are
-- written once per service and counter; otherwise they are written at once.
local pstat_delta = nil
local function pstat_incr(base, s, f, d)
  if pstat_delta then
    local t = pstat_delta[s]
    if not t then t = {allocated = 0, free = 0}; pstat_delta[s] = t end
    t[f] = t[f] + d
  elseif redis.call('HINCRBY', base .. 'pstat:' .. s, f, d) < 0 then
    redis.call('HSET', base .. 'pstat:' .. s, f, '0')
  end
end
local function pstat_flush(base)
  local pend = pstat_delta
  pstat_delta = nil
  for s, t in pairs(pend or {}) do
    for f, d in pairs(t) do
      if d ~= 0 then pstat_incr(base, s, f, d) end
    end
  end
end

-- The services whose pool changed so that a waiting allocation may now succeed (an
-- instance became free, or a ready one's capacity or status moved): pool_touch marks
-- one, pool_publish (once, before a script returns) publishes them on the pool channel,
-- the assignments channel `chan` .. ':pool' (api_alloc.c, sd_pool_channel), as
-- "<cluster> <service> ...": serverdir wakes the allocations parked on those pools.
local pool_touched = {}
local function pool_touch(s) pool_touched[s] = true end
local function pool_publish(chan, cluster)
  local msg = {cluster}
  for s in pairs(pool_touched) do msg[#msg + 1] = s end
  pool_touched = {}
  if #msg > 1 then redis.call('PUBLISH', chan .. ':pool', table.concat(msg, ' ')) end
end

-- Instance `inst` of service s on machine m is free (ready, no open allocation); n: m's
-- count of allocated instances of s when the caller has it (alloc_end), else read. With
-- n, m's place in the machine order is set here even when inst was free already (the
-- caller's alloc_end may have left it to this call: `refree`).
local function pool_free_add(base, s, m, inst, n)
  if redis.call('SADD', base .. 'free/' .. s .. '/' .. m, inst) == 1 then
    pool_touch(s)
    n = n or tonumber(redis.call('HGET', base .. 'amach:' .. s, m) or '0')
    redis.call('ZADD', base .. 'free:' .. s, n, m)
    pstat_incr(base, s, 'free', 1)
  elseif n then
    redis.call('ZADD', base .. 'free:' .. s, 'XX', n, m)
  end
end

-- Instance `inst` is no longer free (allocated, stopped, moved); `popped`: the caller
-- already took it out of the set (SPOP). Returns false when m has no free instance of s
-- left (it left the machine order), else true.
local function pool_free_rem(base, s, m, inst, popped)
  local k = base .. 'free/' .. s .. '/' .. m
  if popped or redis.call('SREM', k, inst) == 1 then
    pstat_incr(base, s, 'free', -1)
    if redis.call('SCARD', k) == 0 then
      redis.call('ZREM', base .. 'free:' .. s, m)
      return false
    end
  end
  return true
end

-- Counts instance (s, m, slot) as allocated (d = 1) or no longer (d = -1): the per-machine
-- count the strategies order machines by, the service's count and allocated slots.
-- `unlisted`: m is known to have no free instance of s (nothing to reorder). Returns the
-- machine's new count.
local function pool_alloc_count(base, s, m, slot, d, unlisted)
  local n = redis.call('HINCRBY', base .. 'amach:' .. s, m, d)
  if n <= 0 then redis.call('HDEL', base .. 'amach:' .. s, m); n = 0 end
  if not unlisted then redis.call('ZADD', base .. 'free:' .. s, 'XX', n, m) end
  pstat_incr(base, s, 'allocated', d)
  if slot and slot ~= '' then
    if d > 0 then
      redis.call('ZADD', base .. 'aslot:' .. s, tonumber(slot), slot)
    else
      redis.call('ZREM', base .. 'aslot:' .. s, slot)
    end
  end
  return n
end

-- The service's on_release ("recycle" unless its spec says "restart").
local function svc_on_release(base, s)
  local spec = redis.call('HGET', base .. 'svc:' .. s, 'spec')
  if spec and string.find(spec, '"on_release":"restart"', 1, true) then return 'restart' end
  return 'recycle'
end

-- The instance `inst` of service s whose last allocation ended goes back to the pool of m
-- when it still runs there, ready, and its service recycles (on_release "restart": its Big
-- Brother restarts it, and the new run is free once ready).
local function pool_refree(base, s, m, inst, n)
  local p = redis.call('HMGET', base .. 'proc:' .. inst, 'state', 'machine')
  if p[1] == 'ready' and p[2] == m and svc_on_release(base, s) == 'recycle' then
    pool_free_add(base, s, m, inst, n)
  end
end

-- Ends open allocation `id` with state st (released | expired | allocation_lost) and
-- reason; ended records are kept an hour. Returns the allocation's instance, machine,
-- service, whether the instance has no open allocation left (1) and then the machine's
-- count of allocated instances (pool_free_add's n), or nil when the allocation is not
-- open (or, with `of`, not an allocation of instance `of`). `refree`: the caller puts the
-- instance back in the pool next (pool_free_add with that n), which orders the machine.
local function alloc_end(base, id, st, reason, now, of, refree)
  local k = base .. 'alloc:' .. id
  local a = redis.call('HMGET', k, 'state', 'instance', 'machine', 'service', 'slot')
  if a[1] ~= 'pending' and a[1] ~= 'active' then return nil end
  if of and a[2] ~= of then return nil end
  local inst, m, s = a[2], a[3], a[4]
  redis.call('HSET', k, 'state', st, 'reason', reason, 'ended_at_ms', string.format('%d', now))
  redis.call('PEXPIRE', k, 3600000)
  -- only a pending one waits for its confirmation (a confirmed one left the set then)
  if a[1] == 'pending' then redis.call('ZREM', base .. 'alloc:pending', id) end
  redis.call('ZADD', base .. 'alloc:ended', now, id)
  redis.call('HDEL', base .. 'alloc:m:' .. m, id)
  local ik = base .. 'alloc:i:' .. inst
  redis.call('SREM', ik, id)
  local left = redis.call('SCARD', ik)
  local n
  if left == 0 then n = pool_alloc_count(base, s, m, a[5], -1, refree) end
  return inst, m, s, left == 0 and 1 or 0, n
end

-- Every open allocation of instance inst ends (st, reason); returns the machine whose
-- document changed (nil when none was open) and how many ended.
local function alloc_end_instance(base, inst, st, reason, now)
  local ids = redis.call('SMEMBERS', base .. 'alloc:i:' .. inst)
  local m, n = nil, 0
  for _, id in ipairs(ids) do
    local _, am = alloc_end(base, id, st, reason, now)
    if am then m, n = am, n + 1 end
  end
  return m, n
end

-- Whether the status line `status` ("k=v k=v ...") carries every pair of want (a table).
local function meta_match(status, want)
  if not want then return true end
  local have = {}
  for k, v in string.gmatch(status or '', '([^%s=]+)=([^%s]*)') do have[k] = v end
  for k, v in pairs(want) do
    if have[k] ~= v then return false end
  end
  return true
end

-- A service's pool figures for GET /state and the services list: {allocated instances,
-- ready free instances, highest allocated slot (-1: none), last allocation request ms};
-- last_demand: the service record's last_demand_ms, which the caller reads anyway.
local function pool_stats(base, s, last_demand)
  local h = redis.call('HMGET', base .. 'pstat:' .. s, 'allocated', 'free')
  local top = redis.call('ZREVRANGE', base .. 'aslot:' .. s, 0, 0, 'WITHSCORES')
  return {h[1] or '0', h[2] or '0', top[2] or '-1', last_demand or '0'}
end

-- The batch form of a script, <name>_many.lua (cmake/lua_prelude.cmake writes it: the
-- script as the function `one(KEYS, ARGV)`, then `return batch_run(one)`), for the group
-- commit of the lock path (locks/batch.c). ARGV[1] is the number of items n, ARGV[2i] and
-- ARGV[2i+1] item i's number of KEYS and of ARGV; the items' KEYS follow one another in
-- KEYS, their ARGV in ARGV after these 2n+1. Each item runs as the script would alone and
-- its reply is element i of the answer: a refusal is the item's own reply, and an error
-- (a runtime error, a refused command) becomes the error reply {err = ...} at element i
-- that the item alone would have had, without stopping the others. The caller bounds n and the work per call.
local function batch_run(one)
  local n = tonumber(ARGV[1])
  local out, k, a = {}, 0, 1 + 2 * n
  for i = 1, n do
    local nk, na = tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
    local keys, argv = {}, {}
    for j = 1, nk do keys[j] = KEYS[k + j] end
    for j = 1, na do argv[j] = ARGV[a + j] end
    k, a = k + nk, a + na
    local ok, r = pcall(one, keys, argv)
    if not ok then -- as the item alone would have failed: a command's error as Redis
      -- raised it ("WRONGTYPE ..."), a runtime error as Redis reports one ("ERR ...")
      local e = type(r) == 'table' and tostring(r.err) or tostring(r)
      if not string.match(e, '^[A-Z]+ ') then e = 'ERR ' .. e end
      r = {err = e}
    end
    out[i] = r
  end
  return out
end
