-- Save a blob, fenced (docs/locks.md). KEYS[1]: <prefix>blob:<name>; KEYS[2]: its lock
-- record. ARGV: lock_seq, blob_seq, data.
-- Accepted only if lock_seq is the key's current lock_seq (held, lease not run out) and
-- blob_seq is greater than the stored one; otherwise nothing changes.
-- Returns {'ok', previous blob_seq}, {'fenced', current lock_seq} or {'stale_seq', stored}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local l = redis.call('HMGET', KEYS[2], 'holder', 'seq', 'expires')
local cur_seq = '0'
local expires = tonumber(l[3]) or 0
if l[1] and l[1] ~= '' and (expires == 0 or now < expires) then cur_seq = l[2] end
if ARGV[1] ~= cur_seq then return {'fenced', cur_seq} end
local stored = redis.call('HGET', KEYS[1], 'seq') or '0'
if tonumber(ARGV[2]) <= tonumber(stored) then return {'stale_seq', stored} end
redis.call('HSET', KEYS[1], 'data', ARGV[3], 'seq', ARGV[2], 'lock_seq', ARGV[1],
           'saved_ms', string.format('%d', now))
return {'ok', stored}
