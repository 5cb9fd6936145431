-- dead_purge: forget dead-lettered tasks for good.
--
-- KEYS: 1 dead, 2 attempts, 3 errors, 4 due, 5 payload
-- ARGV: 1 mode: 'all' (then 2 = most to purge in this call) or 'ids' (then 2.. = ids)
-- Returns: how many dead tasks were purged.
-- Guarantees: only ids that are dead are touched; the payload is kept when the
-- id is due again (a client re-scheduled it). 'all' is bounded; the caller loops.
-- Nothing is written unless every key holds its type (HGFAULT otherwise).

local dead, attempts, errors, due, payload = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local bad = check_keys({ { dead, 'zset' }, { attempts, 'hash' }, { errors, 'hash' }, { due, 'zset' }, { payload, 'hash' } })
if bad then return bad end

local taken = take_dead(dead, attempts, errors)
for _, id in ipairs(taken) do
  if not redis.call('ZSCORE', due, id) then
    redis.call('HDEL', payload, id)
  end
end
return #taken
