-- The prelude of every serverdir script (the build puts it after the SD constants and
-- before the script; see cmake/lua_prelude.cmake): what several scripts need.

-- Now in ms by Redis TIME: the clock every serverdir copy agrees on.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
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

-- The master list under P = "<prefix>master:": one hash P c:<column> per column, keyed by
-- server address (ip: its IP, ig: its quota group, g: its game, j: "addr \1 expires_at_ms
-- \1 JSON", the rest
-- as heartbeated).
local MASTER_COLS = {'ip', 'ig', 'g', 'm', 'r', 't', 'os', 'p', 'x', 'pw', 'd', 's', 'pr',
                     'gt', 'f', 'in', 'j'}

-- Removes server `addr` from every index and column of the master list.
local function master_remove(P, addr)
  -- the quota group's index (records from before groups have their IP only)
  local ip = redis.call('HGET', P .. 'c:ig', addr) or redis.call('HGET', P .. 'c:ip', addr)
  local g = redis.call('HGET', P .. 'c:g', addr)
  local j = redis.call('HGET', P .. 'c:j', addr)
  local inst = redis.call('HGET', P .. 'c:in', addr)
  if inst and inst ~= '' and redis.call('GET', P .. 'inst:' .. inst) == addr then
    redis.call('DEL', P .. 'inst:' .. inst)
  end
  if j then redis.call('ZREM', P .. 'jlist', j) end
  if ip then redis.call('ZREM', P .. 'ip:' .. ip, addr) end
  if g then redis.call('ZREM', P .. 'g:' .. g, addr) end
  for _, col in ipairs(MASTER_COLS) do redis.call('HDEL', P .. 'c:' .. col, addr) end
  redis.call('ZREM', P .. 'list', addr)
  redis.call('ZREM', P .. 'exp', addr)
  redis.call('ZREM', P .. 'probe', addr)
end

-- The lazy expiry sweep: removes at most n servers whose listing ran out by `now`, and at
-- most n whose getinfo probe (P probe: a listed Q3/DP server heartbeated and did not
-- answer the getinfo in time, as a server shutting down does) is past its deadline.
local function master_sweep(P, now, n)
  local old = redis.call('ZRANGEBYSCORE', P .. 'exp', '-inf', now, 'LIMIT', 0, n)
  for _, a in ipairs(old) do master_remove(P, a) end
  local gone = redis.call('ZRANGEBYSCORE', P .. 'probe', '-inf', now, 'LIMIT', 0, n)
  for _, a in ipairs(gone) do master_remove(P, a) end
end
