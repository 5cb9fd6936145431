-- recur_sync: keep a recurring schedule's next occurrences known, and re-arm it when its chain stopped.
--
-- KEYS: 1 recur, 2 due, 3 payload
-- ARGV: 1 name, 2 the definition the host computed from, 3 the armed id it
--       saw, 4 occurrence times after the armed one (ms, ascending, comma-separated)
-- Returns: 'armed' when it armed an occurrence, 'kept' when it only stored
--          the times, 'stale' when the schedule changed since the host read it.
-- Guarantees: changes nothing unless the definition and the armed id are
-- what the host read (a claim or another host got there first: the host
-- looks again next round); re-arms only when the armed occurrence is no
-- longer due (it was handed out when no later time was known, or a client
-- cancelled it), picking by the schedule's missed policy, so an occurrence
-- is never armed twice; nothing is written unless every key holds its type.

local recur, due, payload = KEYS[1], KEYS[2], KEYS[3]
local name, definition, seen = ARGV[1], ARGV[2], ARGV[3]
local bad = check_keys({ { recur, 'hash' }, { due, 'zset' }, { payload, 'hash' } })
if bad then return bad end
local f = redis.call('HMGET', recur, name, name .. ':armed', name .. ':missed', name .. ':payload')
if f[1] ~= definition or (f[2] or '') ~= seen then return 'stale' end

local times = parse_times(ARGV[4])
if f[2] and redis.call('ZSCORE', due, f[2]) then
  redis.call('HSET', recur, name .. ':then', ARGV[4])
  return 'kept'
end
local j = pick_next(times, now_ms(), f[3] or 'latest')
if not j then
  redis.call('HSET', recur, name .. ':then', ARGV[4])
  return 'kept'
end
arm(recur, due, payload, name, times, j, f[4])
return 'armed'
