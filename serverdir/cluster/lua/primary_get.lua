-- Reads the primary lease with the Redis time.
-- KEYS[1]: the cluster's key base.
-- Returns {holder ('' when none or expired), epoch ('0' when never held), expires_in_ms}.
local now = now_ms()
local cur = redis.call('HMGET', KEYS[1] .. 'primary', 'holder', 'epoch', 'expires_at_ms')
local left = tonumber(cur[3] or '0') - now
local holder = cur[1] or ''
if left <= 0 then holder = '' end
if holder == '' then left = 0 end
return {holder, cur[2] or redis.call('GET', KEYS[1] .. 'primary:epoch') or '0',
        string.format('%d', left)}
