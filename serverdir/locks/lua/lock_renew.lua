-- Renew the lease of a lock by its holder with the current lock_seq and the grant's
-- lock_token (docs/locks.md).
-- KEYS[1]: the lock record. ARGV: holder, lock_seq, ttl_ms (0: keep the granted ttl),
-- retain_ms, lock_token, then the caller's credential liveness check (the prelude's
-- cred_revoked: process hash, machine, generation; '' when none), then the holder's
-- liveness check (the prelude's holder_stop; '' when none).
-- Returns {'ok', lock_seq, expires_ms, now_ms} or {'not_holder', holder} or
-- {'stale_lock_seq'} or {'fenced'} (the lock_token is not the grant's) or
-- {'credential_revoked', why} or {'holder_stopped', reason, stopped_at_ms}.
local revoked = cred_revoked(ARGV[6] or '', ARGV[7], ARGV[8])
if revoked ~= '' then return {'credential_revoked', revoked} end
local dead = holder_stop(ARGV[9] or '')
if dead then return dead end
local holder = ARGV[1]
local want_ttl = tonumber(ARGV[3])
local retain = tonumber(ARGV[4])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local r = redis.call('HMGET', KEYS[1], 'holder', 'seq', 'expires', 'ttl', 'token')
local cur = r[1] or ''
local expires = tonumber(r[3]) or 0
if cur ~= '' and expires > 0 and now >= expires then cur = '' end
if cur ~= holder then return {'not_holder', cur} end
if r[2] ~= ARGV[2] then return {'stale_lock_seq'} end
if (r[5] or '') ~= ARGV[5] then return {'fenced'} end
local ttl = want_ttl
if ttl == 0 then ttl = tonumber(r[4]) or 0 end
if ttl > 0 then
    expires = now + ttl
    redis.call('HSET', KEYS[1], 'expires', string.format('%d', expires), 'ttl',
               string.format('%d', ttl))
    redis.call('PEXPIRE', KEYS[1], ttl + retain)
end
return {'ok', r[2], string.format('%d', expires), string.format('%d', now)}
