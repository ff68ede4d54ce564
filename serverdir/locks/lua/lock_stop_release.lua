-- The Redis Cluster form of lock_release_holder.lua, for one lock (the holder's index set
-- lives in another slot: serverdir walks it and calls this per key, having read the
-- directory's record of the holder once: its slot is another one too).
-- KEYS[1]: the lock record, KEYS[2]: its release notification list <record>#q.
-- ARGV: holder, lock_delay_ms, retain_ms, stopped_at_ms, any_time ('1': the directory
-- records no newer run of the holder than the stopped one, so the lock goes whenever it
-- was granted; '0': only if granted at or before stopped_at_ms).
-- Returns 1 when the lock was released, 0 when the holder holds it under a grant made
-- after the stop (a new run), -1 when the holder does not hold it (the index entry can go).
local holder = ARGV[1]
local delay = tonumber(ARGV[2])
local retain = tonumber(ARGV[3])
local before = tonumber(ARGV[4])
local now = now_ms()
local r = redis.call('HMGET', KEYS[1], 'holder', 'expires', 'since')
local expires = tonumber(r[2]) or 0
if r[1] ~= holder or (expires > 0 and now >= expires) then return -1 end
if ARGV[5] ~= '1' and (tonumber(r[3]) or 0) > before then return 0 end
local delay_until = 0
if delay > 0 then delay_until = now + delay end
redis.call('HSET', KEYS[1], 'holder', '', 'since', '0', 'expires', '0', 'token', '',
           'delay_until', string.format('%d', delay_until),
           'released', string.format('%d', now), 'released_because', 'holder_stopped')
redis.call('PEXPIRE', KEYS[1], retain + delay)
if delay == 0 then
  wake_waiter(KEYS[2])
end
return 1
