-- Reads machine leases with the Redis time, so expiry is judged by one clock.
-- KEYS[1]: the cluster's key base; ARGV[1]: one machine name, or '' for all.
-- Returns {now_ms, {name, field, value, ...}, ...} (with draining 1 for a machine in the
-- draining set); names whose record expired (lost longer than machine_keep) are dropped
-- from the machine set on the way.
local now = now_ms()
local out = {string.format('%d', now)}
local names
if ARGV[1] ~= '' then
  names = {ARGV[1]}
else
  names = redis.call('SMEMBERS', KEYS[1] .. 'machines')
  table.sort(names)
end
for _, m in ipairs(names) do
  local h = redis.call('HGETALL', KEYS[1] .. 'machine:' .. m)
  if #h > 0 then
    table.insert(h, 1, m)
    if redis.call('SISMEMBER', KEYS[1] .. 'draining', m) == 1 then
      h[#h + 1] = 'draining'
      h[#h + 1] = '1'
    end
    out[#out + 1] = h
  elseif ARGV[1] == '' then
    redis.call('SREM', KEYS[1] .. 'machines', m)
  end
end
return out
