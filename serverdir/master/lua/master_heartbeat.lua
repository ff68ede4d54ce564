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

-- what is stored now: the records and the counts of the groups the batch names
local addrs, groups, gseen = {}, {}, {}
for k = 0, n - 1 do
  local b = 8 + k * 4
  addrs[#addrs + 1] = ARGV[b]
  local g = ARGV[b + 1]
  if not gseen[g] then gseen[g] = true; groups[#groups + 1] = g end
end
local recs = redis.call('HMGET', S, unpack(addrs))
local cur = {} -- addr -> record (or false), as the items before see it
for i, a in ipairs(addrs) do
  if cur[a] == nil then cur[a] = recs[i] end
end
local counts, gdirty = {}, {}
local gv = redis.call('HMGET', N, unpack(groups))
for i, g in ipairs(groups) do counts[g] = tonumber(gv[i] or '0') end
local listed = nil -- servers in the list (HLEN, read once per batch when a new one comes)
local probing = redis.call('EXISTS', P .. 'probe') == 1

local out, logged, written, order, unprobe = {}, {}, {}, {}, {}
for k = 0, n - 1 do
  local b = 8 + k * 4
  local addr, group, inst, rec = ARGV[b], ARGV[b + 1], ARGV[b + 2], ARGV[b + 3]
  local chal = string.match(rec, '^([^\31]*)\31')
  local old = cur[addr]
  local oc, og, oi, oe
  if old then
    oc, og, oi, oe = string.match(old, '^([^\31]*)\31([^\31]*)\31([^\31]*)\31([^\31]*)\31')
  end
  local live = old and tonumber(oe or '0') > now
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
    if not written[addr] then order[#order + 1] = addr end
    written[addr] = rec
    cur[addr] = rec
    if probing then unprobe[#unprobe + 1] = addr end
    if inst ~= '' then redis.call('SET', P .. 'inst:' .. inst, addr, 'PX', ttl) end
    logged[#logged + 1] = addr
    res = live and 0 or 1
  end
  out[#out + 1] = res
end

if #order > 0 then
  local hs = {}
  for _, a in ipairs(order) do hs[#hs + 1] = a; hs[#hs + 1] = written[a] end
  redis.call('HSET', S, unpack(hs))
end
local gs, gdel = {}, {}
for g in pairs(gdirty) do
  if counts[g] > 0 then gs[#gs + 1] = g; gs[#gs + 1] = counts[g] else gdel[#gdel + 1] = g end
end
if #gs > 0 then redis.call('HSET', N, unpack(gs)) end
if #gdel > 0 then redis.call('HDEL', N, unpack(gdel)) end
if #unprobe > 0 then redis.call('ZREM', P .. 'probe', unpack(unprobe)) end
master_log(P, logged, maxlen, copy)
return out
