-- wrk script for bench/events_bench.sh: reads the live directory of one random machine
-- (GET .../processes?machine=m%012d), MACHINES machines.
local machines = tonumber(os.getenv("MACHINES") or "100")
-- DELAY_MS > 0: each connection pauses between requests, DELAY_MS on average (a fixed
-- offered load for the latency phase instead of a saturating closed loop). Each pause is
-- drawn from 0.5-1.5 x DELAY_MS: with one fixed pause the connections stay in step and
-- their requests arrive in bursts of all of them at once.
local delay_ms = tonumber(os.getenv("DELAY_MS") or "0")
if delay_ms > 0 then
  function delay() return math.random(math.floor(delay_ms / 2), math.floor(delay_ms * 3 / 2)) end
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
