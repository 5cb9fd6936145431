-- group_join: open a workflow group and/or add children to it, in the group's slot.
--
-- A group lives in its callback type's slot ({C}): `P:{C}:group:<G>` (HASH:
-- callback_id, callback_payload, callback_mode, when, state open|sealed|done,
-- opened_ms, added, succeeded, dead, cancelled, completed_ms, fired),
-- `P:{C}:group-pending:<G>` (HASH of the children not ended yet, each
-- "<type>\n<id>" → its join number), `P:{C}:group-failed:<G>` (HASH child →
-- dead|cancelled) and
-- `P:{C}:groups` (ZSET group id → opened ms, of the groups not done).
--
-- KEYS: 1 group, 2 pending, 3 groups, 4 stats (of C), 5 marker (STRING; used only when ARGV 2 is '1')
-- ARGV: 1 group id, 2 '1' = run once per marker (an outbox entry's), 3 '1' = open it,
--       4 callback id, 5 callback payload, 6 when ('all' | 'success'), 7 callback mode
--       ('replace' | 'create'), 8... children "<type>\n<id>"
-- Returns: { opened (1 when this call created the group), added (children new to it),
--          then each child's join number (false when it is no longer pending) },
--          with opened -1 when the marker says this ran before (the join
--          numbers are read all the same: the steps after need them).
-- Errors (HGGROUP, nothing written): opening a group that exists with another
-- callback or that is done; adding to a group that does not exist or is sealed.
-- Guarantees: a child is counted once however often it is added while it is
-- pending; its join number (the group's `added` when it joined) goes
-- into its mark and its end's report, so a report counts only for the join
-- it ended (a late duplicate of an earlier one changes nothing);
-- children are joined here before they are scheduled (group_child.lua), so a
-- child can never end before its group waits for it; nothing is written
-- unless every key holds its type (HGFAULT otherwise).

local group, pending, groups, stats, marker = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local gid, once, open = ARGV[1], ARGV[2] == '1', ARGV[3] == '1'
local bad = check_keys({ { group, 'hash' }, { pending, 'hash' }, { groups, 'zset' }, { marker, 'string' } })
  or check_counters(group, { 'added' }) or check_counters(stats, { 'groups_opened' })
if bad then return bad end
local function joins(reply)
  for i = 8, #ARGV do reply[#reply + 1] = redis.call('HGET', pending, ARGV[i]) end
  return reply
end
if once and redis.call('EXISTS', marker) == 1 then return joins({ -1, 0 }) end

local function refuse(text) return redis.error_reply('HGGROUP ' .. text) end
local state, cb_id, when = unpack(redis.call('HMGET', group, 'state', 'callback_id', 'when'))
local opened = 0
if open then
  if state == 'done' then
    return refuse(string.format('group %q already completed: pick a new group id', gid))
  elseif state and (cb_id ~= ARGV[4] or when ~= ARGV[6]) then
    return refuse(string.format('group %q is open with callback id %q (when %s)', gid, cb_id, when))
  end
elseif not state then
  return refuse(string.format('no group %q: open it first (hourglass group open)', gid))
end
if #ARGV > 7 and state and state ~= 'open' then
  return refuse(string.format('group %q is %s: no children can be added', gid, state))
end

if open and not state then
  local now = string.format('%d', now_ms())
  redis.call('HSET', group, 'state', 'open', 'callback_id', ARGV[4], 'callback_payload', ARGV[5],
    'when', ARGV[6], 'callback_mode', ARGV[7], 'opened_ms', now,
    'added', 0, 'succeeded', 0, 'dead', 0, 'cancelled', 0)
  redis.call('ZADD', groups, now, gid)
  redis.call('HINCRBY', stats, 'groups_opened', 1)
  opened = 1
end
local added = tonumber(redis.call('HGET', group, 'added') or '0')
local before = added
for i = 8, #ARGV do
  -- HEXISTS + HSET rather than HSETNX: a runner's ACL already has both.
  if redis.call('HEXISTS', pending, ARGV[i]) == 0 then
    added = added + 1
    redis.call('HSET', pending, ARGV[i], added)
  end
end
if added > before then redis.call('HSET', group, 'added', added) end
if once then redis.call('SET', marker, '1', 'PX', 86400000) end
return joins({ opened, added - before })
