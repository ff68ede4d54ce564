-- Removes the entries a drain of the cluster's lock hand-off list has handled
-- (directory.c, drain_unlocks): each its first occurrence, so an entry pushed again
-- meanwhile (the same stop reported twice) stays for the next drain, and another serverdir
-- copy draining the same entries removes nothing twice.
-- KEYS[1]: <base>unlock; ARGV: the entries. Returns how many were removed.
local n = 0
for i = 1, #ARGV do
  n = n + redis.call('LREM', KEYS[1], 1, ARGV[i])
end
return n
