-- Save a blob, fenced (docs/locks.md). KEYS[1]: <prefix>blob:<name>; KEYS[2]: its lock
-- record; KEYS[3] (standalone Redis/Sentinel only): the byte counter of the saver's
-- quota scope, <prefix>quota:blob:<scope>.
-- ARGV: lock_seq, lock_token, blob_seq, data, holder prefix ('' for any holder), the
-- exact holder an instance credential saves as ('' for any: docs/locks.md), the
-- caller's credential liveness check (the prelude's cred_revoked: process hash,
-- machine, generation; '' when none), the saver's quota scope ('' : not counted), its
-- blob_bytes quota (0: none), on a Redis Cluster the scope's bytes as serverdir read
-- them ('' when KEYS[3] is given), then the process hash prefix of the directory to ask
-- whether the key's holder is stopped ("<prefix>{<cluster>}:proc:", the caller's cluster,
-- standalone Redis/Sentinel only; '': not checked).
-- Accepted only if lock_seq and lock_token are those of the key's current grant (held,
-- lease not run out), its holder starts with the holder prefix (and is the exact holder
-- when one is given), blob_seq is greater than the stored one by at most
-- SD.BLOB_SEQ_STEP_MAX and the scope's bytes stay within its quota; otherwise nothing
-- changes.
-- Bytes are counted per scope (docs/operations.md, "Quotas"): the record keeps the scope
-- its data is counted for (quota_scope); a save counts its data for the saver's scope
-- and takes the old data off the scope that had it. With KEYS[3] the counters move here;
-- on a cluster they live in other slots and serverdir moves them after the save.
-- Returns {'ok', previous blob_seq, bytes added to the saver's scope, previous scope,
-- its bytes taken off} (the last two '' and 0 when it is the saver's), {'fenced'},
-- {'not_yours'} (the holder prefix), {'stale_seq', stored}, {'seq_jump', stored},
-- {'quota_exceeded', the scope's bytes}, {'credential_revoked', why} or {'holder_stopped',
-- reason, stopped_at_ms, holder} (the directory records the holder stopped: its locks
-- were kept, release_on_stop false, but it saves nothing).
local revoked = cred_revoked(ARGV[7] or '', ARGV[8], ARGV[9])
if revoked ~= '' then return {'credential_revoked', revoked} end
local now = now_ms()
local l = redis.call('HMGET', KEYS[2], 'holder', 'seq', 'expires', 'token')
local holder = l[1] or ''
local expires = tonumber(l[3]) or 0
if holder == '' or (expires > 0 and now >= expires) or l[2] ~= ARGV[1] or
   (l[4] or '') ~= ARGV[2] then
    return {'fenced'}
end
if string.sub(holder, 1, #ARGV[5]) ~= ARGV[5] then return {'not_yours'} end
local exact = ARGV[6] or ''
if exact ~= '' and holder ~= exact then return {'not_yours'} end
local procs = ARGV[13] or ''
local dead = procs ~= '' and holder_stop(procs .. holder)
if dead then
    dead[4] = holder
    return dead
end
local b = redis.call('HMGET', KEYS[1], 'seq', 'quota_scope')
local stored = b[1] or '0'
local want = tonumber(ARGV[3])
if want <= tonumber(stored) then return {'stale_seq', stored} end
if want - tonumber(stored) > SD.BLOB_SEQ_STEP_MAX then return {'seq_jump', stored} end

local scope, limit = ARGV[10], tonumber(ARGV[11])
local old_scope, old_bytes = b[2] or '', redis.call('HSTRLEN', KEYS[1], 'data')
local add = #ARGV[4]
if old_scope == scope then
    add = add - old_bytes
    old_scope, old_bytes = '', 0
elseif old_scope == '' then
    old_bytes = 0 -- saved before bytes were counted: counted for no scope
end
if scope ~= '' and limit > 0 and add > 0 then
    local used = tonumber(KEYS[3] and redis.call('GET', KEYS[3]) or ARGV[12]) or 0
    if used + add > limit then return {'quota_exceeded', string.format('%d', used)} end
end
redis.call('HSET', KEYS[1], 'data', ARGV[4], 'seq', ARGV[3], 'lock_seq', ARGV[1],
           'saved_ms', string.format('%d', now), 'quota_scope', scope)
if KEYS[3] then
    if add ~= 0 and redis.call('INCRBY', KEYS[3], add) < 0 then redis.call('SET', KEYS[3], '0') end
    if old_bytes > 0 then
        -- the previous scope's counter: one Redis holds them all here
        local k = string.sub(KEYS[3], 1, #KEYS[3] - #scope) .. old_scope
        if redis.call('DECRBY', k, old_bytes) < 0 then redis.call('SET', k, '0') end
    end
end
return {'ok', stored, string.format('%d', add), old_scope, string.format('%d', old_bytes)}
