-- The cluster's pool demand counter: alloc_create bumps it each time it takes an
-- instance from a pool or finds none, so the primary, long-polling it (GET
-- .../pool-demand?version=V&wait=MS), sizes its pools at once instead of at its next
-- placement pass.
-- KEYS[1]: the cluster's key base. Returns the counter as text ('0' before any).
return redis.call('GET', KEYS[1] .. 'pool:demand') or '0'
