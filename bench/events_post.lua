-- wrk script for bench/events_bench.sh: each request POSTs one batch of BATCH events,
-- BATCH/2 instances each started and then stopped, with ids unique per run (RUN_ID),
-- thread and request. Machines are named m%012d (MACHINES of them) like the
-- pre-populated directory and redis-benchmark's __rand_int__.
local batch = tonumber(os.getenv("BATCH") or "20")
local machines = tonumber(os.getenv("MACHINES") or "100")
-- DELAY_MS > 0: each connection pauses between requests, DELAY_MS on average (a fixed
-- offered load for the latency phase instead of a saturating closed loop). Each pause is
-- drawn from 0.5-1.5 x DELAY_MS: with one fixed pause the connections stay in step and
-- their requests arrive in bursts of all of them at once.
local delay_ms = tonumber(os.getenv("DELAY_MS") or "0")
if delay_ms > 0 then
  function delay() return math.random(math.floor(delay_ms / 2), math.floor(delay_ms * 3 / 2)) end
end
local run = os.getenv("RUN_ID") or "r"
local headers = {["Content-Type"] = "application/json"}
local nthreads = 0
local counter = 0

function setup(thread)
  nthreads = nthreads + 1
  thread:set("tid", nthreads)
end

function init(args)
  math.randomseed(os.time() * 16 + tid)
end

function request()
  counter = counter + 1
  local parts = {}
  for k = 1, batch / 2 do
    local inst = string.format("%s-%d-%d-%d", run, tid, counter, k)
    local m = string.format("m%012d", (counter * 7 + k) % machines)
    parts[#parts + 1] = string.format(
      '{"id":"%s-s","type":"started","instance":"%s","machine":"%s","service":"zone","pid":%d,"ports":{"game":%d}}',
      inst, inst, m, 1000 + k, 27000 + k)
    parts[#parts + 1] = string.format(
      '{"id":"%s-x","type":"stopped","instance":"%s","machine":"%s","service":"zone","reason":"exited","code":0}',
      inst, inst, m)
  end
  return wrk.format("POST", nil, headers, '{"events":[' .. table.concat(parts, ",") .. ']}')
end
