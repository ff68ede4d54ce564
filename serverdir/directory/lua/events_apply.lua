-- Applies one batch of process events atomically: the whole batch or, on a bad input,
-- nothing (the batch was validated in C; the first loop re-checks its shape, with the
-- wire contract's SD constants, before any write).
-- KEYS[1]: the cluster's key base "<prefix>{cluster}:"
-- ARGV[1]: JSON array, per event a flat [key, value, ...] array of strings
-- ARGV[2]: event id ttl ms, ARGV[3]: history max length, ARGV[4]: stopped records kept,
-- ARGV[5]: stopped record ttl ms.
-- Returns {accepted, duplicates, stale}. Each stop recorded is also pushed on the list
-- <base>unlock, from which serverdir frees the instance's locks.
--
-- Idempotency: evid:<id> is set NX with a ttl; an event whose id is set is a duplicate
-- and changes nothing. Every other event goes to the history stream.
--
-- Ordering, per instance record (generation = the slot's restart count; an event
-- without one belongs to the record's current run):
--   event generation  record                      effect
--   any               none                        new record (stopped too: recorded)
--   newer             any                         new run: the record is replaced
--   older             any                         stale: record unchanged
--   same              stopped                     stale: a stopped run never comes back
--   same              starting/ready              applied (started keeps ready)
local base = KEYS[1]
local batch = cjson.decode(ARGV[1])
local idttl, histmax = ARGV[2], ARGV[3]
local keep, sttl = tonumber(ARGV[4]), tonumber(ARGV[5])
local now = now_ms()
local function s(n) return string.format('%d', n) end
local nows = s(now)
local LIVE = {starting = true, ready = true}

if #batch > SD.EVENTS_MAX then
  return redis.error_reply('bad_field events must be at most ' .. SD.EVENTS_MAX .. ' events')
end
local events = {}
for i, e in ipairs(batch) do
  local f = {}
  for k = 1, #e, 2 do f[e[k]] = e[k + 1] end
  if type(f.id) ~= 'string' or type(f.instance) ~= 'string' or type(f.machine) ~= 'string'
     or type(f.service) ~= 'string' or not SD.EVENT_TYPES[f.type]
     or (f.type == 'stopped') ~= (SD.STOP_REASONS[f.reason] ~= nil) then
    return redis.error_reply('bad_field events[' .. (i - 1) .. '] is malformed')
  end
  events[i] = f
end

-- The live indexes the paged lists walk (proc_list.lua): sorted sets, score 0, in
-- instance order: all live, per machine, per service, per state.
local function index(cmd, inst, m, sv, st)
  local z = cmd == 'add' and 'ZADD' or 'ZREM'
  local function one(k)
    if z == 'ZADD' then redis.call('ZADD', k, 0, inst) else redis.call('ZREM', k, inst) end
  end
  one(base .. 'ix')
  one(base .. 'ix:m:' .. m)
  one(base .. 'ix:s:' .. sv)
  one(base .. 'ix:st:' .. st)
end

local accepted, dups, stale, stops = 0, 0, 0, 0
for i, f in ipairs(events) do
  if not redis.call('SET', base .. 'evid:' .. f.id, '1', 'NX', 'PX', idttl) then
    dups = dups + 1
  else
    accepted = accepted + 1
    local ts = f.ts_ms or nows
    local key = base .. 'proc:' .. f.instance
    local cur = redis.call('HMGET', key, 'state', 'generation', 'machine', 'service')
    local st = cur[1]
    local cgen = tonumber(cur[2] or '0')
    local gen = cgen
    if f.generation then gen = tonumber(f.generation) end
    local new_run = (not st) or gen > cgen
    if not (new_run or (gen == cgen and st ~= 'stopped')) then
      stale = stale + 1
    else
      local state = 'stopped'
      if f.type == 'started' then
        state = (not new_run and st == 'ready') and 'ready' or 'starting'
      elseif f.type == 'ready' then
        state = 'ready'
      end
      local was_live = st and LIVE[st]
      local same_place = cur[3] == f.machine and cur[4] == f.service
      if was_live and (not LIVE[state] or not same_place) then
        index('rem', f.instance, cur[3], cur[4], st)
      elseif was_live and st ~= state then
        -- starting -> ready in place: only the state index moves
        redis.call('ZREM', base .. 'ix:st:' .. st, f.instance)
        redis.call('ZADD', base .. 'ix:st:' .. state, 0, f.instance)
      end
      if new_run and st then
        redis.call('DEL', key)
        if st == 'stopped' then redis.call('ZREM', base .. 'stopped', f.instance) end
      end
      local h = {'HSET', key, 'instance', f.instance, 'machine', f.machine,
                 'service', f.service, 'state', state, 'generation', s(gen),
                 'updated_at_ms', nows}
      local function put(k, v)
        if v then
          h[#h + 1] = k
          h[#h + 1] = v
        end
      end
      put('pid', f.pid)
      put('slot', f.slot)
      put('ports', f.ports)
      if f.type == 'started' then
        put('started_at_ms', ts)
      elseif f.type == 'ready' then
        put('ready_at_ms', ts)
      else
        put('stopped_at_ms', ts)
        put('reason', f.reason)
        put('code', f.code)
        put('signal', f.signal)
        put('silent_ms', f.silent_ms)
        put('detail', f.detail)
        put('core', f.core)
        put('log_tail', f.log_tail)
      end
      redis.call(unpack(h))
      if LIVE[state] and not (was_live and same_place) then
        index('add', f.instance, f.machine, f.service, state)
      end
      if state == 'stopped' then
        redis.call('ZADD', base .. 'stopped', nows, f.instance)
        redis.call('PEXPIRE', key, s(sttl))
        stops = stops + 1
        -- The hand-off to the lock table, in the same script as the stop: serverdir
        -- releases the instance's locks from this list (directory.c, drain_unlocks).
        -- "instance stopped_at_ms": only locks granted before the stop are its run's.
        redis.call('RPUSH', base .. 'unlock', f.instance .. ' ' .. ts)
      end
    end
    -- the history keeps every field but the crash report's log tail (up to 4 KiB: it
    -- stays in the process record only, for the stopped-record TTL)
    local x = {'XADD', base .. 'events', 'MAXLEN', histmax, '*'}
    local fl = batch[i]
    for k = 1, #fl, 2 do
      if fl[k] ~= 'log_tail' then
        x[#x + 1] = fl[k]
        x[#x + 1] = fl[k + 1]
      end
    end
    if not f.ts_ms then
      x[#x + 1] = 'ts_ms'
      x[#x + 1] = nows
    end
    redis.call(unpack(x))
  end
end

-- Keep the stopped records bounded: by age, then by count (oldest first).
if stops > 0 then
  redis.call('ZREMRANGEBYSCORE', base .. 'stopped', '-inf', s(now - sttl))
  local n = redis.call('ZCARD', base .. 'stopped')
  if n > keep then
    local old = redis.call('ZRANGE', base .. 'stopped', 0, n - keep - 1)
    for _, inst in ipairs(old) do redis.call('DEL', base .. 'proc:' .. inst) end
    redis.call('ZREMRANGEBYRANK', base .. 'stopped', 0, n - keep - 1)
  end
end
return {accepted, dups, stale}
