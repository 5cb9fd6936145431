-- deliver: move one outbox entry into its target type's due set, exactly once.
--
-- KEYS: 1 target due, 2 target payload, 3 delivery marker (P:{target}:delivered:<entry-id>)
-- ARGV: 1 id, 2 due_ms, 3 payload, 4 has_payload ('1' or '0')
-- Returns: 1 if delivered now, 0 if this entry was delivered before.
-- Guarantees: the marker (kept 24h) makes a re-run after a crash between this
-- script and the outbox HDEL a no-op, so a follow-up is scheduled exactly once;
-- nothing is written unless every key holds its type (HGFAULT otherwise: the
-- entry stays in the outbox until the target's keys are fixed).

local bad = check_keys({ { KEYS[1], 'zset' }, { KEYS[2], 'hash' }, { KEYS[3], 'string' } })
if bad then return bad end
if not redis.call('SET', KEYS[3], '1', 'NX', 'PX', 86400000) then
  return 0
end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
if ARGV[4] == '1' then
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
else
  redis.call('HDEL', KEYS[2], ARGV[1])
end
return 1
