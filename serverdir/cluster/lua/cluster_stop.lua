-- Sets or clears the realm stop flag (cluster_stopped). While set, every machine's
-- assignment document has no slots; a change bumps the assignments version (recorded as
-- stopped_version) and the desired-state version, and wakes every long-poll.
-- KEYS[1]: the cluster's key base; ARGV[1]: '1' stop | '0' start; ARGV[2]: channel,
-- ARGV[3]: cluster name. Returns {changed (0|1), desired_version}.
local base = KEYS[1]
local cur = redis.call('HGET', base .. 'cluster', 'stopped') or '0'
if cur == ARGV[1] then
  return {0, redis.call('GET', base .. 'desired:version') or '0'}
end
local v = redis.call('INCR', base .. 'assign:version')
redis.call('HSET', base .. 'cluster', 'stopped', ARGV[1], 'stopped_version',
           string.format('%d', v))
local d = redis.call('INCR', base .. 'desired:version')
redis.call('PUBLISH', ARGV[2], ARGV[3] .. ' *')
return {1, string.format('%d', d)}
