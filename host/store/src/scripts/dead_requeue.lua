-- dead_requeue: give dead-lettered tasks a fresh start, due now.
--
-- KEYS: 1 dead, 2 attempts, 3 errors, 4 due
-- ARGV: 1 mode: 'all' (then 2 = most to move in this call) or 'ids' (then 2.. = ids)
-- Returns: how many dead tasks were requeued.
-- Guarantees: only ids that are dead move; attempts and errors are reset; the
-- payload stays. 'all' is bounded per call; the caller loops. Nothing is
-- written unless every key holds its type (HGFAULT otherwise).

local dead, attempts, errors, due = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local bad = check_keys({ { dead, 'zset' }, { attempts, 'hash' }, { errors, 'hash' }, { due, 'zset' } })
if bad then return bad end
local now = string.format('%.0f', now_ms())

local taken = take_dead(dead, attempts, errors)
local zpairs = {}
for _, id in ipairs(taken) do
  zpairs[#zpairs + 1] = now
  zpairs[#zpairs + 1] = id
end
each_chunk(zpairs, function(...) redis.call('ZADD', due, ...) end)
return #taken
