-- The secret every serverdir copy derives master-list challenges from (docs/master.md,
-- "Challenges"), rotated: KEYS[1] = "<prefix>master:" (P); ARGV: now_ms, rotate_ms,
-- fresh (64 hex digits drawn by the caller). P key holds k (current), p (previous) and
-- t (when k was made). When there is no key, or k is older than rotate_ms, k moves to p
-- and fresh becomes k. Returns {k, p, t}.
local P = KEYS[1]
local now, rotate, fresh = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
local c = redis.call('HMGET', P .. 'key', 'k', 'p', 't')
if not c[1] or not c[3] or tonumber(c[3]) + rotate <= now then
  local prev = c[1] or fresh
  redis.call('HSET', P .. 'key', 'k', fresh, 'p', prev, 't', now)
  return {fresh, prev, tostring(now)}
end
return {c[1], c[2] or c[1], c[3]}
