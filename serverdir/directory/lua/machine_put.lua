-- Registers or renews a machine lease, timed by Redis TIME so every serverdir agrees.
-- KEYS[1]: the cluster's key base "<prefix>{cluster}:"
-- ARGV[1]: machine, ARGV[2]: machine_keep_ms (a lost machine stays listed this long),
-- ARGV[3]: ttl_ms, then field/value pairs given in the body (address, labels, capacity, logs_port,
-- version); fields not given keep their stored value.
-- Returns {registered_at_ms, expires_in_ms, new_registration (0|1)}.
local now = now_ms()
local function s(n) return string.format('%d', n) end
local key = KEYS[1] .. 'machine:' .. ARGV[1]
local ttl = tonumber(ARGV[3])
local cur = redis.call('HMGET', key, 'registered_at_ms', 'expires_at_ms')
local reg = cur[1]
-- A lease that ran out starts a new registration.
local fresh = (not reg) or tonumber(cur[2] or '0') <= now
if fresh then reg = s(now) end
local h = {'HSET', key, 'registered_at_ms', reg, 'renewed_at_ms', s(now),
           'expires_at_ms', s(now + ttl), 'ttl_ms', s(ttl)}
for i = 4, #ARGV, 2 do
  h[#h + 1] = ARGV[i]
  h[#h + 1] = ARGV[i + 1]
end
redis.call(unpack(h))
redis.call('PEXPIRE', key, s(ttl + tonumber(ARGV[2])))
redis.call('SADD', KEYS[1] .. 'machines', ARGV[1])
redis.call('ZADD', KEYS[1] .. 'mix', 0, ARGV[1]) -- the paged list's index (machine_list)
-- the lease deadlines the lost-machine sweep reads (directory.c, sweep_lost)
redis.call('ZADD', KEYS[1] .. 'leases', now + ttl, ARGV[1])
return {reg, ttl, fresh and 1 or 0}
