-- A page of the locks one holder holds (read, plus cleanup of its index set).
-- KEYS[1]: the holder's index set. ARGV: holder, page size, cursor ('0' to start).
-- Walks the set with SSCAN steps (at most 8 of about 128 names), each step's names in
-- order, until the page is full or the walk complete. A page that fills inside a step
-- ends with the cursor '<sscan cursor>-<last name>': the same step is read again and
-- resumed after that name, so no name is skipped. Entries whose record no longer names
-- the holder (expired, stolen, forced, lost) are removed from the set.
-- Returns {cursor ('0' when complete), name, lock_seq, since_ms, expires_ms, ...}.
local holder = ARGV[1]
local max = tonumber(ARGV[2])
local cursor, after = string.match(ARGV[3], '^(%d+)%-(.+)$')
if not cursor then cursor, after = ARGV[3], nil end
local lock_ns = string.sub(KEYS[1], 1, #KEYS[1] - #holder - 2)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {'0'}
local n = 0
for _ = 1, 8 do
  local r = redis.call('SSCAN', KEYS[1], cursor, 'COUNT', 128)
  local names = r[2]
  table.sort(names)
  for _, name in ipairs(names) do
    if not after or name > after then
      if n >= max then
        out[1] = cursor .. '-' .. after
        return out
      end
      local h = redis.call('HMGET', lock_ns .. name, 'holder', 'seq', 'since', 'expires')
      local expires = tonumber(h[4]) or 0
      if h[1] ~= holder or (expires > 0 and now >= expires) then
        redis.call('SREM', KEYS[1], name)
      else
        out[#out + 1] = name
        out[#out + 1] = h[2]
        out[#out + 1] = h[3]
        out[#out + 1] = string.format('%d', expires)
        n = n + 1
      end
      after = name
    end
  end
  after = nil
  cursor = r[1]
  if cursor == '0' or n >= max then break end
end
out[1] = cursor
return out
