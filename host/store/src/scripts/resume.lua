-- resume: let hosts claim tasks of a paused type again.
--
-- KEYS: 1 paused, 2 due
-- ARGV: none
-- Returns: 1 when the type was paused, 0 when it was not.
-- Guarantees: the claims resume at once: ZINCRBY by 0 of the oldest due
-- task changes nothing but raises the keyspace notification that wakes every
-- host's claim loop (hosts that poll see it within their poll interval);
-- nothing is written unless both keys hold their types (HGFAULT otherwise).

local bad = check_keys({ { KEYS[1], 'string' }, { KEYS[2], 'zset' } })
if bad then return bad end
if redis.call('DEL', KEYS[1]) == 0 then return 0 end
local first = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
if first then redis.call('ZINCRBY', KEYS[2], 0, first) end
return 1
