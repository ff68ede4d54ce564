-- Asks for the restart of one instance: bumps the restart token of its slot (the slot
-- its process record names); the primary writes it into the machine's assignment.
-- KEYS[1]: the cluster's key base; ARGV[1]: instance.
-- Returns {'ok', service, slot, slot_restart_token, desired_version},
-- {'unknown_instance'}, {'no_slot', service} or {'unknown_service', service}.
local base = KEYS[1]
local p = redis.call('HMGET', base .. 'proc:' .. ARGV[1], 'service', 'slot')
if not p[1] then return {'unknown_instance'} end
if not p[2] or p[2] == '' then return {'no_slot', p[1]} end
if redis.call('EXISTS', base .. 'svc:' .. p[1]) == 0 then
  return {'unknown_service', p[1]}
end
local tok = redis.call('HINCRBY', base .. 'svc:' .. p[1] .. '#slots', p[2], 1)
local d = redis.call('INCR', base .. 'desired:version')
return {'ok', p[1], p[2], string.format('%d', tok), string.format('%d', d)}
