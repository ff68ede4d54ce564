-- The allocation sweep (each second, by the copy holding the sweep lease): ends at most
-- ARGV[3] allocations whose confirm deadline passed (state expired: the instance goes
-- back to the pool when its service recycles) and forgets ended ones older than an hour
-- from the list index (their records expire by themselves).
-- KEYS[1]: the cluster's key base; ARGV: 1 assignments channel, 2 cluster name, 3 batch.
-- Returns the ids that expired.
local base = KEYS[1]
key_layout(base)
local now = now_ms()
local n = tonumber(ARGV[3])
local late = redis.call('ZRANGEBYSCORE', base .. 'alloc:pending', '-inf', now, 'LIMIT', 0, n)
local touched = {}
for _, id in ipairs(late) do
  local inst, m, svc, last, n = alloc_end(base, id, 'expired', 'not confirmed in time', now)
  if inst then
    touched[m] = true
    if last == 1 then pool_refree(base, svc, m, inst, n) end
  else
    redis.call('ZREM', base .. 'alloc:pending', id)
  end
end
doc_touch(base, ARGV[1], ARGV[2], touched)
pool_publish(ARGV[1], ARGV[2])
local old = redis.call('ZRANGEBYSCORE', base .. 'alloc:ended', '-inf', now - 3600000, 'LIMIT', 0, n)
for _, id in ipairs(old) do
  redis.call('ZREM', base .. 'allocs', id)
  redis.call('ZREM', base .. 'alloc:ended', id)
end
return late
