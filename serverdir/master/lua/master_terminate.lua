-- Removes a listed server at once (termination), only when asked from its own address.
-- KEYS[1] = "<prefix>master:" (P)
-- ARGV: now_ms, addr, ip
-- Errors: "not_listed", "address_mismatch".
local P = KEYS[1]
local now = tonumber(ARGV[1])
local addr, ip = ARGV[2], ARGV[3]
local COLS = {'ip', 'g', 'm', 'r', 't', 'os', 'p', 'x', 'pw', 'd', 's', 'pr', 'gt', 'f', 'j'}
local exp = redis.call('ZSCORE', P .. 'exp', addr)
local sip = redis.call('HGET', P .. 'c:ip', addr)
if not exp or tonumber(exp) <= now or not sip then
  return redis.error_reply('not_listed 0')
end
if sip ~= ip then
  return redis.error_reply('address_mismatch 0')
end
local g = redis.call('HGET', P .. 'c:g', addr)
local j = redis.call('HGET', P .. 'c:j', addr)
if j then redis.call('ZREM', P .. 'jlist', j) end
if g then redis.call('ZREM', P .. 'g:' .. g, addr) end
for _, col in ipairs(COLS) do redis.call('HDEL', P .. 'c:' .. col, addr) end
redis.call('ZREM', P .. 'list', addr)
redis.call('ZREM', P .. 'exp', addr)
redis.call('ZREM', P .. 'ip:' .. ip, addr)
return 1
