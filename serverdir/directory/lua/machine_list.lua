-- Reads machine leases with the Redis time, so expiry is judged by one clock.
-- KEYS[1]: the cluster's key base; ARGV[1]: one machine name, or '' for a page of all;
-- for a page, ARGV[2]: the last name of the previous page ('' for the first), ARGV[3]:
-- the page size. The page is read along the index <base>mix (a sorted set of names,
-- score 0, kept by machine_put and machine_delete), so a call costs O(page).
-- Returns {now_ms, next, {name, field, value, ...}, ...} (with draining 1 for a machine
-- in the draining set); next is the page's last name when more may follow, else ''.
-- Names whose record expired (lost longer than machine_keep) are dropped from the
-- machine set and the index on the way.
local now = now_ms()
local base = KEYS[1]
local out = {string.format('%d', now), ''}
local names
if ARGV[1] ~= '' then
  names = {ARGV[1]}
else
  local ix = base .. 'mix'
  -- names written before the index existed: added once
  index_once(base .. 'machines', ix, base .. 'mixv')
  local limit = tonumber(ARGV[3])
  names = redis.call('ZRANGE', ix, ARGV[2] == '' and '-' or '(' .. ARGV[2], '+',
                     'BYLEX', 'LIMIT', 0, limit)
  if #names == limit then out[2] = names[#names] end
end
for _, m in ipairs(names) do
  out[#out + 1] = machine_entry(base, m, ARGV[1] == '')
end
return out
