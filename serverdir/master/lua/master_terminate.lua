-- Removes a listed server at once (termination). serverdir has checked that the caller's
-- address is the server's own (the address key holds the IP).
-- KEYS[1] = "<prefix>master:" (P); ARGV: now_ms, addr, log_maxlen
-- Errors: "not_listed".
local P = KEYS[1]
local now = tonumber(ARGV[1])
local addr = ARGV[2]
local exp = redis.call('ZSCORE', P .. 'exp', addr)
if not exp or tonumber(exp) <= now then
  return redis.error_reply('not_listed 0')
end
master_remove(P, addr)
master_log(P, {addr}, ARGV[3])
return 1
