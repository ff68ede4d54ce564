-- Removes the master-list entry of a supervised server whose stop the directory recorded
-- (docs/master.md, "Supervised servers"). KEYS[1] = "<prefix>master:" (P);
-- ARGV: now_ms, "cluster/instance". The entry is the one the instance's last heartbeat
-- linked (P inst:<cluster/instance>), and only while its record still names the
-- instance. Returns 1 when an entry was removed, else 0.
local P = KEYS[1]
local inst = ARGV[2]
local addr = redis.call('GET', P .. 'inst:' .. inst)
if not addr then return 0 end
if redis.call('HGET', P .. 'c:in', addr) ~= inst then
  redis.call('DEL', P .. 'inst:' .. inst)
  return 0
end
master_remove(P, addr)
return 1
