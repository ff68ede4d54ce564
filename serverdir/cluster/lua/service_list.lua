-- Reads service specs: one (ARGV[1]) or a page of all (ARGV[1] = '', ARGV[2]: the last
-- name of the previous page or '', ARGV[3]: the page size), read along the index
-- <base>six (a sorted set of names, score 0, kept by service_put and service_delete), so
-- a call costs O(page).
-- KEYS[1]: the cluster's key base.
-- Returns {desired_version, next, {name, spec, version, stopped, restart_token,
-- max_unavailable, slot_tokens (flat slot, token, ...), pool_stats (lua_prelude)}, ...}; next is the page's last
-- name when more may follow, else ''.
local base = KEYS[1]
local names
local next = ''
if ARGV[1] ~= '' then
  names = {ARGV[1]}
else
  local ix = base .. 'six'
  -- names written before the index existed: added once
  index_once(base .. 'services', ix, base .. 'sixv')
  local limit = tonumber(ARGV[3])
  names = redis.call('ZRANGE', ix, ARGV[2] == '' and '-' or '(' .. ARGV[2], '+',
                     'BYLEX', 'LIMIT', 0, limit)
  if #names == limit then next = names[#names] end
end
local out = {redis.call('GET', base .. 'desired:version') or '0', next}
for _, s in ipairs(names) do
  local h = redis.call('HMGET', base .. 'svc:' .. s, 'spec', 'version', 'stopped',
                       'restart_token', 'max_unavailable', 'last_demand_ms')
  if h[1] then
    out[#out + 1] = {s, h[1], h[2] or '0', h[3] or '0', h[4] or '0', h[5] or '1',
                     redis.call('HGETALL', base .. 'svc:' .. s .. '#slots'),
                     pool_stats(base, s, h[6])}
  end
end
return out
