-- Creates or replaces a service spec. A spec equal to the stored one changes nothing.
-- KEYS[1]: the cluster's key base; ARGV[1]: service, ARGV[2]: spec (canonical JSON),
-- ARGV[3]: the version the caller based its change on ('' = any; '0' = must not exist).
-- Returns {'unchanged', version}, {'changed', version, old_spec ('' when created)} or
-- {'conflict', current_version} when ARGV[3] is not the stored version.
local base = KEYS[1]
local now = string.format('%d', now_ms())
local key = base .. 'svc:' .. ARGV[1]
local cur = redis.call('HMGET', key, 'spec', 'version')
if ARGV[3] ~= '' and ARGV[3] ~= (cur[2] or '0') then
  return {'conflict', cur[2] or '0'}
end
if cur[1] == ARGV[2] then
  return {'unchanged', cur[2]}
end
local v = string.format('%d', redis.call('INCR', base .. 'desired:version'))
redis.call('HSET', key, 'spec', ARGV[2], 'version', v, 'updated_at_ms', now)
if not cur[1] then
  redis.call('HSET', key, 'created_at_ms', now, 'stopped', '0', 'restart_token', '0',
             'max_unavailable', '1')
  redis.call('SADD', base .. 'services', ARGV[1])
  redis.call('ZADD', base .. 'six', 0, ARGV[1]) -- the paged list's index (service_list)
end
return {'changed', v, cur[1] or ''}
