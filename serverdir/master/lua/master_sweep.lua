-- Removes a bounded number of servers whose listing ran out or whose getinfo probe went
-- unanswered (master_sweep in the prelude), so they leave the list even when nothing
-- else happens. Run every second by each serverdir copy's index thread.
-- KEYS[1] = "<prefix>master:"; ARGV: now_ms, n, log_maxlen. Returns the removed addresses.
return master_sweep(KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3])
