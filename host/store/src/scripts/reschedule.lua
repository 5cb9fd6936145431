-- reschedule: move a scheduled task to a new due time (the dashboard's "run now" and "postpone").
--
-- KEYS: 1 due
-- ARGV: 1 id, 2 mode: 'now' (due now) or 'postpone' (then 3 = ms added to the
--       later of its due time and now)
-- Returns: the new due time in ms (a string), or false when the id is not in `due`.
-- Guarantees: only a task that is in `due` moves (ZADD XX): a task that is
-- running, dead or gone is never re-created, and its payload is not touched.
-- Nothing is written unless `due` is a sorted set (HGFAULT otherwise).

local due = KEYS[1]
local bad = check_keys({ { due, 'zset' } })
if bad then return bad end
local id, mode = ARGV[1], ARGV[2]
local current = redis.call('ZSCORE', due, id)
if not current then return false end
local now = now_ms()
local at
if mode == 'now' then
  at = now
else
  -- A client may have written an infinite score: postpone from now then.
  local c = tonumber(current)
  if not c or c ~= c or c == math.huge or c == -math.huge then c = now end
  at = math.max(c, now) + tonumber(ARGV[3])
end
local written = string.format('%d', at)
redis.call('ZADD', due, 'XX', written, id)
return written
