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
-- the server as heartbeated; serverdir's master_index.c reads it back). The expiry lives
-- in the record only: the sweep finds what ran out by walking P s (master_sweep).
-- Per item, in order, before any write of that item: a listed server whose record
-- carries this challenge refuses it ("challenge_used"); a new server's group has room
-- ("too_many_servers <retry_ms>") and so has the list ("list_full"). Then the record is
-- stored (P s), a new server counted in its group (P n: group -> servers; master_remove
-- takes it off), it leaves the getinfo probe list (it answered) and a supervised server's
-- link P inst:<instance> is renewed.
-- The batch costs a fixed number of commands whatever its size (the records and the
-- group counts read with one HMGET each, written with one HSET each, one ZREM of the
-- probe list when there is one), plus one SET per supervised server: the items are
-- decided in Lua on what was read, each seeing the items before it.
-- Every listed address goes in one entry of the change stream P log (field a, addresses
-- separated by newlines), which every serverdir copy follows to keep its index current.
-- Returns one result per item: 1 (new), 0 (renewed) or an error text "code n".
local P = KEYS[1]
local now, ttl = tonumber(ARGV[1]), tonumber(ARGV[2])
local per_group, max_servers = tonumber(ARGV[3]), tonumber(ARGV[4])
local maxlen, copy, n = ARGV[5], ARGV[6], tonumber(ARGV[7])
local S, N = P .. 's', P .. 'n'
if n == 0 then return {} end
local find, sub = string.find, string.sub

-- what is stored now: the records and the counts of the groups the batch names
local addrs, groups, gseen, ng = {}, {}, {}, 0
for k = 1, n do
  local b = 4 + k * 4
  addrs[k] = ARGV[b]
  local g = ARGV[b + 1]
  if not gseen[g] then gseen[g] = true; ng = ng + 1; groups[ng] = g end
end
local recs = redis.call('HMGET', S, unpack(addrs))
local cur = {} -- addr -> record (or false), as the items before see it
for k = 1, n do cur[addrs[k]] = recs[k] end
local counts, gdirty = {}, {}
local gv = redis.call('HMGET', N, unpack(groups))
for k = 1, ng do counts[groups[k]] = tonumber(gv[k] or '0') end
local listed = nil -- servers in the list (HLEN, read once per batch when a new one comes)
local probing = redis.call('EXISTS', P .. 'probe') == 1

local out, logged, hs, unprobe, nl, nh, nu = {}, {}, {}, {}, 0, 0, 0
for k = 1, n do
  local b = 4 + k * 4
  local addr, group, inst, rec = ARGV[b], ARGV[b + 1], ARGV[b + 2], ARGV[b + 3]
  local e1 = find(rec, '\31', 1, true)
  local chal = e1 and sub(rec, 1, e1 - 1) or rec
  local old = cur[addr]
  local oc, og, oi, oe
  if old then
    -- the stored record's challenge, group, instance and expiry (its first 4 fields)
    local a = find(old, '\31', 1, true) or #old + 1
    local b2 = find(old, '\31', a + 1, true) or #old + 1
    local c = find(old, '\31', b2 + 1, true) or #old + 1
    local d = find(old, '\31', c + 1, true) or #old + 1
    oc, og, oi, oe = sub(old, 1, a - 1), sub(old, a + 1, b2 - 1), sub(old, b2 + 1, c - 1),
                     sub(old, c + 1, d - 1)
  end
  local live = old and (tonumber(oe) or 0) > now
  local res
  if live and oc == chal then
    res = 'challenge_used 0'
  elseif not old then
    if counts[group] >= per_group then
      res = 'too_many_servers ' .. ttl
    else
      if not listed then listed = redis.call('HLEN', S) end
      if listed >= max_servers then res = 'list_full 0' else listed = listed + 1 end
    end
  elseif og ~= group then
    -- the group rule changed (ipv4_group_bits): move the count
    counts[og] = tonumber(counts[og] or redis.call('HGET', N, og) or '0') - 1
    gdirty[og] = true
  end
  if not res then
    if oi and oi ~= '' and oi ~= inst and redis.call('GET', P .. 'inst:' .. oi) == addr then
      redis.call('DEL', P .. 'inst:' .. oi)
    end
    if not old or og ~= group then
      counts[group] = counts[group] + 1
      gdirty[group] = true
    end
    -- written once at the end (an address twice in the batch: HSET keeps the last)
    hs[nh + 1] = addr
    hs[nh + 2] = rec
    nh = nh + 2
    cur[addr] = rec
    if probing then nu = nu + 1; unprobe[nu] = addr end
    if inst ~= '' then redis.call('SET', P .. 'inst:' .. inst, addr, 'PX', ttl) end
    nl = nl + 1
    logged[nl] = addr
    res = live and 0 or 1
  end
  out[k] = res
end

if nh > 0 then redis.call('HSET', S, unpack(hs)) end
local gs, gdel = {}, {}
for g in pairs(gdirty) do
  if counts[g] > 0 then gs[#gs + 1] = g; gs[#gs + 1] = counts[g] else gdel[#gdel + 1] = g end
end
if #gs > 0 then redis.call('HSET', N, unpack(gs)) end
if #gdel > 0 then redis.call('HDEL', N, unpack(gdel)) end
if nu > 0 then redis.call('ZREM', P .. 'probe', unpack(unprobe)) end
master_log(P, logged, maxlen, copy)
return out
