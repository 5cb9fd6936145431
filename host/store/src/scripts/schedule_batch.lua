-- schedule_batch: many tasks of one type (or one shard of it) in one call, each written as `schedule` writes one.
--
-- KEYS: 1 due, 2 payload
-- ARGV: per task, four values: id, due_ms (whole ms, at most 18 digits), payload ('' = none), mode: 'upsert' (ZADD),
--       'if-absent' (ZADD NX), 'only-later' (ZADD GT) or 'only-earlier' (ZADD LT)
-- Returns: per task, in order, 1 when its due time was written, 0 when its mode kept the one there.
-- Guarantees: one atomic step for the whole batch; the tasks are written in order, so an id given
-- twice ends as if scheduled twice one after the other; each payload is written only with its due
-- time (so if-absent never replaces the first schedule's payload), and a task written without one
-- drops the one stored; nothing is written unless both keys hold their types (HGFAULT otherwise)
-- and every task's mode and due time are valid (checked before the first write). The callers
-- bound a batch (count and bytes) so that one call holds Redis for about a millisecond at most.

local due, payload = KEYS[1], KEYS[2]
local n = #ARGV / 4
if n ~= math.floor(n) then
  return redis.error_reply('ERR schedule_batch takes four values per task, got ' .. #ARGV .. ' values')
end
local bad = check_keys({ { due, 'zset' }, { payload, 'hash' } })
if bad then return bad end

local flags = { ['if-absent'] = 'NX', ['only-later'] = 'GT', ['only-earlier'] = 'LT' }
for t = 0, n - 1 do
  local due_ms, mode = ARGV[4 * t + 2], ARGV[4 * t + 4]
  -- Integer milliseconds only: what ZADD might refuse half-way is refused here, before any write.
  if not string.match(due_ms, '^%-?%d+$') or #due_ms > 18 then
    return redis.error_reply(string.format('ERR schedule_batch: task %d: due time %q is not whole milliseconds', t, due_ms))
  end
  if mode ~= 'upsert' and not flags[mode] then
    return redis.error_reply(string.format('ERR schedule_batch: task %d: unknown mode %q', t, mode))
  end
end

-- Consecutive upserts go out as one ZADD, one HSET and one HDEL (at most 500 tasks each), which
-- ends as writing them one by one would unless an id comes twice: its second time starts a new run.
local written = {}
local zadd, hset, hdel, seen, run = {}, {}, {}, {}, 0
local function flush()
  if run == 0 then return end
  redis.call('ZADD', due, unpack(zadd))
  if #hset > 0 then redis.call('HSET', payload, unpack(hset)) end
  if #hdel > 0 then redis.call('HDEL', payload, unpack(hdel)) end
  zadd, hset, hdel, seen, run = {}, {}, {}, {}, 0
end
for t = 0, n - 1 do
  local id, due_ms, body, mode = ARGV[4 * t + 1], ARGV[4 * t + 2], ARGV[4 * t + 3], ARGV[4 * t + 4]
  if mode == 'upsert' then
    if seen[id] or run == 500 then flush() end
    seen[id] = true
    run = run + 1
    zadd[#zadd + 1] = due_ms
    zadd[#zadd + 1] = id
    if body ~= '' then
      hset[#hset + 1] = id
      hset[#hset + 1] = body
    else
      hdel[#hdel + 1] = id
    end
    written[t + 1] = 1
  else
    flush()
    -- CH counts a changed score too: 1 when this task's due time is now the id's.
    local w = redis.call('ZADD', due, flags[mode], 'CH', due_ms, id)
    if w == 1 then
      if body ~= '' then
        redis.call('HSET', payload, id, body)
      else
        redis.call('HDEL', payload, id)
      end
    end
    written[t + 1] = w
  end
end
flush()
return written
