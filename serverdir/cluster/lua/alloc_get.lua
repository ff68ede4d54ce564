-- Reads one allocation. KEYS[1]: the cluster's key base; ARGV[1]: id.
-- Returns the record's field, value, ... (empty when there is none).
return redis.call('HGETALL', KEYS[1] .. 'alloc:' .. ARGV[1])
