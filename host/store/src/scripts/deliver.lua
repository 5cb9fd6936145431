-- deliver: move one outbox entry into its target type's due set, exactly once.
--
-- KEYS: 1 target due, 2 target payload, 3 delivery marker (P:{target}:delivered:<entry-id>),
--       4 target dead
-- ARGV: 1 id, 2 due_ms, 3 payload, 4 has_payload ('1' or '0'), 5 mode: 'replace' (a task
--       with this id that is waiting is re-scheduled, with this payload; a dead one starts
--       over) or 'create' (only where no task with this id is waiting or dead-lettered)
-- Returns: 1 if delivered now, 0 if this entry was delivered before, 2 if a
-- create-only entry found its id waiting or dead and left that task as it was.
-- Guarantees: the marker (kept 24h) makes a re-run after a crash between this
-- script and the outbox HDEL a no-op, so a follow-up is scheduled exactly once
-- (a create-only one that found its id taken counts as handled too);
-- nothing is written unless every key holds its type (HGFAULT otherwise: the
-- entry stays in the outbox until the target's keys are fixed).

local bad = check_keys({ { KEYS[1], 'zset' }, { KEYS[2], 'hash' }, { KEYS[3], 'string' }, { KEYS[4], 'zset' } })
if bad then return bad end
local taken = ARGV[5] == 'create'
  and (redis.call('ZSCORE', KEYS[1], ARGV[1]) or redis.call('ZSCORE', KEYS[4], ARGV[1]))
if not redis.call('SET', KEYS[3], '1', 'NX', 'PX', 86400000) then
  return 0
end
if taken then
  return 2
end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
if ARGV[4] == '1' then
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
else
  redis.call('HDEL', KEYS[2], ARGV[1])
end
return 1
