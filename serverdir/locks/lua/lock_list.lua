-- The locks one holder holds (read, plus cleanup of its index set). KEYS[1]: the
-- holder's index set. ARGV: holder, max entries.
-- Entries whose record no longer names the holder (expired, stolen, forced, lost) are
-- removed from the set. Returns {name, lock_seq, since_ms, expires_ms, ...} sorted by name.
local holder = ARGV[1]
local max = tonumber(ARGV[2])
local lock_ns = string.sub(KEYS[1], 1, #KEYS[1] - #holder - 2)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local names = redis.call('SMEMBERS', KEYS[1])
table.sort(names)
local out = {}
for _, name in ipairs(names) do
    local r = redis.call('HMGET', lock_ns .. name, 'holder', 'seq', 'since', 'expires')
    local expires = tonumber(r[4]) or 0
    if r[1] ~= holder or (expires > 0 and now >= expires) then
        redis.call('SREM', KEYS[1], name)
    elseif #out < max * 4 then
        table.insert(out, name)
        table.insert(out, r[2])
        table.insert(out, r[3])
        table.insert(out, string.format('%d', expires))
    end
end
return out
