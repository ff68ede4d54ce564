-- Issues a master-list challenge bound to an address.
-- KEYS[1] = "<prefix>master:"
-- ARGV: now_ms, bind, ip, challenge, ttl_ms, max_outstanding, keep_ms, probe_ms
-- probe_ms > 0 (the Q3/DP getinfo): when bind is a listed server, it is put on the probe
-- list P probe with the deadline now + probe_ms (unless already there: a second heartbeat
-- keeps the first deadline); a heartbeat that answers a challenge takes it off, the sweep
-- removes the server once the deadline passes (docs/master.md, "Shutdown").
-- The challenge hash lives keep_ms past its expiry so that a late or second use is told
-- apart from an unknown challenge. Errors: "too_many_challenges <retry_ms>",
-- "challenge_collision".
local P = KEYS[1]
local now = tonumber(ARGV[1])
local bind, ip, chal = ARGV[2], ARGV[3], ARGV[4]
local ttl, maxn, keep = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local probe = tonumber(ARGV[8])

local chn = P .. 'chn:' .. ip
local ch = P .. 'ch:' .. chal
if redis.call('EXISTS', ch) == 1 then
  return redis.error_reply('challenge_collision 0')
end
if redis.call('ZCOUNT', chn, '(' .. now, '+inf') >= maxn then
  local first = redis.call('ZRANGEBYSCORE', chn, '(' .. now, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
  local retry = tonumber(first[2]) - now
  return redis.error_reply('too_many_challenges ' .. retry)
end
redis.call('ZREMRANGEBYSCORE', chn, '-inf', now)
local exp = now + ttl
redis.call('HSET', ch, 'b', bind, 'i', ip, 'e', exp, 'u', 0)
redis.call('PEXPIRE', ch, ttl + keep)
redis.call('ZADD', chn, exp, chal)
redis.call('PEXPIRE', chn, ttl)
if probe > 0 then
  local listed = redis.call('ZSCORE', P .. 'exp', bind)
  if listed and tonumber(listed) > now then
    redis.call('ZADD', P .. 'probe', 'NX', now + probe, bind)
  end
end
return exp
