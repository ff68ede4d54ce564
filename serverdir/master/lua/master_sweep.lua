-- The periodic sweep of one serverdir copy's first UDP listener (every second): removes
-- a bounded number of servers whose listing ran out or whose getinfo probe went
-- unanswered (master_sweep in the prelude), so they leave the list even when no
-- heartbeat or filtered query comes to sweep them. KEYS[1] = "<prefix>master:";
-- ARGV: now_ms, n. Returns how many probes are still pending.
master_sweep(KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]))
return redis.call('ZCARD', KEYS[1] .. 'probe')
