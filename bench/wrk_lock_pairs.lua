-- A second way to drive serverdir's lock pairs (bench/README.md, "## locks"): wrk (the
-- Debian package) runs PUT /v1/locks/K then DELETE /v1/locks/K?holder&lock_seq with the
-- answer's lock_token, the same pair bench/locks_load's sd-lock mode runs, so the two
-- generators' rates can be set side by side.
--   wrk -t2 -c64 -d4 -s bench/wrk_lock_pairs.lua http://127.0.0.1:PORT -- TOKEN
-- Each wrk thread has its own Lua state: an acquire's answer queues its release, which
-- the same connection sends next (wrk asks for a connection's next request right after
-- taking its answer). A thread's keys cycle through 1024 names, so no key is taken twice
-- at once by its at most 32 connections. Prints pairs, pairs/s and failed requests.
local threads = {}
local nthreads = 0

function setup(thread) -- runs in the main Lua state: numbers each thread's state
  nthreads = nthreads + 1
  thread:set("tid", nthreads)
  table.insert(threads, thread)
end

local token, hdr_put, n, releases = nil, nil, 0, {}
pairs_done, failed = 0, 0

function init(args)
  token = args[1]
  hdr_put = {["Authorization"] = "Bearer " .. token, ["Content-Type"] = "application/json"}
end

function request()
  local r = table.remove(releases)
  if r then return r end
  n = n + 1
  local key = "wrk-" .. tid .. "-" .. (n % 1024)
  return wrk.format("PUT", "/v1/locks/" .. key, hdr_put, '{"holder":"wrk-h' .. tid .. '"}')
end

function response(status, headers, body)
  if status ~= 200 then
    failed = failed + 1
    return
  end
  local name = body:match('"key":"([^"]+)"')
  local tok = body:match('"lock_token":"([^"]+)"')
  if tok and name then
    local seq = body:match('"lock_seq":(%d+)')
    table.insert(releases, wrk.format("DELETE",
      "/v1/locks/" .. name .. "?holder=wrk-h" .. tid .. "&lock_seq=" .. seq,
      {["Authorization"] = "Bearer " .. token, ["Lock-Token"] = tok}))
  else
    pairs_done = pairs_done + 1
  end
end

function done(summary, latency, requests)
  local p, f = 0, 0
  for _, t in ipairs(threads) do
    p = p + t:get("pairs_done")
    f = f + t:get("failed")
  end
  local secs = summary.duration / 1e6
  io.write(string.format("wrk lock pairs=%d rate=%.0f failed=%d secs=%.2f\n", p, p / secs, f, secs))
end
