-- The lost-machine sweep of a cluster without a primary (docs/operations.md, "Machines
-- without a primary"): takes the first machine whose lease ran out from P leases and
-- returns its live processes, which the caller marks stopped (reason machine_lost)
-- through events_apply. A cluster whose primary holds its lease is left alone: the
-- primary declares its lost machines itself (and places their slots elsewhere).
-- KEYS[1]: the cluster's key base. Returns {} when there is nothing to do, else
-- {machine, lease_expired_at_ms, instance, service, ...}; the machine leaves P leases (a
-- new lease puts it back).
local base = KEYS[1]
local now = now_ms()
local p = redis.call('HMGET', base .. 'primary', 'holder', 'expires_at_ms')
if p[1] and p[1] ~= '' and tonumber(p[2] or '0') > now then return {} end
local due = redis.call('ZRANGEBYSCORE', base .. 'leases', '-inf', now, 'WITHSCORES', 'LIMIT', 0, 1)
if #due == 0 then return {} end
local m, at = due[1], due[2]
redis.call('ZREM', base .. 'leases', m)
local out = {m, at}
for _, inst in ipairs(redis.call('ZRANGE', base .. 'ix:m:' .. m, 0, -1)) do
  out[#out + 1] = inst
  out[#out + 1] = redis.call('HGET', base .. 'proc:' .. inst, 'service') or ''
end
return out
