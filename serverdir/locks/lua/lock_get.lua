-- Inspect one lock (read only). KEYS[1]: the lock record.
-- Returns {state, holder, lock_seq, since_ms, expires_ms, delay_until_ms, now_ms,
-- stolen_from, steal_reason}; state is 'held', 'free' or 'unknown' (no record).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local r = redis.call('HMGET', KEYS[1], 'holder', 'seq', 'since', 'expires', 'delay_until',
                     'stolen_from', 'steal_reason')
if not r[2] then return {'unknown'} end
local cur = r[1] or ''
local expires = tonumber(r[4]) or 0
local delay_until = tonumber(r[5]) or 0
if cur ~= '' and expires > 0 and now >= expires then
    cur = ''
    local d = tonumber(ARGV[1])
    if d > 0 and expires + d > delay_until then delay_until = expires + d end
end
local state = 'held'
if cur == '' then state = 'free' end
return {state, cur, r[2], r[3] or '0', string.format('%d', expires),
        string.format('%d', delay_until), string.format('%d', now), r[6] or '', r[7] or ''}
