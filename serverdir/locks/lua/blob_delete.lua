-- Delete a blob by an operator (docs/locks.md, repairing a blob). KEYS[1]:
-- <prefix>blob:<name>. The data and Blob-Seq go; the lock_seq floors the record keeps
-- (lock_seq, read_lock_seq) stay, so later grants of the key still rise.
-- Returns {'ok', blob_seq, bytes} or {'no_blob'}.
local b = redis.call('HMGET', KEYS[1], 'seq', 'data')
if not b[1] then return {'no_blob'} end
redis.call('HDEL', KEYS[1], 'data', 'seq', 'saved_ms')
return {'ok', b[1], string.format('%d', #(b[2] or ''))}
