-- One sample of the cluster's ready vs desired series (GET .../series, the dashboard's
-- chart). Taken only when the last one is at least ARGV[1] ms old by the Redis clock, so
-- the serverdir copies that all call it write at most one a period between them; and
-- written only when a figure changed since the last one, so an idle cluster's series
-- (like an idle sweep) writes nothing: each sample holds until the next.
-- KEYS[1]: the cluster's key base; ARGV[1]: the interval (ms), ARGV[2]: samples kept.
-- Appends "<ts_ms> <ready> <starting> <desired> <static>" to <base>series, trimmed to
-- the newest ARGV[2]:
--   ready, starting: ZCARD of the live per-state indexes (events_apply.lua);
--   desired: the sum over the services declared through the API (the first 1000 by name
--     along <base>six) of the count each wants: 0 when the service or the cluster is
--     stopped; for a warm pool what the primary sizes it at now (bb_pool_count: allocated
--     + buffer, or the "P%" rule, 0 when idle past scale_down_delay_s, clamped to
--     [min, max], never under the highest allocated slot + 1), without its scale-down
--     delay: a shrinking pool counts its lower size up to scale_down_delay_s early.
--   static: the live (starting or ready) instances of static services (bigbrother's own
--     config, unknown to serverdir: the live ones less those of the services read).
--     They count in ready and starting; what they want is what their machines' configs
--     run, so a reader compares ready with desired + static (docs/design.md, "Figures").
-- O(services read), never O(processes).
-- Returns {written (0|1), ms until the next sample is due}.
local base = KEYS[1]
local every, keep = tonumber(ARGV[1]), tonumber(ARGV[2])
local key = base .. 'series'
local now = now_ms()
local prev = redis.call('LINDEX', key, -1) or ''
local last = tonumber(string.match(prev, '^(%d+) ') or '')
-- a clock that went back (a failover to a Redis whose clock is behind) restarts the period
if last and now >= last and now - last < every then
  return {0, every - (now - last)}
end

-- The count service s wants now (0 when its spec cannot be read).
local function wanted(s, h)
  local ok, spec = pcall(cjson.decode, h[1])
  if not ok or type(spec) ~= 'table' or h[2] == '1' then return 0 end
  local pool = spec.pool
  if type(pool) ~= 'table' then return tonumber(spec.count) or 0 end
  local st = pool_stats(base, s, h[3])
  local allocated = math.max(0, tonumber(st[1]) or 0)
  local floor = (tonumber(st[3]) or -1) + 1
  local demand = tonumber(st[4]) or 0
  local delay = (tonumber(pool.scale_down_delay_s) or 30) * 1000
  local want
  if allocated == 0 and (demand <= 0 or now - demand >= delay) then
    want = 0
  elseif type(pool.buffer) == 'string' then
    local pct = tonumber(string.match(pool.buffer, '^(%d+)%%$')) or 0
    want = math.ceil(100 * allocated / (100 - pct))
    if want <= allocated then want = allocated + 1 end
  else
    want = allocated + (tonumber(pool.buffer) or 0)
  end
  want = math.max(tonumber(pool.min) or 0, math.min(tonumber(pool.max) or 100000, want))
  return math.max(want, floor)
end

local desired, declared_live = 0, 0
local stopped = redis.call('HGET', base .. 'cluster', 'stopped') == '1'
local ix = base .. 'six'
index_once(base .. 'services', ix, base .. 'sixv')
for _, s in ipairs(redis.call('ZRANGE', ix, 0, 999)) do
  local h = redis.call('HMGET', base .. 'svc:' .. s, 'spec', 'stopped', 'last_demand_ms')
  if h[1] then
    declared_live = declared_live + redis.call('ZCARD', base .. 'ix:s:' .. s)
    if not stopped then desired = desired + wanted(s, h) end
  end
end
local live = redis.call('ZCARD', base .. 'ix')
local figures = string.format('%d %d %d %d', redis.call('ZCARD', base .. 'ix:st:ready'),
                              redis.call('ZCARD', base .. 'ix:st:starting'), desired,
                              math.max(0, live - declared_live))
if string.match(prev, '^%d+ (.*)$') == figures then
  return {0, every}
end
redis.call('RPUSH', key, string.format('%d %s', now, figures))
redis.call('LTRIM', key, -keep, -1)
return {1, every}
