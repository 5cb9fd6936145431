-- events_open: create a type's (empty) events stream, so that a client that
-- waits for a task's end can tell "no event yet" from "this type has no events".
--
-- KEYS: 1 events
-- ARGV: none
-- Returns: 1 when it created the stream, 0 when it was there already.
-- Guarantees: an existing stream is left as it is (entries, groups); a key of
-- another type is an HGFAULT and nothing is written; the temporary consumer
-- group that MKSTREAM needs is destroyed in the same script, so nobody sees it.

local bad = check_keys({ { KEYS[1], 'stream' } })
if bad then return bad end
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('XGROUP', 'CREATE', KEYS[1], 'hourglass-events-open', '$', 'MKSTREAM')
redis.call('XGROUP', 'DESTROY', KEYS[1], 'hourglass-events-open')
return 1
