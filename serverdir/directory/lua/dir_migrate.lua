-- Moves one chunk of a cluster's live directory from the sets of before the paged lists
-- (live, live:m:<m>, live:s:<s>) to the sorted-set indexes events_apply keeps now (ix,
-- ix:m:, ix:s:, ix:st:). KEYS[1]: the cluster's key base; ARGV: SSCAN cursor, count.
-- Each instance is indexed by its record as it is now (the old sets are no longer kept,
-- so they may name processes that stopped since). When the scan ends, the old sets are
-- deleted and ixv is set to 1: from then on nothing is done.
-- Returns the next cursor ('0': done).
local base = KEYS[1]
if redis.call('GET', base .. 'ixv') == '1' then return '0' end
-- nothing of before (a new cluster): nothing to write
if ARGV[1] == '0' and redis.call('EXISTS', base .. 'live') == 0 then return '0' end
local r = redis.call('SSCAN', base .. 'live', ARGV[1], 'COUNT', ARGV[2])
for _, inst in ipairs(r[2]) do
  local f = redis.call('HMGET', base .. 'proc:' .. inst, 'state', 'machine', 'service')
  if f[1] == 'starting' or f[1] == 'ready' then
    redis.call('ZADD', base .. 'ix', 0, inst)
    redis.call('ZADD', base .. 'ix:m:' .. f[2], 0, inst)
    redis.call('ZADD', base .. 'ix:s:' .. f[3], 0, inst)
    redis.call('ZADD', base .. 'ix:st:' .. f[1], 0, inst)
  end
  if f[2] then
    redis.call('DEL', base .. 'live:m:' .. f[2])
  end
  if f[3] then
    redis.call('DEL', base .. 'live:s:' .. f[3])
  end
end
if r[1] == '0' then
  redis.call('DEL', base .. 'live')
  redis.call('SET', base .. 'ixv', '1')
end
return r[1]
