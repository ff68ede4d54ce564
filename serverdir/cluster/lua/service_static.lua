-- Whether a name that is no desired service is a static one: a service a bigbrother
-- config runs (not the primary), seen as a live process of that name in the directory.
-- Operations on it belong to that machine's bbctl; the caller says so instead of
-- unknown_service. KEYS[1]: the cluster's key base; ARGV[1]: service.
-- Returns {'static', machine, instance} or {'none'}.
local base = KEYS[1]
if redis.call('EXISTS', base .. 'svc:' .. ARGV[1]) == 1 then return {'none'} end
local inst = redis.call('ZRANGE', base .. 'ix:s:' .. ARGV[1], 0, 0)[1] -- the live index
if not inst then return {'none'} end
local m = redis.call('HGET', base .. 'proc:' .. inst, 'machine')
if not m then return {'none'} end
return {'static', m, inst}
