-- Delete a blob by an operator (docs/locks.md, repairing a blob). KEYS[1]:
-- <prefix>blob:<name>; ARGV[1]: the quota counters' namespace "<prefix>quota:blob:" on
-- standalone Redis/Sentinel ('' on a cluster: serverdir moves the counter). The data and
-- Blob-Seq go, and their bytes off the quota scope they were counted for; the lock_seq
-- floors the record keeps (lock_seq, read_lock_seq) stay, so later grants of the key
-- still rise.
-- Returns {'ok', blob_seq, bytes, quota scope ('' none)} or {'no_blob'}.
local b = redis.call('HMGET', KEYS[1], 'seq', 'data', 'quota_scope')
if not b[1] then return {'no_blob'} end
redis.call('HDEL', KEYS[1], 'data', 'seq', 'saved_ms', 'quota_scope')
local bytes, scope = #(b[2] or ''), b[3] or ''
if ARGV[1] ~= '' and scope ~= '' and bytes > 0 then
    local k = ARGV[1] .. scope
    if redis.call('DECRBY', k, bytes) < 0 then redis.call('SET', k, '0') end
end
return {'ok', b[1], string.format('%d', bytes), scope}
