-- Replaces the slot lists of the named machines atomically, fenced by the primary epoch.
-- KEYS[1]: the cluster's key base "<prefix>{cluster}:"
-- ARGV[1]: epoch, ARGV[2]: publish channel, ARGV[3]: cluster name, ARGV[4]: JSON array
-- [machine, slots, machine, slots, ...] where slots is the canonical JSON text of the
-- machine's slot list (compared and stored as given).
-- Returns {'ok', assignments_version, changed (0|1)} or
-- {'stale_epoch', current_epoch, holder ('' when none or expired)}.
-- The version grows (once per call) only if some machine's list really changed; the
-- changed machines are published so their parked long-polls answer.
local base = KEYS[1]
local now = now_ms()
local stale = stale_epoch(base, ARGV[1], now)
if stale then return stale end
key_layout(base)
local pairs_ = cjson.decode(ARGV[4])
local changed = {}
for i = 1, #pairs_, 2 do
  local cur = redis.call('HGET', base .. 'assign/' .. pairs_[i], 'slots') or '[]'
  if cur ~= pairs_[i + 1] then changed[#changed + 1] = i end
end
if #changed == 0 then
  return {'ok', redis.call('GET', base .. 'assign:version') or '0', 0}
end
local v = string.format('%d', redis.call('INCR', base .. 'assign:version'))
local names = {}
for _, i in ipairs(changed) do
  local m = pairs_[i]
  redis.call('HSET', base .. 'assign/' .. m, 'slots', pairs_[i + 1], 'version', v,
             'epoch', ARGV[1])
  redis.call('SADD', base .. 'assign:machines', m)
  redis.call('ZADD', base .. 'aix', 0, m)
  names[#names + 1] = m
end
redis.call('PUBLISH', ARGV[2], ARGV[3] .. ' ' .. table.concat(names, ' '))
return {'ok', v, 1}
