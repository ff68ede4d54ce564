-- Rotates the credential keyring (http/cred.h) when due, and drops keys past their time.
-- KEYS[1]: the keyring hash, kid -> "created_ms retired_ms drop_ms\n<PEM>" (0: not yet).
-- ARGV: kid and PEM of a fresh key the caller offers, rotate_ms (age of the newest key at
-- which the fresh one replaces it), keep_ms (how long a retired key stays: the longest
-- lifetime of a credential it signed, plus the copies' reload period).
-- The fresh key is added only when no unretired key exists or the newest is rotate_ms
-- old by Redis time, retiring the others: of two copies racing, the second finds the
-- first's key new and its own offer is dropped. Returns the keyring (HGETALL).
local now = now_ms()
local rotate, keep = tonumber(ARGV[3]), tonumber(ARGV[4])
local all = redis.call('HGETALL', KEYS[1])
local newest = -1
local live = {}
for i = 1, #all, 2 do
  local c, r, d, pem = string.match(all[i + 1], '^(%d+) (%d+) (%d+)\n(.*)$')
  if not c or (tonumber(d) > 0 and tonumber(d) <= now) then
    redis.call('HDEL', KEYS[1], all[i])
  elseif tonumber(r) == 0 then
    live[#live + 1] = {all[i], c, pem}
    if tonumber(c) > newest then newest = tonumber(c) end
  end
end
if newest < 0 or newest + rotate <= now then
  for _, k in ipairs(live) do
    redis.call('HSET', KEYS[1], k[1],
               string.format('%s %d %d\n', k[2], now, now + keep) .. k[3])
  end
  redis.call('HSET', KEYS[1], ARGV[1], string.format('%d 0 0\n', now) .. ARGV[2])
end
return redis.call('HGETALL', KEYS[1])
