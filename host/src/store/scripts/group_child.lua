-- group_child: schedule one child of a workflow group in its own type's slot, marked as the group's.
--
-- KEYS: 1 due, 2 payload, 3 member (HASH id → "<callback type>\n<group id>\n<join number>"), 4 dead,
--       5 outbox, 6 seq, 7 marker (STRING; used only when ARGV 7 is '1')
-- ARGV: 1 id, 2 due_ms, 3 payload, 4 has_payload ('1' | '0'), 5 membership
--       "<callback type>\n<group id>\n<join number>", 6 mode: 'replace' (a waiting task with this id is
--       re-scheduled, a dead one starts over) or 'create' (only where none is waiting or dead),
--       7 '1' = run once per marker (an outbox entry's), 8 this type's name
-- Returns: 1 scheduled; 0 ran before (marker); 2 not scheduled: its id is
-- another group's child, or (create) is waiting or dead; the group is told
-- at once that this child was cancelled (a report in the outbox), so it never
-- waits for a child that will not run.
-- Guarantees: the task and its mark are written in one step; the group was
-- joined first (group_join.lua); nothing is written unless every key holds
-- its type and seq is an integer (HGFAULT otherwise).

local due, payload, member, dead, outbox, seq, marker = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local id, membership, once = ARGV[1], ARGV[5], ARGV[7] == '1'
local bad = check_keys({ { due, 'zset' }, { payload, 'hash' }, { member, 'hash' }, { dead, 'zset' },
  { outbox, 'hash' }, { marker, 'string' } }) or check_integer(seq)
if bad then return bad end
if once and redis.call('EXISTS', marker) == 1 then return 0 end

local current = redis.call('HGET', member, id)
-- Its group is the mark but its join number (the same join again is this child).
local function group_of(mark) return string.match(mark, '^([^\n]*\n[^\n]*)') end
local taken = (current and group_of(current) ~= group_of(membership))
  or (ARGV[6] == 'create' and not current
      and (redis.call('ZSCORE', due, id) or redis.call('ZSCORE', dead, id)))
if once then redis.call('SET', marker, '1', 'PX', 86400000) end
if taken then
  -- Not report_ended: the id's mark, if any, is another group's and stays.
  local entry = ARGV[8] .. ':x' .. redis.call('INCR', seq) .. ':report'
  redis.call('HSET', outbox, entry, 'cancelled\n' .. membership .. '\n' .. id)
  return 2
end
-- A dead task with this id starts over at its claim (claim.lua), as after a client schedule.
redis.call('ZADD', due, ARGV[2], id)
if ARGV[4] == '1' then
  redis.call('HSET', payload, id, ARGV[3])
else
  redis.call('HDEL', payload, id)
end
redis.call('HSET', member, id, membership)
return 1
