-- Acquires or renews the cluster's primary lease, timed by Redis TIME.
-- KEYS[1]: the cluster's key base "<prefix>{cluster}:"
-- ARGV[1]: machine, ARGV[2]: ttl_ms.
-- Returns {'ok', holder, epoch, expires_in_ms, 'acquired'|'renewed'} or
-- {'primary_held', holder, epoch, expires_in_ms}.
-- The epoch grows by one on every change of holder; it comes from primary:epoch, which
-- is never deleted, so an epoch is never handed out twice. A holder renewing its own
-- lease (even one that ran out while nobody took it) keeps its epoch.
local now = now_ms()
local function s(n) return string.format('%d', n) end
local key = KEYS[1] .. 'primary'
local m, ttl = ARGV[1], tonumber(ARGV[2])
local cur = redis.call('HMGET', key, 'holder', 'epoch', 'expires_at_ms')
local holder, epoch, expires = cur[1] or '', cur[2] or '0', tonumber(cur[3] or '0')
if holder ~= '' and holder ~= m and expires > now then
  return {'primary_held', holder, epoch, s(expires - now)}
end
if holder == m then
  redis.call('HSET', key, 'expires_at_ms', s(now + ttl))
  return {'ok', m, epoch, s(ttl), 'renewed'}
end
local e = redis.call('INCR', KEYS[1] .. 'primary:epoch')
redis.call('HSET', key, 'holder', m, 'epoch', s(e), 'expires_at_ms', s(now + ttl),
           'acquired_at_ms', s(now))
return {'ok', m, s(e), s(ttl), 'acquired'}
