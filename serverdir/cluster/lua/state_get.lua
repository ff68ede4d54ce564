-- Everything the primary needs, read at one instant: desired state, machines (with the
-- draining flag) and every assignment document.
-- KEYS[1]: the cluster's key base.
-- Returns {now_ms, desired_version, cluster_stopped (0|1), assignments_version,
--   services: {{name, spec, version, stopped, restart_token, max_unavailable,
--               {slot, token, ...}, {allocated, free, max_allocated_slot,
--               last_demand_ms}}, ...},
--   machines: {{name, field, value, ...}, ...}   (as machine_list, plus draining),
--   assignments: {{machine, version, epoch, slots}, ...}}
local base = KEYS[1]
local now = now_ms()
local c = redis.call('HMGET', base .. 'cluster', 'stopped', 'stopped_version')
local sv = tonumber(c[2] or '0')
local services = {}
local names = redis.call('SMEMBERS', base .. 'services')
table.sort(names)
for _, s in ipairs(names) do
  local h = redis.call('HMGET', base .. 'svc:' .. s, 'spec', 'version', 'stopped',
                       'restart_token', 'max_unavailable', 'last_demand_ms')
  if h[1] then
    services[#services + 1] = {s, h[1], h[2] or '0', h[3] or '0', h[4] or '0', h[5] or '1',
                               redis.call('HGETALL', base .. 'svc:' .. s .. '#slots'),
                               pool_stats(base, s, h[6])}
  end
end
local machines = {}
local mnames = redis.call('SMEMBERS', base .. 'machines')
table.sort(mnames)
for _, m in ipairs(mnames) do
  local h = redis.call('HGETALL', base .. 'machine:' .. m)
  if #h > 0 then
    table.insert(h, 1, m)
    if redis.call('SISMEMBER', base .. 'draining', m) == 1 then
      h[#h + 1] = 'draining'
      h[#h + 1] = '1'
    end
    machines[#machines + 1] = h
  end
end
local assignments = {}
local anames = redis.call('SMEMBERS', base .. 'assign:machines')
table.sort(anames)
for _, m in ipairs(anames) do
  local h = redis.call('HMGET', base .. 'assign:' .. m, 'slots', 'version', 'epoch')
  if h[1] then
    local v = tonumber(h[2] or '0')
    if sv > v then v = sv end
    assignments[#assignments + 1] = {m, string.format('%d', v), h[3] or '0', h[1]}
  end
end
return {string.format('%d', now), redis.call('GET', base .. 'desired:version') or '0',
        c[1] == '1' and 1 or 0, redis.call('GET', base .. 'assign:version') or '0',
        services, machines, assignments}
