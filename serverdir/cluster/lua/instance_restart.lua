-- Asks for the restart of one instance: bumps the restart token of its slot (the slot
-- its process record names); the primary writes it into the machine's assignment.
-- KEYS[1]: the cluster's key base; ARGV[1]: instance.
-- Returns {'ok', service, slot, slot_restart_token, desired_version},
-- {'unknown_instance'}, {'static_service', service, machine} (a live instance of no
-- desired service: a bigbrother config runs it), {'unknown_service', service} (a stopped
-- one of a deleted service) or {'no_slot', service}.
local base = KEYS[1]
local p = redis.call('HMGET', base .. 'proc:' .. ARGV[1], 'service', 'slot', 'machine')
if not p[1] then return {'unknown_instance'} end
if redis.call('EXISTS', base .. 'svc:' .. p[1]) == 0 then
  if redis.call('ZSCORE', base .. 'ix', ARGV[1]) then -- live (directory's index)
    return {'static_service', p[1], p[3] or ''}
  end
  return {'unknown_service', p[1]}
end
if not p[2] or p[2] == '' then return {'no_slot', p[1]} end
local tok = redis.call('HINCRBY', base .. 'svc:' .. p[1] .. '#slots', p[2], 1)
local d = redis.call('INCR', base .. 'desired:version')
return {'ok', p[1], p[2], string.format('%d', tok), string.format('%d', d)}
