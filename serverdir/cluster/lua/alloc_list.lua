-- One page of allocations, oldest first (ids sort by creation).
-- KEYS[1]: the cluster's key base; ARGV: 1 after (an id, '' from the start), 2 limit,
-- 3 service ('' any), 4 the principal whose allocations the caller sees ('' all; a
-- record without an owner is everyone's). Looks at most 4 x limit entries of the index, so a filter costs
-- a bounded amount per page.
-- Returns {next ('' at the end), {field, value, ...}, ...}.
local base = KEYS[1]
local limit = tonumber(ARGV[2])
local min = ARGV[1] == '' and '-' or '(' .. ARGV[1]
local ids = redis.call('ZRANGEBYLEX', base .. 'allocs', min, '+', 'LIMIT', 0, limit * 4)
local out, last, n = {''}, nil, 0
for _, id in ipairs(ids) do
  last = id
  local a = redis.call('HGETALL', base .. 'alloc:' .. id)
  if #a > 0 then
    local keep = true
    for i = 1, #a, 2 do
      if a[i] == 'service' and ARGV[3] ~= '' then keep = keep and a[i + 1] == ARGV[3] end
      if a[i] == 'owner' and ARGV[4] ~= '' then keep = keep and a[i + 1] == ARGV[4] end
    end
    if keep then
      out[#out + 1] = a
      n = n + 1
      if n == limit then break end
    end
  end
end
if last and (n == limit or #ids == limit * 4) then
  if redis.call('ZRANGEBYLEX', base .. 'allocs', '(' .. last, '+', 'LIMIT', 0, 1)[1] then
    out[1] = last
  end
end
return out
