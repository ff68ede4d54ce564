-- Removes a listed server at once (termination). serverdir has checked that the caller's
-- address is the server's own (the address key holds the IP).
-- KEYS[1] = "<prefix>master:" (P); ARGV: now_ms, addr, log_maxlen[, source]
-- source (a UDP protocol's shutdown, e.g. GoldSrc's b\n, which any address can forge):
-- the server is removed only when that protocol listed it (the record's 6th field); a
-- record naming no source is removed as before the field was checked. Without source
-- (REST, from the server's own TCP address) any entry of addr goes.
-- Errors: "not_listed", "other_protocol".
local P = KEYS[1]
local now = tonumber(ARGV[1])
local addr = ARGV[2]
local rec = redis.call('HGET', P .. 's', addr) or ''
local exp = string.match(rec, '^[^\31]*\31[^\31]*\31[^\31]*\31([^\31]*)\31')
if tonumber(exp or '0') <= now then
  return redis.error_reply('not_listed 0')
end
local want = ARGV[4]
if want then
  local src = select(6, string.match(rec, '^' .. string.rep('([^\31]*)\31', 6)))
  if src and src ~= '' and src ~= want then
    return redis.error_reply('other_protocol 0')
  end
end
master_remove(P, addr)
master_log(P, {addr}, ARGV[3])
return 1
