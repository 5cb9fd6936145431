-- group_child: schedule children of workflow groups in their own type's slot, each marked as its group's.
--
-- KEYS: 1 due, 2 payload, 3 member (HASH id → "<callback type>\n<group id>\n<join number>"), 4 dead,
--       5 outbox, 6 seq, then per child 7, 8, ...: its marker (STRING; used only when its `once` is '1')
-- ARGV: 1 this type's name, then per child 7 each: id, due_ms, payload, has_payload ('1' | '0'),
--       membership "<callback type>\n<group id>\n<join number>", mode: 'replace' (a waiting
--       task with this id is re-scheduled, a dead one starts over) or 'create' (only where none
--       is waiting or dead), once ('1' = run once per marker: an outbox entry's step)
-- Returns: per child, 1 scheduled; 0 ran before (marker); 2 not scheduled: its
-- id is another group's child, or (create) is waiting or dead; the group is
-- told at once that this child was cancelled (a report in the outbox), so it
-- never waits for a child that will not run.
-- Guarantees: each task and its mark are written in one step; the group was
-- joined first (group_join.lua); nothing is written unless every key holds
-- its type and seq is an integer (HGFAULT otherwise).

local due, payload, member, dead, outbox, seq = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local n = (#ARGV - 1) / 7
local markers = {}
for c = 1, n do markers[c] = { KEYS[6 + c], 'string' } end
local bad = check_keys({ { due, 'zset' }, { payload, 'hash' }, { member, 'hash' }, { dead, 'zset' },
  { outbox, 'hash' } }) or check_rare(markers, {}) or check_integer(seq)
if bad then return bad end

-- Its group is the mark but its join number (the same join again is this child).
local function group_of(mark) return string.match(mark, '^([^\n]*\n[^\n]*)') end
local results = {}
for c = 1, n do
  local at = 2 + 7 * (c - 1)
  local id, due_ms, body, has_body, membership, mode, once =
    ARGV[at], ARGV[at + 1], ARGV[at + 2], ARGV[at + 3], ARGV[at + 4], ARGV[at + 5], ARGV[at + 6] == '1'
  local marker = KEYS[6 + c]
  if once and redis.call('EXISTS', marker) == 1 then
    results[c] = 0
  else
    local current = redis.call('HGET', member, id)
    local taken = (current and group_of(current) ~= group_of(membership))
      or (mode == 'create' and not current
          and (redis.call('ZSCORE', due, id) or redis.call('ZSCORE', dead, id)))
    if once then redis.call('SET', marker, '1', 'PX', 86400000) end
    if taken then
      -- Not report_ended: the id's mark, if any, is another group's and stays.
      local entry = ARGV[1] .. ':x' .. redis.call('INCRBY', seq, 1) .. ':report'
      redis.call('HSET', outbox, entry, report_text('cancelled', membership, id))
      results[c] = 2
    else
      -- A dead task with this id starts over at its claim (claim.lua), as after a client schedule.
      redis.call('ZADD', due, due_ms, id)
      if has_body == '1' then
        redis.call('HSET', payload, id, body)
      else
        redis.call('HDEL', payload, id)
      end
      redis.call('HSET', member, id, membership)
      results[c] = 1
    end
  end
end
return results
