-- wrk script for bench/events_bench.sh: reads the live directory of one random machine
-- (GET .../processes?machine=m%012d), MACHINES machines.
local machines = tonumber(os.getenv("MACHINES") or "100")
-- DELAY_MS > 0: each connection pauses that long between requests (a fixed offered load
-- for the latency phase instead of a saturating closed loop).
local delay_ms = tonumber(os.getenv("DELAY_MS") or "0")
if delay_ms > 0 then
  function delay() return delay_ms end
end
local base = nil

function init(args)
  math.randomseed(os.time() + (tonumber(tostring({}):match("0x(%x+)"), 16) or 0) % 1000)
  base = wrk.path
end

function request()
  local m = string.format("m%012d", math.random(0, machines - 1))
  return wrk.format("GET", base .. "?machine=" .. m)
end
