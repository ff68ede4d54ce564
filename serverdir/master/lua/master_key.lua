-- The secret every serverdir copy derives master-list challenges from (docs/master.md,
-- "Challenges"), rotated: KEYS[1] = "<prefix>master:" (P); ARGV: now_ms, rotate_ms,
-- fresh (64 hex digits drawn by the caller), then optionally the k, p and t the caller
-- holds. P key holds k (current), p (previous) and t (when k was made). When there is no
-- key and the caller holds one (Redis lost it: flushed, restarted without persistence,
-- replaced by an empty replica), the caller's is put back, so the challenges every copy
-- issued with it still verify; when there is none to put back, or k is older than
-- rotate_ms, k moves to p and fresh becomes k. Returns {k, p, t}.
local P = KEYS[1]
local now, rotate, fresh = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
local c = redis.call('HMGET', P .. 'key', 'k', 'p', 't')
if not c[1] and ARGV[4] and ARGV[4] ~= '' and ARGV[5] and ARGV[6] then
  redis.call('HSET', P .. 'key', 'k', ARGV[4], 'p', ARGV[5], 't', ARGV[6])
  c = {ARGV[4], ARGV[5], ARGV[6]}
end
if not c[1] or not c[3] or tonumber(c[3]) + rotate <= now then
  local prev = c[1] or fresh
  redis.call('HSET', P .. 'key', 'k', fresh, 'p', prev, 't', now)
  return {fresh, prev, tostring(now)}
end
return {c[1], c[2] or c[1], c[3]}
