-- Releases the primary lease if machine ARGV[1] holds it (a clean shutdown); the epoch
-- counter stays, so the next holder gets a new epoch.
-- KEYS[1]: the cluster's key base. Returns {'ok', epoch} or {'not_primary', holder}.
local now = now_ms()
local key = KEYS[1] .. 'primary'
local cur = redis.call('HMGET', key, 'holder', 'epoch', 'expires_at_ms')
local holder = cur[1] or ''
if holder ~= ARGV[1] or tonumber(cur[3] or '0') <= now then
  if tonumber(cur[3] or '0') <= now then holder = '' end
  return {'not_primary', holder}
end
redis.call('HSET', key, 'holder', '', 'expires_at_ms', '0')
return {'ok', cur[2]}
