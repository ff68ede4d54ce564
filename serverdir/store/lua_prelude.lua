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
-- group \31 instance \31 expires_at_ms \31 ..."), P exp (address -> expiry), P n (quota
-- group -> servers listed), P probe, P inst:<instance>, and the change stream
-- P log that serverdir copies follow (docs/master.md, "Redis layout").

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
  redis.call('ZREM', P .. 'exp', addr)
  redis.call('ZREM', P .. 'probe', addr)
end

-- One change-stream entry naming the addresses whose records changed or went.
local function master_log(P, addrs, maxlen)
  if #addrs > 0 then
    redis.call('XADD', P .. 'log', 'MAXLEN', '~', maxlen, '*', 'a', table.concat(addrs, '\n'))
  end
end

-- The expiry sweep: removes at most n servers whose listing ran out by `now`, and at
-- most n whose getinfo probe (P probe: a listed Q3/DP server heartbeated and did not
-- answer the getinfo in time, as a server shutting down does) is past its deadline.
-- Returns the removed addresses (logged in P log).
local function master_sweep(P, now, n, maxlen)
  local gone = {}
  local old = redis.call('ZRANGEBYSCORE', P .. 'exp', '-inf', now, 'LIMIT', 0, n)
  for _, a in ipairs(old) do master_remove(P, a); gone[#gone + 1] = a end
  local late = redis.call('ZRANGEBYSCORE', P .. 'probe', '-inf', now, 'LIMIT', 0, n)
  for _, a in ipairs(late) do master_remove(P, a); gone[#gone + 1] = a end
  master_log(P, gone, maxlen)
  return gone
end
