-- Removes a listed server at once (termination), only when asked from its own address.
-- KEYS[1] = "<prefix>master:" (P)
-- ARGV: now_ms, addr, ip
-- Errors: "not_listed", "address_mismatch".
local P = KEYS[1]
local now = tonumber(ARGV[1])
local addr, ip = ARGV[2], ARGV[3]
local exp = redis.call('ZSCORE', P .. 'exp', addr)
local sip = redis.call('HGET', P .. 'c:ip', addr)
if not exp or tonumber(exp) <= now or not sip then
  return redis.error_reply('not_listed 0')
end
if sip ~= ip then
  return redis.error_reply('address_mismatch 0')
end
master_remove(P, addr)
return 1
