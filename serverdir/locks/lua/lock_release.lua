-- Release one or several locks of one holder, all or nothing (docs/locks.md).
-- KEYS[1..n]: lock records; KEYS[n+1..2n]: their release notification lists
-- <record>#q; KEYS[2n+1]: the holder's index set, on standalone Redis and Sentinel only
-- (on a Redis Cluster serverdir removes the names from it after this script: it lives in
-- another slot).
-- ARGV: holder, retain_ms, then the lock_seq the holder was granted for each key, then
-- the lock_token of each grant, then the lock namespace "<prefix>lock:", then the
-- caller's credential liveness check (the prelude's cred_revoked: process hash, machine,
-- generation; '' when none).
-- A clean release never starts a lock-delay; it wakes one waiter through the key's
-- notification list <record>#q when an acquire refused on the lock said it would wait
-- until now or later (field wait_until, lock_acquire.lua).
-- Returns {'ok', then per key: name, lock_seq} or {'not_holder', name, holder} or
-- {'stale_lock_seq', name} or {'fenced', name} (the lock_token is not the grant's) or
-- {'credential_revoked', why}.
local holder = ARGV[1]
local retain = tonumber(ARGV[2])
local n = (#ARGV - 6) / 2
local lock_ns = ARGV[3 + 2 * n]
local revoked = cred_revoked(ARGV[4 + 2 * n], ARGV[5 + 2 * n], ARGV[6 + 2 * n])
if revoked ~= '' then return {'credential_revoked', revoked} end
local indexed = #KEYS > 2 * n

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local waited = {} -- per key: an acquire may be waiting for it
for i = 1, n do
    local name = lock_name(KEYS[i], lock_ns)
    local r = redis.call('HMGET', KEYS[i], 'holder', 'seq', 'expires', 'token', 'wait_until')
    local cur = r[1] or ''
    local expires = tonumber(r[3]) or 0
    if cur ~= '' and expires > 0 and now >= expires then cur = '' end
    if cur ~= holder then return {'not_holder', name, cur} end
    if r[2] ~= ARGV[2 + i] then return {'stale_lock_seq', name} end
    if (r[4] or '') ~= ARGV[2 + n + i] then return {'fenced', name} end
    waited[i] = (tonumber(r[5]) or 0) >= now
end
local out = {'ok'}
for i = 1, n do
    local name = lock_name(KEYS[i], lock_ns)
    redis.call('HSET', KEYS[i], 'holder', '', 'since', '0', 'expires', '0', 'token', '',
               'released', string.format('%d', now))
    redis.call('PEXPIRE', KEYS[i], retain)
    if indexed then redis.call('SREM', KEYS[2 * n + 1], name) end
    if waited[i] then wake_waiter(KEYS[n + i]) end
    table.insert(out, name)
    table.insert(out, ARGV[2 + i])
end
return out
