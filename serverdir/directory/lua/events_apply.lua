-- Applies one or more batches of process events (one POST each: serverdir's group
-- commit, http/group.h), in order, atomically: every batch or, on a bad input, a refused
-- batch or a quota past, nothing (the batches were validated in C; the first loop
-- re-checks their shape, with the wire contract's SD constants, and checks ownership and
-- the live-process quota, before any write).
-- KEYS[1]: the cluster's key base "<prefix>{cluster}:"
-- ARGV[1]: event id ttl ms, ARGV[2]: history max length, ARGV[3]: stopped records kept,
-- ARGV[4]: stopped record ttl ms, ARGV[5]: the assignments channel, ARGV[6]: the
-- cluster's name (allocation changes wake the machine's document long-poll), ARGV[7]:
-- live processes per machine at most (directory.live_processes_per_machine), ARGV[8]: how
-- many more than its declared capacity a machine may run (directory.
-- live_processes_above_capacity: a Big Brother's capacity counts the slots the primary
-- may assign it, its static services come on top), then per batch two: the machine the
-- sender's token is bound to ('' when none) and the batch: a JSON array, per event a flat
-- [key, value, ...] array of strings.
-- Ownership: a batch of a machine-bound token may name only instances the directory
-- records on that machine, or records nowhere; one naming an instance recorded on another
-- machine refuses the call: error "forbidden <batch> <event> <instance> <machine>"
-- (1-based batch, 0-based event). A move between machines is an unbound token's act (an
-- operator, or serverdir itself declaring a machine lost). Instance names of Big Brothers
-- carry their machine's name, so a legitimate run never changes machine.
-- Quota: an event that makes an instance live on machine m when m has as many live as its
-- limit refuses the call: error "quota_exceeded <batch> <machine> <limit>".
-- status / confirmed / released events (docs/allocation.md) change the live record of
-- the instance's current run only (stale otherwise); status events go to no history.
-- The warm-pool index follows every change: a run that becomes ready with no open
-- allocation is free; one that stops, moves or is replaced is not, and its open
-- allocations end (released when it exited with code 0, allocation_lost otherwise).
-- Returns {accepted, duplicates, stale, allocations ended lost, allocations released,
-- entries on the unlock list}, the first three of the first batch, then accepted,
-- duplicates and stale of each batch after it. Each stop recorded is also pushed on the
-- list <base>unlock, from which serverdir frees the instance's locks, and so is a late
-- stop of the run already recorded stopped (stale: its process may have taken locks
-- after the first stop, docs/locks.md "Locks die with their holder").
-- A call that added to the history publishes the cluster's name on `chan`:events
-- (events long-polls).
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
local bound, raws = {}, {}
for k = 9, #ARGV - 1, 2 do
  bound[#bound + 1] = ARGV[k]
  raws[#raws + 1] = ARGV[k + 1]
end
local idttl, histmax = ARGV[1], ARGV[2]
local keep, sttl = tonumber(ARGV[3]), tonumber(ARGV[4])
local chan, cluster = ARGV[5], ARGV[6]
local live_max, above_cap = tonumber(ARGV[7]), tonumber(ARGV[8])
local touched = {}
local ended_lost, ended_released = 0, 0
local now = now_ms()
local function s(n) return string.format('%d', n) end
local nows = s(now)
local LIVE = {starting = true, ready = true}
local SIDE = {status = true, confirmed = true, released = true}
local on_release = {} -- service -> its spec's on_release, read once a batch
pstat_delta = {} -- the pool counters, written once at the end (pstat_flush)

-- The text form of a stop (sd_reason_format): "exited(code 3)", "killed(signal 9)", ...
local function stop_text(f)
  if f.reason == 'exited' and f.code then return 'exited(code ' .. f.code .. ')' end
  if f.reason == 'killed' and f.signal then return 'killed(signal ' .. f.signal .. ')' end
  if (f.reason == 'hung' or f.reason == 'start_timeout') and f.silent_ms then
    return f.reason .. '(silent ' .. f.silent_ms .. 'ms)'
  end
  return f.reason or 'replaced'
end

-- The run of `inst` (record fields cur: state, machine, service, slot, max_players,
-- players) leaves the pool: it stops, moves or is replaced by event f.
local function leave_pool(inst, cur, f)
  pool_free_rem(base, cur.service, cur.machine, inst)
  redis.call('ZREM', base .. 'cap:' .. cur.service, inst)
  local clean = f.type == 'stopped' and f.reason == 'exited' and f.code == '0'
  local m, n = alloc_end_instance(base, inst, clean and 'released' or 'allocation_lost',
                                  f.type == 'stopped' and stop_text(f) or 'replaced', now)
  if clean then ended_released = ended_released + n else ended_lost = ended_lost + n end
  if m then touched[m] = true end
end

-- The run of inst became ready on m: free when no allocation is open; its capacity
-- (max_players - players) indexed when it reported max_players.
local function enter_pool(inst, sv, m, key)
  local h = redis.call('HMGET', key, 'players', 'max_players')
  if redis.call('SCARD', base .. 'alloc:i:' .. inst) == 0 then
    pool_free_add(base, sv, m, inst)
  end
  if h[2] then
    redis.call('ZADD', base .. 'cap:' .. sv, tonumber(h[2]) - tonumber(h[1] or '0'), inst)
    pool_touch(sv)
  end
end

-- status / confirmed / released for the live run of f.instance; 1 applied, 0 stale.
local function side_event(f)
  local key = base .. 'proc:' .. f.instance
  local cur = redis.call('HMGET', key, 'state', 'generation', 'machine', 'service')
  if not LIVE[cur[1]] or cur[3] ~= f.machine or cur[4] ~= f.service or
     (f.generation and tonumber(f.generation) ~= tonumber(cur[2] or '0')) then
    return 0
  end
  if f.type == 'status' then
    local h = {'HSET', key, 'updated_at_ms', nows}
    for _, k in ipairs({'players', 'max_players', 'status', 'ports'}) do
      if f[k] then h[#h + 1] = k; h[#h + 1] = f[k] end
    end
    redis.call(unpack(h))
    if cur[1] == 'ready' then
      pool_touch(f.service) -- its status or free player slots may now match a waiter
      local p = redis.call('HMGET', key, 'players', 'max_players')
      if p[2] then
        redis.call('ZADD', base .. 'cap:' .. f.service, tonumber(p[2]) - tonumber(p[1] or '0'),
                   f.instance)
      end
    end
  elseif f.type == 'confirmed' then
    local ak = base .. 'alloc:' .. f.allocation
    local a = redis.call('HMGET', ak, 'state', 'instance')
    if a[1] ~= 'pending' or a[2] ~= f.instance then return 0 end
    redis.call('HSET', ak, 'state', 'active', 'confirmed_at_ms', nows)
    redis.call('ZREM', base .. 'alloc:pending', f.allocation)
  else
    local ids = f.allocation and {f.allocation} or
                redis.call('SMEMBERS', base .. 'alloc:i:' .. f.instance)
    -- back in the pool once its last allocation ends (pool_refree, with the record read
    -- above: the instance is live on f.machine, and ready when cur says so; the service's
    -- on_release read once a batch)
    local refree = false
    if cur[1] == 'ready' then
      local r = on_release[f.service]
      if not r then
        r = svc_on_release(base, f.service)
        on_release[f.service] = r
      end
      refree = r == 'recycle'
    end
    local freed, n = 0, nil
    for _, id in ipairs(ids) do
      local _, m, _, last, count = alloc_end(base, id, 'released', 'game', now, f.instance,
                                             refree)
      if m then
        touched[m] = true; freed = last; ended_released = ended_released + 1
        if last == 1 then n = count end
      end
    end
    if freed == 1 and refree then pool_free_add(base, f.service, f.machine, f.instance, n) end
  end
  return 1
end

local batches, parsed = {}, {}
for b, raw in ipairs(raws) do
  local batch = cjson.decode(raw)
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
  batches[b], parsed[b] = batch, events
end

-- Ownership and quota, before any write: the call's events are played on a copy of the
-- records they name (state, generation, machine), with the ordering rule of apply below,
-- so that what an earlier event of the call does counts for a later one.
local sim, seen, live_n, live_cap = {}, {}, {}, {}
local function sim_rec(inst)
  local r = sim[inst]
  if not r then
    local h = redis.call('HMGET', base .. 'proc:' .. inst, 'state', 'generation', 'machine')
    r = {st = h[1], gen = tonumber(h[2] or '0'), m = h[3]}
    sim[inst] = r
  end
  return r
end
-- How many instances machine m has live, as the call has played so far, and its limit.
local function live_of(m)
  if not live_n[m] then
    live_n[m] = redis.call('ZCARD', base .. 'ix:m:' .. m)
    local c = tonumber(redis.call('HGET', base .. 'machine:' .. m, 'capacity') or '0') or 0
    live_cap[m] = (c > 0 and c + above_cap < live_max) and c + above_cap or live_max
  end
  return live_n[m]
end
local function dup(id)
  if seen[id] then return true end
  seen[id] = true
  return redis.call('EXISTS', base .. 'evid:' .. id) == 1
end
for b, events in ipairs(parsed) do
  for i, f in ipairs(events) do
    -- (status, confirmed, released change no state: unbound, they need no look)
    local r = (bound[b] ~= '' or not SIDE[f.type]) and sim_rec(f.instance)
    if r and bound[b] ~= '' and r.m and r.m ~= bound[b] then
      return redis.error_reply(string.format('forbidden %d %d %s %s', b, i - 1, f.instance, r.m))
    end
    if r and not SIDE[f.type] and not dup(f.id) then
      local gen = f.generation and tonumber(f.generation) or r.gen
      local new_run = (not r.st) or gen > r.gen
      if new_run or (gen == r.gen and r.st ~= 'stopped') then
        local state = f.type == 'stopped' and 'stopped' or 'starting'
        local was = LIVE[r.st] and r.m or nil
        local now_on = state ~= 'stopped' and f.machine or nil
        if was and was ~= now_on then live_n[was] = live_of(was) - 1 end
        if now_on and was ~= now_on then
          if live_of(now_on) >= live_cap[now_on] then
            return redis.error_reply(string.format('quota_exceeded %d %s %d', b, now_on,
                                                   live_cap[now_on]))
          end
          live_n[now_on] = live_n[now_on] + 1
        end
        r.st, r.gen, r.m = state, gen, f.machine
      end
    end
  end
end

key_layout(base) -- the checks passed: from here on the call writes

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

-- The history keeps every field of event fl (flat) but the crash report's log tail (up
-- to 4 KiB: it stays in the process record only, for the stopped-record TTL).
local histed = 0
local function history(fl, f)
  histed = histed + 1
  local x = {'XADD', base .. 'events', 'MAXLEN', histmax, '*'}
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

local stops = 0
-- One batch's events, in order: {accepted, duplicates, stale}.
local function apply(batch, events)
  local accepted, dups, stale = 0, 0, 0
  for i, f in ipairs(events) do
    if not redis.call('SET', base .. 'evid:' .. f.id, '1', 'NX', 'PX', idttl) then
      dups = dups + 1
    elseif SIDE[f.type] then
      accepted = accepted + 1
      if side_event(f) == 0 then stale = stale + 1 end
      -- confirmed / released go to the history (the allocation's story); status events,
      -- up to one a second per instance, only update the record
      if f.type ~= 'status' then history(batch[i], f) end
    else
      accepted = accepted + 1
      local ts = f.ts_ms or nows
      local key = base .. 'proc:' .. f.instance
      local cur = redis.call('HMGET', key, 'state', 'generation', 'machine', 'service', 'slot')
      local st = cur[1]
      local cgen = tonumber(cur[2] or '0')
      local gen = cgen
      if f.generation then gen = tonumber(f.generation) end
      local new_run = (not st) or gen > cgen
      if not (new_run or (gen == cgen and st ~= 'stopped')) then
        stale = stale + 1
        if f.type == 'stopped' and st == 'stopped' and gen == cgen then
          redis.call('RPUSH', base .. 'unlock',
                     f.instance .. ' ' .. (f.ts_ms or nows) .. ' ' .. s(gen))
        end
      else
        local state = 'stopped'
        if f.type == 'started' then
          state = (not new_run and st == 'ready') and 'ready' or 'starting'
        elseif f.type == 'ready' then
          state = 'ready'
        end
        local was_live = st and LIVE[st]
        local same_place = cur[3] == f.machine and cur[4] == f.service
        if was_live and (not LIVE[state] or not same_place or new_run) then
          leave_pool(f.instance, {machine = cur[3], service = cur[4]}, f)
        end
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
        put('restarts', f.restarts)
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
        if state == 'ready' and (new_run or st ~= 'ready' or not same_place) then
          enter_pool(f.instance, f.service, f.machine, key)
        end
        if state == 'stopped' then
          redis.call('ZADD', base .. 'stopped', nows, f.instance)
          redis.call('PEXPIRE', key, s(sttl))
          stops = stops + 1
          -- The hand-off to the lock table, in the same script as the stop: serverdir
          -- releases the instance's locks from this list (directory.c, drain_unlocks).
          -- "instance stopped_at_ms generation": the stopped run (lock_release_holder.lua).
          redis.call('RPUSH', base .. 'unlock', f.instance .. ' ' .. ts .. ' ' .. s(gen))
        end
      end
      history(batch[i], f)
    end
  end
  return accepted, dups, stale
end

local counts = {}
for b = 1, #batches do
  local n = #counts
  counts[n + 1], counts[n + 2], counts[n + 3] = apply(batches[b], parsed[b])
end
doc_touch(base, chan, cluster, touched)
pool_publish(chan, cluster) -- wakes the allocations waiting on the pools that changed
-- wakes the events long-polls of the cluster (events_wait.c), once per call
if histed > 0 then redis.call('PUBLISH', chan .. ':events', cluster) end
pstat_flush(base)

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
-- what waits on the lock hand-off list (this batch's stops and any a failed drain left):
-- serverdir drains it only when it is not empty
local reply = {counts[1], counts[2], counts[3], ended_lost, ended_released,
               redis.call('LLEN', base .. 'unlock')}
for k = 4, #counts do reply[#reply + 1] = counts[k] end
return reply
