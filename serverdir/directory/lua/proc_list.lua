-- One page of a cluster's process records, walked along an index, in O(page) Redis work.
-- KEYS[1]: the cluster's key base.
-- ARGV: state ('' = starting and ready, or starting|ready|stopped), machine or '',
--       service or '', after (the cursor: '' for the start), limit, budget (index entries
--       looked at, at most).
-- Live lists walk, in instance (byte) order, the most selective index the filter has:
-- ix:m:<machine>, ix:s:<service>, ix:st:<state>, or ix (events_apply keeps them). A
-- filter the walked index does not answer (machine and service, or a state with either)
-- is checked on the record's fields, at most `budget` entries per call: a page can then
-- be short while more follow. state=stopped walks the stopped set newest first; its
-- cursor is the last instance, found again by rank (new stops in front do not shift it).
-- Returns {next ('' at the end), index_size, record...}; a record is HGETALL's array.
local base, state, m, sv, after = KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local limit, budget = tonumber(ARGV[5]), tonumber(ARGV[6])
local out = {'', 0}
local n = 0

local function wanted(inst, check_state, check_m, check_sv)
  if not (check_state or check_m or check_sv) then return true end
  local f = redis.call('HMGET', base .. 'proc:' .. inst, 'state', 'machine', 'service')
  return (not check_state or f[1] == state) and (not check_m or f[2] == m)
     and (not check_sv or f[3] == sv)
end

if state == 'stopped' then
  local key = base .. 'stopped'
  out[2] = redis.call('ZCARD', key)
  local start = 0
  if after ~= '' then
    local r = redis.call('ZREVRANK', key, after)
    if not r then return out end -- the cursor's record is gone: the walk cannot go on
    start = r + 1
  end
  local seen, last = 0, nil
  while n < limit and seen < budget do
    local chunk = math.min(500, budget - seen)
    local names = redis.call('ZREVRANGE', key, start, start + chunk - 1)
    if #names == 0 then break end
    for _, inst in ipairs(names) do
      seen = seen + 1
      last = inst
      if wanted(inst, false, m ~= '', sv ~= '') then
        out[#out + 1] = redis.call('HGETALL', base .. 'proc:' .. inst)
        n = n + 1
        if n >= limit then break end
      end
      if seen >= budget then break end
    end
    start = start + #names
    if #names < chunk then break end
  end
  if last and redis.call('ZREVRANK', key, last) + 1 < out[2] then out[1] = last end
  return out
end

local idx, check_state, check_m, check_sv
if m ~= '' then
  idx, check_state, check_sv = base .. 'ix:m:' .. m, state ~= '', sv ~= ''
elseif sv ~= '' then
  idx, check_state = base .. 'ix:s:' .. sv, state ~= ''
elseif state ~= '' then
  idx = base .. 'ix:st:' .. state
else
  idx = base .. 'ix'
end
out[2] = redis.call('ZCARD', idx)
local min = after == '' and '-' or ('(' .. after)
local seen, last = 0, nil
while n < limit and seen < budget do
  local chunk = math.min(500, budget - seen, limit - n + ((check_state or check_sv) and 64 or 0))
  local names = redis.call('ZRANGEBYLEX', idx, min, '+', 'LIMIT', 0, chunk)
  if #names == 0 then break end
  for _, inst in ipairs(names) do
    seen = seen + 1
    last = inst
    if wanted(inst, check_state, check_m, check_sv) then
      out[#out + 1] = redis.call('HGETALL', base .. 'proc:' .. inst)
      n = n + 1
      if n >= limit then break end
    end
    if seen >= budget then break end
  end
  if #names < chunk then break end
  min = '(' .. last
end
if last and #redis.call('ZRANGEBYLEX', idx, '(' .. last, '+', 'LIMIT', 0, 1) > 0 then
  out[1] = last
end
return out
