-- Removes the master-list entry of a supervised server whose stop the directory recorded
-- (docs/master.md, "Supervised servers"). KEYS[1] = "<prefix>master:" (P);
-- ARGV: now_ms, "cluster/instance", log_maxlen. The entry is the one the instance's last
-- heartbeat linked (P inst:<cluster/instance>), and only while its record still names
-- the instance. Returns the removed entry's address, or 0.
local P = KEYS[1]
local inst = ARGV[2]
local addr = redis.call('GET', P .. 'inst:' .. inst)
if not addr then return 0 end
local rec = redis.call('HGET', P .. 's', addr)
local ri = rec and select(3, string.match(rec, '^([^\31]*)\31([^\31]*)\31([^\31]*)\31'))
if ri ~= inst then
  redis.call('DEL', P .. 'inst:' .. inst)
  return 0
end
master_remove(P, addr)
master_log(P, {addr}, ARGV[3])
return addr
