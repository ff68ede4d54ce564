-- What a copy's index thread checks before each read of the change stream (docs/master.md,
-- "How a copy answers"), in one round trip: P life, the token of the list's life (drawn
-- by the first copy that loads a list without one: a Redis flushed, restarted without
-- persistence or replaced by an empty replica has none, or another); the first id of the
-- change stream P log ('' when it is empty or gone); and whether the stream still holds
-- the last entry the copy read (it is trimmed only from its oldest end: an entry at or
-- after the first one that is missing was lost, as when a replica that had not received
-- it took over, even if newer entries came since).
-- KEYS[1] = "<prefix>master:"; ARGV[1]: the id of the last entry read ("0-0": none).
-- Returns {life, first_id, has_last (0|1)}.
local P = KEYS[1]
local life = redis.call('GET', P .. 'life') or ''
local f = redis.call('XRANGE', P .. 'log', '-', '+', 'COUNT', 1)
local has = 0
if ARGV[1] ~= '0-0' and #redis.call('XRANGE', P .. 'log', ARGV[1], ARGV[1]) > 0 then has = 1 end
return {life, f[1] and f[1][1] or '', has}
