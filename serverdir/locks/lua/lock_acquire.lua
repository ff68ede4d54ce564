-- Acquire one or several locks for one holder, all or nothing (docs/locks.md).
-- KEYS[1..n]: lock records <prefix>lock:<name>; KEYS[n+1..2n]: their blob records
-- <prefix>blob:<name> (a floor for lock_seq); KEYS[2n+1]: the holder's index set, given
-- on standalone Redis/Sentinel only (on a Redis Cluster serverdir adds the names to the
-- index before this script and removes a previous holder's after it: the index lives in
-- another slot).
-- ARGV: holder, ttl_ms (0: no expiry), lock_delay_ms, retain_ms, steal_cluster ("": no),
--       steal_older_ms (0: no), prefix, n, then a lock_token per key (the one the caller
--       presented, or a fresh random one serverdir drew), then per key '1' when the caller
--       presented it, else '0'; then steal_within ('': anywhere; else a steal takes only
--       from a holder that is a process of this cluster's directory: the caller's cluster
--       unless it is ops); then the caller's credential liveness check (the prelude's
--       cred_revoked: process hash, machine, generation; '' when none); then the holder's
--       quota of locks (0: none) and, on a cluster, the size of its index set after
--       serverdir's adds and how many names they added ('' '' on standalone
--       Redis/Sentinel: counted here); then the holder's liveness check (the prelude's
--       holder_stop: '' when the caller is bound to no cluster, else the holder's process
--       hash in that cluster's directory, or on a cluster "=<reason> <stopped_at_ms>"
--       when serverdir found it stopped); then the caller's wait_ms (0: it will not wait
--       for the lock); then, on a cluster, the holders serverdir found stopped in
--       steal_cluster's directory, and "+<holder>" for those it found in steal_within's.
-- A lock_held refusal of a caller that will wait (wait_ms > 0) records on the lock until
-- when someone may wait for it (field wait_until, ms): lock_release wakes waiters (a
-- token on <record>#q) only while that has not passed, so a release nobody waits for
-- writes no list.
-- A new grant stores its key's token. The grant is a capability: acquiring a lock one
-- already holds (the same holder name) succeeds only with the grant's lock_token
-- presented, so naming a holder never hands out its secret or extends its lease; a
-- client that presents a token of its own on the first acquire can retry it safely.
-- On standalone Redis/Sentinel a previous holder's index set and the directory's process
-- hash <prefix>{<cluster>}:proc:<holder> are derived here (one Redis holds them all).
-- Returns {'ok', now_ms, then per key: name, lock_seq, reacquired 0/1, stolen_from,
-- since_ms, expires_ms, lock_token} or {'lock_held', name, holder, since_ms, expires_ms,
-- now_ms, not_presented} (not_presented '1': the holder is the caller's, its grant's
-- lock_token was not presented) or {'lock_delayed', name, retry_after_ms} or
-- {'credential_revoked', why} or {'holder_stopped', reason, stopped_at_ms} (the
-- directory records the holder stopped: it may take no lock) or {'quota_exceeded', locks
-- held} (the grant would take the holder past its quota).
local holder = ARGV[1]
local ttl = tonumber(ARGV[2])
local delay = tonumber(ARGV[3])
local retain = tonumber(ARGV[4])
local steal_cluster = ARGV[5]
local steal_older = tonumber(ARGV[6])
local prefix = ARGV[7]
local n = tonumber(ARGV[8])
local indexed = #KEYS > 2 * n
local lock_ns = prefix .. 'lock:'
local steal_within = ARGV[9 + 2 * n] or ''
local revoked = cred_revoked(ARGV[10 + 2 * n] or '', ARGV[11 + 2 * n], ARGV[12 + 2 * n])
if revoked ~= '' then return {'credential_revoked', revoked} end
local dead = holder_stop(ARGV[16 + 2 * n] or '')
if dead then return dead end
local stopped, inside = {}, {}
local wait = tonumber(ARGV[17 + 2 * n] or '0') or 0
for i = 18 + 2 * n, #ARGV do
    if string.sub(ARGV[i], 1, 1) == '+' then
        inside[string.sub(ARGV[i], 2)] = true
    else
        stopped[ARGV[i]] = true
    end
end

local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now = math.floor(now_us / 1000)
local function fmt(x) return string.format('%d', x) end
-- A refusal that the caller will wait through: the lock records the wait (see above).
local function held(key, wait_until, ...)
    if wait > 0 and (tonumber(wait_until) or 0) < now + wait then
        redis.call('HSET', key, 'wait_until', fmt(now + wait))
    end
    return {'lock_held', ...}
end

local plan = {}
for i = 1, n do
    local name = lock_name(KEYS[i], lock_ns)
    local r = redis.call('HMGET', KEYS[i], 'holder', 'seq', 'since', 'expires', 'delay_until',
                         'token', 'wait_until')
    local cur = r[1] or ''
    local seq = tonumber(r[2]) or 0
    local since = tonumber(r[3]) or 0
    local expires = tonumber(r[4]) or 0
    local delay_until = tonumber(r[5]) or 0
    local prev = ''
    if cur ~= '' and expires > 0 and now >= expires then
        -- The lease ran out: the lock is free, lock-delay counted from the expiry.
        prev = cur
        cur = ''
        if delay > 0 and expires + delay > delay_until then delay_until = expires + delay end
    end
    local action = 'grant'
    local why = ''
    if cur == holder then
        if ARGV[8 + n + i] ~= '1' or r[6] ~= ARGV[8 + i] then
            return held(KEYS[i], r[7], name, cur, fmt(since), fmt(expires), fmt(now), '1')
        end
        action = 'again'
    elseif cur ~= '' then
        if steal_cluster ~= '' then
            if indexed then
                local st = redis.call('HGET', prefix .. '{' .. steal_cluster .. '}:proc:' .. cur, 'state')
                if st == 'stopped' then why = 'holder_stopped' end
            elseif stopped[cur] then
                why = 'holder_stopped'
            end
        end
        if why == '' and steal_older > 0 and now - since >= steal_older then why = 'held_too_long' end
        if why ~= '' and steal_within ~= '' then
            local known = inside[cur]
            if indexed then
                known = redis.call('EXISTS', prefix .. '{' .. steal_within .. '}:proc:' .. cur) == 1
            end
            if not known then why = '' end
        end
        if why == '' then
            return held(KEYS[i], r[7], name, cur, fmt(since), fmt(expires), fmt(now), '0')
        end
        prev = cur
    elseif delay_until > now then
        return {'lock_delayed', name, fmt(delay_until - now)}
    end
    -- The blob record remembers the lock_seq it was last saved and read under: a floor
    -- for the next grant that survives the loss of the lock record itself.
    local b = redis.call('HMGET', KEYS[n + i], 'lock_seq', 'read_lock_seq')
    local floor = math.max(seq, tonumber(b[1]) or 0, tonumber(b[2]) or 0)
    plan[i] = {name = name, action = action, prev = prev, why = why, seq = seq, floor = floor,
               since = since, token = r[6] or ''}
end

-- The holder's quota (docs/locks.md, "Quotas"): its index may not grow past it. Before
-- refusing, entries that no longer name a lock of the holder (leases run out, locks
-- taken) leave the index, up to 64 a call (a refusal at the limit costs 64 reads).
local quota = tonumber(ARGV[13 + 2 * n])
if quota > 0 then
    local after, added
    if indexed then
        local ix = KEYS[2 * n + 1]
        added = 0
        for i = 1, n do added = added + 1 - redis.call('SISMEMBER', ix, plan[i].name) end
        after = redis.call('SCARD', ix) + added
        if added > 0 and after > quota then
            for _, name in ipairs(redis.call('SRANDMEMBER', ix, 64)) do
                local h = redis.call('HMGET', lock_ns .. name, 'holder', 'expires')
                local e = tonumber(h[2]) or 0
                if h[1] ~= holder or (e > 0 and now >= e) then
                    after = after - redis.call('SREM', ix, name)
                end
            end
        end
    else
        after, added = tonumber(ARGV[14 + 2 * n]), tonumber(ARGV[15 + 2 * n])
    end
    if added > 0 and after > quota then return {'quota_exceeded', fmt(after - added)} end
end

local out = {'ok', fmt(now)}
local expires = 0
if ttl > 0 then expires = now + ttl end
for i = 1, n do
    local p = plan[i]
    local seq = p.seq
    local since = p.since
    local stolen = ''
    local token = p.token
    if p.action == 'again' then
        redis.call('HSET', KEYS[i], 'expires', fmt(expires), 'ttl', fmt(ttl))
    else
        token = ARGV[8 + i]
        seq = math.max(p.floor + 1, now_us)
        since = now
        if p.prev ~= '' then
            if indexed then redis.call('SREM', lock_ns .. p.prev .. '#h', p.name) end
            if p.why ~= '' then stolen = p.prev end
        end
        redis.call('HSET', KEYS[i], 'holder', holder, 'seq', fmt(seq), 'since', fmt(now),
                   'expires', fmt(expires), 'ttl', fmt(ttl), 'delay_until', '0',
                   'stolen_from', stolen, 'steal_reason', p.why, 'token', token)
    end
    if expires > 0 then
        redis.call('PEXPIRE', KEYS[i], ttl + retain)
    else
        redis.call('PERSIST', KEYS[i])
    end
    if indexed then redis.call('SADD', KEYS[2 * n + 1], p.name) end
    local again = '0'
    if p.action == 'again' then again = '1' end
    table.insert(out, p.name)
    table.insert(out, fmt(seq))
    table.insert(out, again)
    table.insert(out, stolen)
    table.insert(out, fmt(since))
    table.insert(out, fmt(expires))
    table.insert(out, token)
end
return out
