-- Sets a service's stopped flag: a stopped service keeps its count but gets no slots.
-- KEYS[1]: the cluster's key base; ARGV[1]: service, ARGV[2]: '1' stop | '0' start.
-- Returns {'ok', changed (0|1), desired_version} or {'unknown_service'}.
local base = KEYS[1]
local key = base .. 'svc:' .. ARGV[1]
local cur = redis.call('HGET', key, 'stopped')
if not cur then return {'unknown_service'} end
if cur == ARGV[2] then
  return {'ok', 0, redis.call('GET', base .. 'desired:version') or '0'}
end
redis.call('HSET', key, 'stopped', ARGV[2])
return {'ok', 1, string.format('%d', redis.call('INCR', base .. 'desired:version'))}
