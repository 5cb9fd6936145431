-- group_end: seal a group; sealed with no child pending, it completes and schedules its callback, once.
--
-- KEYS: 1 group, 2 pending, 3 failed, 4 groups, 5 stats (of C), 6 C's due, 7 C's payload,
--       8 C's dead, 9 marker (STRING; used only when ARGV 2 is '1')
-- ARGV: 1 group id, 2 '1' = run once per marker (a run's seal, from the outbox)
-- Returns: { what, fired } where what is 'sealed', or 'again' (sealed or done
--          before; or the marker says this ran before), and fired is what
--          completing did with the callback ('callback' | 'skipped' | 'kept'),
--          or '' when the group waits for children.
-- Errors (HGGROUP, nothing written): sealing a group that does not exist.
-- Guarantees: a group completes exactly once, here (sealed with none
-- pending) or in group_reports.lua (its last pending child ends): see the
-- prelude's complete_group. Nothing is written unless every key holds its
-- type and the counters are integers (HGFAULT otherwise).

local group, pending, failed, groups, stats = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local cb_due, cb_payload, cb_dead, marker = KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local gid, once = ARGV[1], ARGV[2] == '1'
local bad = check_keys({ { group, 'hash' }, { pending, 'hash' }, { failed, 'hash' }, { groups, 'zset' },
  { cb_due, 'zset' }, { cb_payload, 'hash' }, { cb_dead, 'zset' }, { marker, 'string' } })
  or check_counters(group, { 'succeeded', 'dead', 'cancelled' })
  or check_counters(stats, { 'groups_completed', 'groups_failed' })
if bad then return bad end
if once and redis.call('EXISTS', marker) == 1 then return { 'again', '' } end
local state = redis.call('HGET', group, 'state')
if not state then
  return redis.error_reply(string.format('HGGROUP no group %q: open it first (hourglass group open)', gid))
end
if once then redis.call('SET', marker, '1', 'PX', 86400000) end
if state ~= 'open' then return { 'again', '' } end
redis.call('HSET', group, 'state', 'sealed')
if redis.call('HLEN', pending) > 0 then return { 'sealed', '' } end
return { 'sealed', complete_group(gid, group, failed, groups, stats, cb_due, cb_payload, cb_dead) }
