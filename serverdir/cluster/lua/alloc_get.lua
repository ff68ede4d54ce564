-- Reads one allocation. KEYS[1]: the cluster's key base; ARGV[1]: id, ARGV[2]: the
-- principal the caller sees the allocations of ('' all; a record without an owner, of
-- before owners were recorded, is everyone's).
-- Returns the record's field, value, ... (empty when there is none or it is another's).
local a = redis.call('HGETALL', KEYS[1] .. 'alloc:' .. ARGV[1])
if ARGV[2] ~= '' then
  for i = 1, #a, 2 do
    if a[i] == 'owner' and a[i + 1] ~= ARGV[2] then return {} end
  end
end
return a
