-- The lost-machine sweep of a cluster without a primary (docs/operations.md, "Machines
-- without a primary"): takes the first machine whose lease ran out from P leases and
-- returns its live processes, which the caller marks stopped (reason machine_lost)
-- through events_apply. A cluster whose primary holds its lease is left alone: the
-- primary declares its lost machines itself (and places their slots elsewhere).
-- The processes of a service whose spec.disconnect keeps them on a lost machine
-- (replace false, lost_after_ms > 0, reconcile keep_original: docs/cluster.md, "A machine
-- cut off") are not returned: a cluster between two primaries leaves them to the next.
-- A copy of serverdir that has not run for a whole lease of the machine (it just started,
-- or it was paused or starved: ARGV[1], how long it has run without a gap) cannot tell a
-- lost machine from its own absence: every lease ran out while it was away, and the
-- machines get that long to renew first (the primary waits the same way: bigbrother's
-- cluster.c, declare_lost).
-- KEYS[1]: the cluster's key base; ARGV[1]: ms this copy has run without a gap. Returns
-- {} when there is nothing to do (or not yet), else
-- {machine, lease_expired_at_ms, instance, service, ...}; the machine leaves P leases (a
-- new lease puts it back).
local base = KEYS[1]
local now = now_ms()
local p = redis.call('HMGET', base .. 'primary', 'holder', 'expires_at_ms')
if p[1] and p[1] ~= '' and tonumber(p[2] or '0') > now then return {} end
local due = redis.call('ZRANGEBYSCORE', base .. 'leases', '-inf', now, 'WITHSCORES', 'LIMIT', 0, 1)
if #due == 0 then return {} end
local m, at = due[1], due[2]
local ttl = tonumber(redis.call('HGET', base .. 'machine:' .. m, 'ttl_ms') or '0') or 0
if tonumber(ARGV[1]) < ttl then return {} end
redis.call('ZREM', base .. 'leases', m)

local kept = {} -- service -> whether its spec keeps its processes on a lost machine
local function keeps(svc)
  if kept[svc] == nil then
    local spec = redis.call('HGET', base .. 'svc:' .. svc, 'spec')
    local ok, s = pcall(cjson.decode, spec or '')
    local d = ok and type(s) == 'table' and s.disconnect
    kept[svc] = type(d) == 'table' and (d.replace == false or
      (tonumber(d.lost_after_ms) or 0) > 0 or d.reconcile == 'keep_original')
  end
  return kept[svc]
end

local out = {m, at}
for _, inst in ipairs(redis.call('ZRANGE', base .. 'ix:m:' .. m, 0, -1)) do
  local svc = redis.call('HGET', base .. 'proc:' .. inst, 'service') or ''
  if svc == '' or not keeps(svc) then
    out[#out + 1] = inst
    out[#out + 1] = svc
  end
end
return out
