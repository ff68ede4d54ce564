-- Read a blob (docs/locks.md). KEYS[1]: <prefix>blob:<name>; KEYS[2]: its lock record.
-- ARGV[1]: the reader's lock_seq, or '' for a plain read; ARGV[2]: its lock_token. A
-- reader that names its lock_seq must present the current grant (else 'fenced'); its
-- lock_seq is stamped on the blob record, a floor for later grants even if the lock
-- record is lost. ARGV[3..5]: the caller's credential liveness check (the prelude's
-- cred_revoked: process hash, machine, generation; '' when none).
-- Returns {'ok', data, blob_seq, current lock_seq}, {'no_blob', current lock_seq},
-- {'fenced'} or {'credential_revoked', why}.
local revoked = cred_revoked(ARGV[3] or '', ARGV[4], ARGV[5])
if revoked ~= '' then return {'credential_revoked', revoked} end
local now = now_ms()
local l = redis.call('HMGET', KEYS[2], 'holder', 'seq', 'expires', 'token')
local cur_seq = '0'
local expires = tonumber(l[3]) or 0
if l[1] and l[1] ~= '' and (expires == 0 or now < expires) then cur_seq = l[2] end
if ARGV[1] ~= '' and (ARGV[1] ~= cur_seq or (l[4] or '') ~= ARGV[2]) then
    return {'fenced'}
end
local b = redis.call('HMGET', KEYS[1], 'data', 'seq')
if not b[2] then return {'no_blob', cur_seq} end
if ARGV[1] ~= '' then
    redis.call('HSET', KEYS[1], 'read_lock_seq', ARGV[1], 'read_ms', string.format('%d', now))
end
return {'ok', b[1], b[2], cur_seq}
