-- dead_requeue: give dead-lettered tasks a fresh start, due now.
--
-- KEYS: 1 dead, 2 attempts, 3 errors, 4 due
-- ARGV: 1 mode: 'all' (then 2 = most to move in this call) or 'ids' (then 2.. = ids)
-- Returns: how many dead tasks were requeued.
-- Guarantees: only ids that are dead move; attempts and errors are reset; the
-- payload stays. 'all' is bounded per call; the caller loops.

local dead, attempts, errors, due = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local t = redis.call('TIME')
local now = string.format('%.0f', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))

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
    redis.call('ZADD', due, now, id)
    n = n + 1
  end
end
return n
