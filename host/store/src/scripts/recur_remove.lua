-- recur_remove: delete a recurring schedule of one type.
--
-- KEYS: 1 recur, 2 due, 3 payload
-- ARGV: 1 name
-- Returns: 1 when the schedule existed, 0 when it did not.
-- Guarantees: its armed occurrence leaves `due` with it (a running one
-- finishes); occurrences that already ran, or are being retried, are
-- ordinary tasks and stay; nothing is written unless every key holds its
-- type (HGFAULT otherwise).

local recur, due, payload = KEYS[1], KEYS[2], KEYS[3]
local name = ARGV[1]
local bad = check_keys({ { recur, 'hash' }, { due, 'zset' }, { payload, 'hash' } })
if bad then return bad end
if redis.call('HEXISTS', recur, name) == 0 then return 0 end
local armed = redis.call('HGET', recur, name .. ':armed')
if armed and redis.call('ZREM', due, armed) == 1 then
  redis.call('HDEL', payload, armed)
end
redis.call('HDEL', recur, name, name .. ':missed', name .. ':payload', name .. ':armed', name .. ':then')
return 1
