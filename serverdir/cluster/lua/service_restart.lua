-- Asks for a rolling restart of a service: bumps its restart_token and records how many
-- of its slots may be down at once; the primary rolls it.
-- KEYS[1]: the cluster's key base; ARGV[1]: service, ARGV[2]: max_unavailable.
-- Returns {'ok', restart_token, desired_version} or {'unknown_service'}.
local base = KEYS[1]
local key = base .. 'svc:' .. ARGV[1]
if redis.call('EXISTS', key) == 0 then return {'unknown_service'} end
local tok = redis.call('HINCRBY', key, 'restart_token', 1)
redis.call('HSET', key, 'max_unavailable', ARGV[2])
local d = redis.call('INCR', base .. 'desired:version')
return {'ok', string.format('%d', tok), string.format('%d', d)}
