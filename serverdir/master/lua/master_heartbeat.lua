-- Accepts a batch of master-list heartbeats (initiation and keepalive are the same
-- message). The challenges were checked by serverdir (stateless: an HMAC of the address
-- and the issue time, docs/master.md "Challenges"); what only Redis can tell is checked
-- here: single use and the quotas.
-- KEYS[1] = "<prefix>master:" (P)
-- ARGV: now_ms, ttl_ms, servers_per_group, max_servers, log_maxlen, copy (the id of the
-- serverdir copy writing: it applies what is accepted to its own index and skips the
-- stream entry that names it), n, then n items of 4:
--   addr, group (the address's quota group: its IP, or the /24 or /64 it is in),
--   instance ("cluster/instance" of a supervised server, or ""), record.
-- A record is "challenge \31 group \31 instance \31 expires_at_ms \31 ..." (the rest is
-- the server as heartbeated; serverdir's master_index.c reads it back).
-- Per item, before any write of that item: a listed server whose record carries this
-- challenge refuses it ("challenge_used"); a new server's group has room
-- ("too_many_servers <retry_ms>") and so has the list ("list_full"). Then the record is
-- stored (P s), its expiry indexed (P exp), a new server counted in its group (P n:
-- group -> servers; master_remove takes it off), it leaves the getinfo probe list (it
-- answered) and a supervised server's link P inst:<instance> is renewed. A keepalive
-- costs three commands: HGET, HSET, ZADD.
-- Every listed address goes in one entry of the change stream P log (field a, addresses
-- separated by newlines), which every serverdir copy follows to keep its index current.
-- Returns one result per item: 1 (new), 0 (renewed) or an error text "code n".
local P = KEYS[1]
local now, ttl = tonumber(ARGV[1]), tonumber(ARGV[2])
local per_group, max_servers = tonumber(ARGV[3]), tonumber(ARGV[4])
local maxlen, copy, n = ARGV[5], ARGV[6], tonumber(ARGV[7])
local S, EXP, N = P .. 's', P .. 'exp', P .. 'n'
local probing = redis.call('EXISTS', P .. 'probe') == 1
local out, logged = {}, {}
local listed = nil -- servers in the list (ZCARD, read once per batch when a new one comes)
local exp = now + ttl

for k = 0, n - 1 do
  local b = 8 + k * 4
  local addr, group, inst, rec = ARGV[b], ARGV[b + 1], ARGV[b + 2], ARGV[b + 3]
  local chal = string.match(rec, '^([^\31]*)\31')
  local old = redis.call('HGET', S, addr)
  local oc, og, oi, oe
  if old then
    oc, og, oi, oe = string.match(old, '^([^\31]*)\31([^\31]*)\31([^\31]*)\31([^\31]*)\31')
  end
  local live = old and tonumber(oe or '0') > now
  local res
  if live and oc == chal then
    res = 'challenge_used 0'
  elseif not old then
    if tonumber(redis.call('HGET', N, group) or '0') >= per_group then
      res = 'too_many_servers ' .. ttl
    else
      if not listed then listed = redis.call('ZCARD', EXP) end
      if listed >= max_servers then res = 'list_full 0' else listed = listed + 1 end
    end
  elseif og ~= group then
    -- the group rule changed (ipv4_group_bits): move the count
    redis.call('HINCRBY', N, og, -1)
  end
  if not res then
    if oi and oi ~= '' and oi ~= inst and redis.call('GET', P .. 'inst:' .. oi) == addr then
      redis.call('DEL', P .. 'inst:' .. oi)
    end
    if not old or og ~= group then redis.call('HINCRBY', N, group, 1) end
    redis.call('HSET', S, addr, rec)
    redis.call('ZADD', EXP, exp, addr)
    if probing then redis.call('ZREM', P .. 'probe', addr) end
    if inst ~= '' then redis.call('SET', P .. 'inst:' .. inst, addr, 'PX', ttl) end
    logged[#logged + 1] = addr
    res = live and 0 or 1
  end
  out[#out + 1] = res
end
master_log(P, logged, maxlen, copy)
return out
