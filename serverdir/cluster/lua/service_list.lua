-- Reads service specs: one (ARGV[1]) or all ('').
-- KEYS[1]: the cluster's key base.
-- Returns {desired_version, {name, spec, version, stopped, restart_token,
-- max_unavailable, slot_tokens (flat slot, token, ...)}, ...}.
local base = KEYS[1]
local names
if ARGV[1] ~= '' then
  names = {ARGV[1]}
else
  names = redis.call('SMEMBERS', base .. 'services')
  table.sort(names)
end
local out = {redis.call('GET', base .. 'desired:version') or '0'}
for _, s in ipairs(names) do
  local h = redis.call('HMGET', base .. 'svc:' .. s, 'spec', 'version', 'stopped',
                       'restart_token', 'max_unavailable')
  if h[1] then
    out[#out + 1] = {s, h[1], h[2] or '0', h[3] or '0', h[4] or '0', h[5] or '1',
                     redis.call('HGETALL', base .. 'svc:' .. s .. '#slots')}
  end
end
return out
