-- deliver: move outbox entries (follow-ups) into one target type's due set (or one shard of it), each exactly once.
--
-- KEYS: 1 target due, 2 target payload, 3 target dead, then per entry 4, 5, ...: its delivery marker
--       (P:{target}:delivered:<entry-id>)
-- ARGV: per entry, five values: id, due_ms (whole ms), payload, has_payload ('1' or '0'), mode:
--       'replace' (a task with this id that is waiting is re-scheduled, with this payload; a dead
--       one starts over) or 'create' (only where no task with this id is waiting or dead-lettered)
-- Returns: per entry, in order, 1 if delivered now, 0 if it was delivered before, 2 if a create-only
-- entry found its id waiting or dead and left that task as it was.
-- Guarantees: the entries are delivered in order (an id given twice ends as two deliveries one
-- after the other); each marker (kept 24h) makes a re-run after a crash between this script and
-- the outbox HDEL a no-op, so a follow-up is scheduled exactly once (a create-only one that found
-- its id taken counts as handled too); nothing is written unless every key holds its type and
-- every due time is whole ms (HGFAULT otherwise: the entries stay in the outbox until the target's
-- keys are fixed). The caller bounds a call (entries and bytes) as schedule_batch's callers do.

local due, payload, dead = KEYS[1], KEYS[2], KEYS[3]
local n = #ARGV / 5
if n ~= math.floor(n) or #KEYS ~= 3 + n then
  return redis.error_reply('ERR deliver takes five values and one marker key per entry, got ' .. #ARGV ..
    ' values and ' .. #KEYS .. ' keys')
end
local markers = {}
for e = 1, n do markers[e] = { KEYS[3 + e], 'string' } end
local bad = check_keys({ { due, 'zset' }, { payload, 'hash' }, { dead, 'zset' } }) or check_rare(markers, {})
if bad then return bad end
for e = 0, n - 1 do
  local due_ms = ARGV[5 * e + 2]
  if not is_integer(due_ms) then
    return redis.error_reply(string.format('ERR deliver: entry %d: due time %q is not whole milliseconds', e, due_ms))
  end
end

local delivered = {}
for e = 0, n - 1 do
  local id, due_ms, body, has_body, mode = ARGV[5 * e + 1], ARGV[5 * e + 2], ARGV[5 * e + 3], ARGV[5 * e + 4],
    ARGV[5 * e + 5]
  local taken = mode == 'create' and (redis.call('ZSCORE', due, id) or redis.call('ZSCORE', dead, id))
  if not redis.call('SET', KEYS[4 + e], '1', 'NX', 'PX', 86400000) then
    delivered[e + 1] = 0
  elseif taken then
    delivered[e + 1] = 2
  else
    redis.call('ZADD', due, due_ms, id)
    if has_body == '1' then
      redis.call('HSET', payload, id, body)
    else
      redis.call('HDEL', payload, id)
    end
    delivered[e + 1] = 1
  end
end
return delivered
