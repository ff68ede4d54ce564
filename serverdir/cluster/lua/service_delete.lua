-- Deletes a service (its spec and slot restart tokens); the primary then removes its
-- slots from the assignments.
-- KEYS[1]: the cluster's key base; ARGV[1]: service.
-- Returns {'ok', desired_version} or {'unknown_service'}.
local base = KEYS[1]
if redis.call('DEL', base .. 'svc:' .. ARGV[1]) == 0 then
  return {'unknown_service'}
end
redis.call('DEL', base .. 'svc:' .. ARGV[1] .. '#slots')
redis.call('SREM', base .. 'services', ARGV[1])
redis.call('ZREM', base .. 'six', ARGV[1])
return {'ok', string.format('%d', redis.call('INCR', base .. 'desired:version'))}
