-- Sets or clears a machine's draining flag (placement treats a draining machine as not
-- eligible; the primary moves its slots off).
-- KEYS[1]: the cluster's key base; ARGV[1]: machine, ARGV[2]: '1' drain | '0' undrain.
-- Returns {'ok', changed (0|1), desired_version} or {'unknown_machine'}.
local base = KEYS[1]
if redis.call('SISMEMBER', base .. 'machines', ARGV[1]) == 0 then
  return {'unknown_machine'}
end
local n
if ARGV[2] == '1' then
  n = redis.call('SADD', base .. 'draining', ARGV[1])
else
  n = redis.call('SREM', base .. 'draining', ARGV[1])
end
if n == 0 then
  return {'ok', 0, redis.call('GET', base .. 'desired:version') or '0'}
end
return {'ok', 1, string.format('%d', redis.call('INCR', base .. 'desired:version'))}
