-- Counts a lock refusal to a stopped holder in its process record (Redis Cluster only:
-- on standalone Redis / Sentinel the refusing script counts it itself), only while the
-- record exists: one that expired since serverdir read it is not made again (it would
-- live without its stopped ttl).
-- KEYS[1]: the holder's process hash. ARGV[1]: now, ms.
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('HINCRBY', KEYS[1], 'lock_refusals', 1)
  redis.call('HSET', KEYS[1], 'lock_refused_at_ms', ARGV[1])
end
return 1
