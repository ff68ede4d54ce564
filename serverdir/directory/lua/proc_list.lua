-- Lists process records of one cluster through the live indexes or the stopped set.
-- KEYS[1]: the cluster's key base; ARGV[1]: state ('' = starting and ready, or one of
-- starting|ready|stopped), ARGV[2]: machine or '', ARGV[3]: service or '', ARGV[4]: limit.
-- Returns {matching, {field, value, ...}, ...} with at most limit records (matching
-- counts them all); stopped records come newest first, live ones unordered (the caller
-- sorts, keeping that work off Redis).
local base, state, m, sv = KEYS[1], ARGV[1], ARGV[2], ARGV[3]
local limit = tonumber(ARGV[4])
local names
if state == 'stopped' then
  names = redis.call('ZREVRANGE', base .. 'stopped', 0, -1)
elseif m ~= '' and sv ~= '' then
  names = redis.call('SINTER', base .. 'live:m:' .. m, base .. 'live:s:' .. sv)
elseif m ~= '' then
  names = redis.call('SMEMBERS', base .. 'live:m:' .. m)
elseif sv ~= '' then
  names = redis.call('SMEMBERS', base .. 'live:s:' .. sv)
else
  names = redis.call('SMEMBERS', base .. 'live')
end
local out = {0}
if state == '' then
  -- The live indexes are exact (events_apply keeps them with the records): no need to
  -- read records past the limit to count them.
  out[1] = #names
  for i = 1, math.min(#names, limit) do
    out[#out + 1] = redis.call('HGETALL', base .. 'proc:' .. names[i])
  end
  return out
end
local n = 0
for _, inst in ipairs(names) do
  local h = redis.call('HGETALL', base .. 'proc:' .. inst)
  if #h > 0 then
    local f = {}
    for k = 1, #h, 2 do f[h[k]] = h[k + 1] end
    if f.state == state and (m == '' or f.machine == m) and (sv == '' or f.service == sv) then
      n = n + 1
      if n <= limit then out[#out + 1] = h end
    end
  end
end
out[1] = n
return out
