-- Releases every lock one holder holds, because the directory recorded that holder (an
-- instance) stopped (docs/locks.md, "Locks die with their holder"). Like a forced unlock
-- per key: the lock is freed whoever asked, its lock_seq stays, and the lock-delay of a
-- stopped holder starts (0: none, and a waiter is woken at once).
-- KEYS[1]: the holder's index set <prefix>lock:<holder>#h.
-- ARGV: holder, lock_delay_ms, retain_ms, lock namespace (<prefix>lock:), stopped_at_ms,
-- the holder's process hash in the directory that recorded the stop, the stopped run's
-- generation ('' when the stop entry did not say: then only the first rule below).
-- Which locks go: while the directory records no newer run of the instance (its record
-- is still stopped in that generation, or gone), every lock the holder holds, whenever it
-- was granted (a process the directory had recorded stopped may have taken some since);
-- once a newer run is recorded, only those granted at or before stopped_at_ms (the new
-- run may hold locks already when the old run's stop arrives late).
-- Idempotent: a second run finds nothing held. Returns how many locks were released.
local holder = ARGV[1]
local delay = tonumber(ARGV[2])
local retain = tonumber(ARGV[3])
local lock_ns = ARGV[4]
local before = tonumber(ARGV[5])
local stop_gen = tonumber(ARGV[7] or '')
local any_time = false
if stop_gen then
  local p = redis.call('HMGET', ARGV[6], 'state', 'generation')
  any_time = not p[1] or (p[1] == 'stopped' and (tonumber(p[2] or '0') or 0) <= stop_gen)
end
local now = now_ms()
local delay_until = 0
if delay > 0 then delay_until = now + delay end
local n = 0
for _, name in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local key = lock_ns .. name
  local r = redis.call('HMGET', key, 'holder', 'expires', 'since')
  local expires = tonumber(r[2]) or 0
  if r[1] == holder and (expires == 0 or now < expires) and
     (any_time or (tonumber(r[3]) or 0) <= before) then
    redis.call('HSET', key, 'holder', '', 'since', '0', 'expires', '0', 'token', '',
               'delay_until', string.format('%d', delay_until),
               'released', string.format('%d', now), 'released_because', 'holder_stopped')
    redis.call('PEXPIRE', key, retain + delay)
    if delay == 0 then
      wake_waiter(key .. '#q')
    end
    n = n + 1
  end
end
return n
