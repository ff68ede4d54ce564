-- Removes a bounded number of servers whose listing ran out or whose getinfo probe went
-- unanswered (master_sweep in the prelude), so they leave the list even when nothing
-- else happens. Run every period by each serverdir copy's index thread (the walk of P s
-- is done once per period whichever copy comes first).
-- KEYS[1] = "<prefix>master:"; ARGV: now_ms, n, log_maxlen, period_ms. Returns the
-- removed addresses.
-- An unanswered getinfo removes only a server the Q3/DP protocol listed (the record's 6th
-- field "q3", or none in a record from before the field was checked): a late probe of an
-- entry REST or GoldSrc listed (those never answer a getinfo; serverdir does not probe
-- them, this covers a heartbeat of theirs racing the probe) is dropped, not acted on.
local P, now, n = KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2])
local late = redis.call('ZRANGEBYSCORE', P .. 'probe', '-inf', now, 'LIMIT', 0, n)
for _, a in ipairs(late) do
  local rec = redis.call('HGET', P .. 's', a)
  local src = rec and select(6, string.match(rec, '^' .. string.rep('([^\31]*)\31', 6)))
  if src and src ~= '' and src ~= 'q3' then redis.call('ZREM', P .. 'probe', a) end
end
return master_sweep(P, now, n, ARGV[3], tonumber(ARGV[4]))
