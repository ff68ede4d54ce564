-- Reads one machine's assignment document.
-- KEYS[1]: the cluster's key base; ARGV[1]: machine.
-- Returns {version, epoch, slots (JSON), cluster_stopped (0|1), allocations (flat id,
-- "<entry JSON>\31<payload JSON>", ...: the open allocations on the machine)}. The version is the
-- larger of the machine's own and the one of the last cluster stop/start, so both kinds
-- of change are seen by a long-poll; a machine without a document has version 0.
key_layout(KEYS[1])
local h = redis.call('HMGET', KEYS[1] .. 'assign/' .. ARGV[1], 'slots', 'version', 'epoch')
local c = redis.call('HMGET', KEYS[1] .. 'cluster', 'stopped', 'stopped_version')
local v = tonumber(h[2] or '0')
local sv = tonumber(c[2] or '0')
if sv > v then v = sv end
return {string.format('%d', v), h[3] or '0', h[1] or '[]', c[1] == '1' and 1 or 0,
        redis.call('HGETALL', KEYS[1] .. 'alloc:m:' .. ARGV[1])}
