-- Removes a listed server at once (termination), only when asked from its own address.
-- KEYS[1] = "<prefix>master:"
-- ARGV: now_ms, addr, ip
-- Errors: "not_listed", "address_mismatch".
local P = KEYS[1]
local now = tonumber(ARGV[1])
local addr, ip = ARGV[2], ARGV[3]
local key = P .. 's:' .. addr
local s = redis.call('HMGET', key, 'ip', 'e', 'g')
if not s[1] or tonumber(s[2]) <= now then
  return redis.error_reply('not_listed 0')
end
if s[1] ~= ip then
  return redis.error_reply('address_mismatch 0')
end
redis.call('DEL', key)
redis.call('ZREM', P .. 'list', addr)
redis.call('ZREM', P .. 'exp', addr)
redis.call('ZREM', P .. 'ip:' .. ip, addr)
if s[3] then
  redis.call('ZREM', P .. 'g:' .. s[3], addr)
end
return 1
