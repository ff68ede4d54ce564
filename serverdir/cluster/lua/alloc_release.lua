-- Ends an allocation from outside (DELETE .../allocations/{id}): state released, reason
-- "api". The instance goes back to the pool when its service recycles (on_release
-- restart: its Big Brother restarts it, and the new run is free once ready).
-- KEYS[1]: the cluster's key base; ARGV: 1 id, 2 assignments channel, 3 cluster name,
-- 4 the principal whose allocations the caller may end ('' any; a record without an
-- owner is everyone's): another's answers no_such_allocation and changes nothing.
-- Returns {'ended', field, value, ...}, {'unchanged', field, value, ...} (already ended)
-- or {'no_such_allocation'}.
local base = KEYS[1]
local owner = redis.call('HGET', base .. 'alloc:' .. ARGV[1], 'owner')
if ARGV[4] ~= '' and owner and owner ~= ARGV[4] then return {'no_such_allocation'} end
key_layout(base)
local now = now_ms()
local inst, m, svc, last, n = alloc_end(base, ARGV[1], 'released', 'api', now)
local out = redis.call('HGETALL', base .. 'alloc:' .. ARGV[1])
if #out == 0 then return {'no_such_allocation'} end
if not inst then
  table.insert(out, 1, 'unchanged')
  return out
end
if last == 1 then pool_refree(base, svc, m, inst, n) end
doc_touch(base, ARGV[2], ARGV[3], {[m] = true})
pool_publish(ARGV[2], ARGV[3])
table.insert(out, 1, 'ended')
return out
