-- Forgets a machine (its lease record and its name in the machine set).
-- KEYS[1]: the cluster's key base; ARGV[1]: machine.
-- Returns 1 when the machine was known, 0 otherwise.
local gone = redis.call('DEL', KEYS[1] .. 'machine:' .. ARGV[1])
local listed = redis.call('SREM', KEYS[1] .. 'machines', ARGV[1])
redis.call('ZREM', KEYS[1] .. 'leases', ARGV[1])
redis.call('ZREM', KEYS[1] .. 'mix', ARGV[1])
if gone + listed > 0 then return 1 end
return 0
