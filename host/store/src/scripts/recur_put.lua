-- recur_put: create or change a recurring schedule of one type, and arm its first occurrence.
--
-- KEYS: 1 recur, 2 due, 3 payload
-- ARGV: 1 name, 2 definition (the host's text of it: rule, payload, policy, source),
--       3 missed policy (latest | all | skip), 4 payload, 5 occurrence times (ms,
--       ascending, comma-separated: the first one is armed, the rest kept in `then`)
-- Returns: 1 when the schedule was created or changed, 0 when it was already so.
-- Guarantees: idempotent (every host may put the same definition); a changed
-- definition takes its old armed occurrence out of `due` (unless it is
-- running: that run finishes) and arms the new one, in one atomic step, so
-- a schedule never has two armed occurrences; nothing is written unless
-- every key holds its type (HGFAULT otherwise).

local recur, due, payload = KEYS[1], KEYS[2], KEYS[3]
local name, definition, missed, body = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local bad = check_keys({ { recur, 'hash' }, { due, 'zset' }, { payload, 'hash' } })
if bad then return bad end
if redis.call('HGET', recur, name) == definition then return 0 end

local times = parse_times(ARGV[5])
local old = redis.call('HGET', recur, name .. ':armed')
if old and redis.call('ZREM', due, old) == 1 then
  redis.call('HDEL', payload, old)
end
redis.call('HSET', recur, name, definition, name .. ':missed', missed, name .. ':payload', body)
if times[1] then
  arm(recur, due, payload, name, times, 1, body)
else
  redis.call('HDEL', recur, name .. ':armed')
  redis.call('HSET', recur, name .. ':then', '')
end
return 1
