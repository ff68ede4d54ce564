-- Save a blob, fenced (docs/locks.md). KEYS[1]: <prefix>blob:<name>; KEYS[2]: its lock
-- record. ARGV: lock_seq, lock_token, blob_seq, data, holder prefix ('' for any holder),
-- the exact holder an instance credential saves as ('' for any: docs/locks.md), then
-- the caller's credential liveness check (the prelude's cred_revoked: process hash,
-- machine, generation; '' when none).
-- Accepted only if lock_seq and lock_token are those of the key's current grant (held,
-- lease not run out), its holder starts with the holder prefix (and is the exact holder
-- when one is given), and blob_seq is greater
-- than the stored one by at most SD.BLOB_SEQ_STEP_MAX; otherwise nothing changes.
-- Returns {'ok', previous blob_seq}, {'fenced'}, {'not_yours'} (the holder prefix),
-- {'stale_seq', stored} or {'seq_jump', stored} or {'credential_revoked', why}.
local revoked = cred_revoked(ARGV[7] or '', ARGV[8], ARGV[9])
if revoked ~= '' then return {'credential_revoked', revoked} end
local now = now_ms()
local l = redis.call('HMGET', KEYS[2], 'holder', 'seq', 'expires', 'token')
local holder = l[1] or ''
local expires = tonumber(l[3]) or 0
if holder == '' or (expires > 0 and now >= expires) or l[2] ~= ARGV[1] or
   (l[4] or '') ~= ARGV[2] then
    return {'fenced'}
end
if string.sub(holder, 1, #ARGV[5]) ~= ARGV[5] then return {'not_yours'} end
local exact = ARGV[6] or ''
if exact ~= '' and holder ~= exact then return {'not_yours'} end
local stored = redis.call('HGET', KEYS[1], 'seq') or '0'
local want = tonumber(ARGV[3])
if want <= tonumber(stored) then return {'stale_seq', stored} end
if want - tonumber(stored) > SD.BLOB_SEQ_STEP_MAX then return {'seq_jump', stored} end
redis.call('HSET', KEYS[1], 'data', ARGV[4], 'seq', ARGV[3], 'lock_seq', ARGV[1],
           'saved_ms', string.format('%d', now))
return {'ok', stored}
