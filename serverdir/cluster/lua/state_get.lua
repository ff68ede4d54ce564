-- What the primary needs: desired state, machines (with the draining flag) and the
-- assignment documents, a few records per call: GET /state builds its pages from
-- calls of this script (api_cluster.c).
-- KEYS[1]: the cluster's key base.
-- ARGV[1]: where the call starts: a part ('s' services, 'm' machines, 'a' assignments)
--   and ARGV[2], the last name read before in it ('' for the part's first); ARGV[1] =
--   'w' starts a read of the whole state, refused ({'too_large', records}) when the
--   cluster holds more than ARGV[5] records in all.
-- ARGV[3]: records to read at most; ARGV[4]: a byte budget (the texts read: the call
--   ends after the record that crosses it, so it reads at least one).
-- The parts are walked in that order along their name indexes (<base>six, mix, aix:
-- sorted sets of names, score 0), so a call costs O(ARGV[3]) however large the cluster.
-- Returns {now_ms, desired_version, cluster_stopped (0|1), assignments_version,
--   services: {{name, spec, version, stopped, restart_token, max_unavailable,
--               {slot, token, ...}, {allocated, free, max_allocated_slot,
--               last_demand_ms}}, ...},
--   machines: {{name, field, value, ...}, ...}   (as machine_list, plus draining),
--   assignments: {{machine, version, epoch, slots}, ...},
--   next: '' when the walk is done, else the part and name to start the next call at,
--   bytes: the texts read}.
local base = KEYS[1]
key_layout(base)
local now = now_ms()
local c = redis.call('HMGET', base .. 'cluster', 'stopped', 'stopped_version')
local sv = tonumber(c[2] or '0')
local part, after = ARGV[1], ARGV[2]
local left, budget = tonumber(ARGV[3]), tonumber(ARGV[4])
local read = 0
if part == 'w' then
  local n = redis.call('SCARD', base .. 'services') + redis.call('SCARD', base .. 'machines') +
            redis.call('SCARD', base .. 'assign:machines')
  if n > tonumber(ARGV[5]) then return {'too_large', n} end
  part, after = 's', ''
end

local services, machines, assignments = {}, {}, {}

-- One record of each part: appended to its list; returns the bytes it cost, or nil
-- when the name's record is gone (a stale index entry, removed).
local function service(s)
  local h = redis.call('HMGET', base .. 'svc:' .. s, 'spec', 'version', 'stopped',
                       'restart_token', 'max_unavailable', 'last_demand_ms')
  if not h[1] then return nil end
  services[#services + 1] = {s, h[1], h[2] or '0', h[3] or '0', h[4] or '0', h[5] or '1',
                             redis.call('HGETALL', base .. 'svc:' .. s .. '#slots'),
                             pool_stats(base, s, h[6])}
  return #h[1] + 64
end

local function machine(m)
  local h = machine_entry(base, m, true)
  if not h then return nil end
  local bytes = 0
  for i = 1, #h do bytes = bytes + #h[i] end
  machines[#machines + 1] = h
  return bytes
end

local function assignment(m)
  local h = redis.call('HMGET', base .. 'assign/' .. m, 'slots', 'version', 'epoch')
  if not h[1] then return nil end
  local v = tonumber(h[2] or '0')
  if sv > v then v = sv end
  assignments[#assignments + 1] = {m, string.format('%d', v), h[3] or '0', h[1]}
  return #h[1] + 64
end

local parts = {
  {'s', 'services', 'six', 'sixv', service},
  {'m', 'machines', 'mix', 'mixv', machine},
  {'a', 'assign:machines', 'aix', 'aixv', assignment},
}
local next = ''
local pi = ({s = 1, m = 2, a = 3})[part]
while pi and pi <= 3 and next == '' do
  local p = parts[pi]
  local ix = base .. p[3]
  -- names written before the index existed: added once
  index_once(base .. p[2], ix, base .. p[4])
  local names = redis.call('ZRANGE', ix, after == '' and '-' or '(' .. after, '+',
                           'BYLEX', 'LIMIT', 0, left)
  for _, name in ipairs(names) do
    local bytes = p[5](name) or 0
    budget, read = budget - bytes, read + bytes
    left = left - 1
    if left == 0 or budget <= 0 then
      -- more may follow: in this part, or (after its last name) in the next ones
      next = p[1] .. ':' .. name
      break
    end
  end
  pi, after = pi + 1, ''
end
return {string.format('%d', now), redis.call('GET', base .. 'desired:version') or '0',
        c[1] == '1' and 1 or 0, redis.call('GET', base .. 'assign:version') or '0',
        services, machines, assignments, next, read}
