-- The primary declares machine ARGV[2] lost: fenced by the epoch, removes its slots from
-- the assignments and lists its live processes, which the caller then marks stopped
-- (reason machine_lost) through events_apply, like any event.
-- KEYS[1]: the cluster's key base; ARGV[1]: epoch, ARGV[2]: machine, ARGV[3]: channel,
-- ARGV[4]: cluster name; ARGV[5..]: services kept as they are (spec.disconnect: slots
-- held on the machine, or originals kept for reconcile keep_original): their processes
-- are not listed, and when any is named the slots are left to the primary's own
-- PUT /assignments (it removes only the slots it does not hold).
-- A machine whose lease is live again (it renewed after the primary read the state it
-- decided on) is not lost: {'machine_live', lease ms left}, nothing written (its
-- bigbrother read its live records after that renewal and would not see a later stop).
-- Returns {'ok', assignments_version, changed (0|1), instance, service, ...},
-- {'stale_epoch', current_epoch, holder} or {'machine_live', ms_left}.
local base = KEYS[1]
local now = now_ms()
local stale = stale_epoch(base, ARGV[1], now)
if stale then return stale end
key_layout(base)
local m = ARGV[2]
local exp = tonumber(redis.call('HGET', base .. 'machine:' .. m, 'expires_at_ms') or '0') or 0
if exp > now then return {'machine_live', exp - now} end
local keep = {}
for i = 5, #ARGV do keep[ARGV[i]] = true end
local out = {'ok', redis.call('GET', base .. 'assign:version') or '0', 0}
local cur = redis.call('HGET', base .. 'assign/' .. m, 'slots') or '[]'
if cur ~= '[]' and #ARGV < 5 then
  local v = string.format('%d', redis.call('INCR', base .. 'assign:version'))
  redis.call('HSET', base .. 'assign/' .. m, 'slots', '[]', 'version', v, 'epoch', ARGV[1])
  redis.call('PUBLISH', ARGV[3], ARGV[4] .. ' ' .. m)
  out[2], out[3] = v, 1
end
local live = redis.call('ZRANGE', base .. 'ix:m:' .. m, 0, -1) -- one machine's: bounded
for _, inst in ipairs(live) do
  local svc = redis.call('HGET', base .. 'proc:' .. inst, 'service') or ''
  if not keep[svc] then
    out[#out + 1] = inst
    out[#out + 1] = svc
  end
end
return out
