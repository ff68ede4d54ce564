-- Forced unlock by an operator (docs/locks.md): frees the lock whoever holds it and
-- starts the configured lock-delay. The lock_seq stays in the record, so the next grant
-- is still higher.
-- KEYS[1]: the lock record, KEYS[2]: its release notification list <record>#q.
-- ARGV: lock_delay_ms, retain_ms, lock namespace (<prefix>lock:),
-- '1' on a Redis Cluster (the holder's index set lives in another slot: serverdir
-- updates it after this script).
-- Returns {'ok', previous holder, lock_seq, delay_until_ms} or {'not_held'}.
local delay = tonumber(ARGV[1])
local retain = tonumber(ARGV[2])
local lock_ns = ARGV[3]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local r = redis.call('HMGET', KEYS[1], 'holder', 'seq', 'expires')
local cur = r[1] or ''
local expires = tonumber(r[3]) or 0
if cur ~= '' and expires > 0 and now >= expires then cur = '' end
if cur == '' then return {'not_held'} end
local delay_until = 0
if delay > 0 then delay_until = now + delay end
redis.call('HSET', KEYS[1], 'holder', '', 'since', '0', 'expires', '0', 'token', '',
           'delay_until', string.format('%d', delay_until),
           'released', string.format('%d', now))
redis.call('PEXPIRE', KEYS[1], retain + delay)
if ARGV[4] ~= '1' then redis.call('SREM', lock_ns .. cur .. '#h', lock_name(KEYS[1], lock_ns)) end
if delay == 0 then
    wake_waiter(KEYS[2])
end
return {'ok', cur, r[2], string.format('%d', delay_until)}
