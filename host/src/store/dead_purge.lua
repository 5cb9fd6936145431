-- dead_purge: forget dead-lettered tasks for good.
--
-- KEYS: 1 dead, 2 attempts, 3 errors, 4 due, 5 payload
-- ARGV: 1 mode: 'all' (then 2 = most to purge in this call) or 'ids' (then 2.. = ids)
-- Returns: how many dead tasks were purged.
-- Guarantees: only ids that are dead are touched; the payload is kept when the
-- id is due again (a client re-scheduled it). 'all' is bounded; the caller loops.

local dead, attempts, errors, due, payload = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]

local ids
if ARGV[1] == 'all' then
  ids = redis.call('ZRANGE', dead, 0, tonumber(ARGV[2]) - 1)
else
  ids = {}
  for i = 2, #ARGV do ids[#ids + 1] = ARGV[i] end
end

local n = 0
for _, id in ipairs(ids) do
  if redis.call('ZREM', dead, id) == 1 then
    redis.call('HDEL', attempts, id)
    redis.call('HDEL', errors, id)
    if not redis.call('ZSCORE', due, id) then
      redis.call('HDEL', payload, id)
    end
    n = n + 1
  end
end
return n
