-- Accepts a master-list heartbeat (initiation and keepalive are the same message).
-- KEYS[1] = "<prefix>master:" (P)
-- ARGV: now_ms, bind, challenge, addr, group (the address's quota group: its IP, or
--       the /24 or /64 it is in), ttl_ms, servers_per_group, max_servers, game
--       (lowercased), then column/value pairs (m r t os p x pw d s pr gt f ip in j); j is
--       "addr \1 expires_at_ms \1 JSON", also the server's member of P jlist (the
--       list in address order with its JSON, read by the unfiltered walk without Lua).
-- Checks, in order, before any write: the challenge exists ("unknown_challenge"), was
-- issued to this address ("challenge_mismatch"), is unused ("challenge_used") and not
-- expired ("challenge_expired"); a new server's address has room ("too_many_servers
-- <retry_ms>", counted per quota group) and so has the list ("list_full"). Then marks the challenge used, lists
-- the server until now + ttl (P list, P exp, P g:<game>, P ip:<ip>, one field per column
-- hash P c:<column>), takes it off the getinfo probe list (P probe) and sweeps a few
-- expired servers.
-- Returns {is_new, expires_at_ms}.
local P = KEYS[1]
local now = tonumber(ARGV[1])
local bind, chal, addr, group = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local ttl, per_ip, max_servers = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local game = ARGV[9]

local ch = P .. 'ch:' .. chal
local c = redis.call('HMGET', ch, 'b', 'e', 'u')
if not c[1] then
  return redis.error_reply('unknown_challenge 0')
end
if c[1] ~= bind then
  return redis.error_reply('challenge_mismatch 0')
end
if c[3] == '1' then
  return redis.error_reply('challenge_used 0')
end
if tonumber(c[2]) < now then
  return redis.error_reply('challenge_expired 0')
end

local ipset = P .. 'ip:' .. group
local cur = redis.call('ZSCORE', P .. 'exp', addr)
local is_new = (not cur) or tonumber(cur) <= now
if is_new then
  if redis.call('ZCOUNT', ipset, '(' .. now, '+inf') >= per_ip then
    local first = redis.call('ZRANGEBYSCORE', ipset, '(' .. now, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
    return redis.error_reply('too_many_servers ' .. (tonumber(first[2]) - now))
  end
  if redis.call('ZCOUNT', P .. 'exp', '(' .. now, '+inf') >= max_servers then
    return redis.error_reply('list_full 0')
  end
end

redis.call('HSET', ch, 'u', 1)
redis.call('ZREM', P .. 'chn:' .. group, chal)
redis.call('ZREM', P .. 'probe', addr) -- it answered: not shutting down

local exp = now + ttl
local old_j = redis.call('HGET', P .. 'c:j', addr)
if old_j then
  redis.call('ZREM', P .. 'jlist', old_j)
end
local old_game = redis.call('HGET', P .. 'c:g', addr)
if old_game and old_game ~= game then
  redis.call('ZREM', P .. 'g:' .. old_game, addr)
end
redis.call('HSET', P .. 'c:ig', addr, group)
redis.call('HSET', P .. 'c:g', addr, game)
local member
for i = 10, #ARGV - 1, 2 do
  redis.call('HSET', P .. 'c:' .. ARGV[i], addr, ARGV[i + 1])
  if ARGV[i] == 'j' then member = ARGV[i + 1] end
end
redis.call('ZADD', P .. 'list', 0, addr)
redis.call('ZADD', P .. 'jlist', 0, member)
redis.call('ZADD', P .. 'g:' .. game, 0, addr)
redis.call('ZADD', P .. 'exp', exp, addr)
-- A supervised server's "cluster/instance" (in) finds its entry when that stop is
-- recorded (master_forget_instance.lua).
local inst = redis.call('HGET', P .. 'c:in', addr)
if inst and inst ~= '' then
  redis.call('SET', P .. 'inst:' .. inst, addr, 'PX', ttl)
end
redis.call('ZADD', ipset, exp, addr)
redis.call('PEXPIRE', ipset, ttl)

-- Lazy sweep: a bounded number of expired servers per call.
master_sweep(P, now, 32)
return {is_new and 1 or 0, exp}
