-- group_reports: count children's ends in their groups, all of one callback type C; the end of a sealed group's last pending child completes it, once.
--
-- KEYS: 1 groups, 2 stats, 3 C's due, 4 C's payload, 5 C's dead (of C); then per
--       report, 3 each from 6: group, pending, failed
-- ARGV: per report, 4 each: group id, child "<type>\n<id>", how it ended
--       (succeeded | dead | cancelled), the child's join number
-- Returns: per report, what completing its group did with the callback
--          ('callback' | 'skipped' | 'kept'), or '' when it completed nothing
--          (the group waits for more or is not sealed; or the report did not
--          count: the child is not pending with that join number, because
--          this report counted before or the group is done or gone).
-- Guarantees: a report counts once, as the child leaves `pending` (HDEL, only
-- for its join number: delivering a report twice, even after the child
-- joined again, changes nothing); a group completes exactly once, in the
-- batch that removes the last pending child of a sealed group (the
-- prelude's complete_group). All keys share C's slot, so one script takes a
-- whole batch. Nothing is written unless every key holds its type, every
-- counter is an integer and every outcome is known (HGFAULT otherwise).

local groups, stats, cb_due, cb_payload, cb_dead = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local n = #ARGV / 4
local expected = { { groups, 'zset' }, { cb_due, 'zset' }, { cb_payload, 'hash' }, { cb_dead, 'zset' } }
-- The groups in this batch, in order of first report: { key = ..., r = first report index }.
local order, by_key = {}, {}
for r = 0, n - 1 do
  local group = KEYS[6 + 3 * r]
  if not by_key[group] then
    local g = { r = r, succeeded = 0, dead = 0, cancelled = 0, last = r }
    by_key[group] = g
    order[#order + 1] = g
    expected[#expected + 1] = { group, 'hash' }
    expected[#expected + 1] = { KEYS[7 + 3 * r], 'hash' }
    expected[#expected + 1] = { KEYS[8 + 3 * r], 'hash' }
  end
  local outcome = ARGV[3 + 4 * r]
  if outcome ~= 'succeeded' and outcome ~= 'dead' and outcome ~= 'cancelled' then
    return fault(string.format('a report for group %q says %q, not succeeded, dead or cancelled', ARGV[1 + 4 * r], outcome))
  end
end
local bad = check_keys(expected) or check_counters(stats, { 'groups_completed', 'groups_failed' })
if bad then return bad end
for _, g in ipairs(order) do
  bad = check_counters(KEYS[6 + 3 * g.r], { 'succeeded', 'dead', 'cancelled' })
  if bad then return bad end
end

-- Count: each child leaves `pending` once, for the join it ended.
local failed_pairs = {}
for r = 0, n - 1 do
  local group, pending = KEYS[6 + 3 * r], KEYS[7 + 3 * r]
  local child, outcome = ARGV[2 + 4 * r], ARGV[3 + 4 * r]
  if redis.call('HGET', pending, child) == ARGV[4 + 4 * r] then
    redis.call('HDEL', pending, child)
    local g = by_key[group]
    g[outcome] = g[outcome] + 1
    g.last = r
    if outcome ~= 'succeeded' then redis.call('HSET', KEYS[8 + 3 * r], child, outcome) end
  end
end

-- Then each group once: its counters, and its completion if that was its last child.
local fired = {}
for r = 1, n do fired[r] = '' end
for _, g in ipairs(order) do
  local group, pending, failed = KEYS[6 + 3 * g.r], KEYS[7 + 3 * g.r], KEYS[8 + 3 * g.r]
  local counted = false
  for _, outcome in ipairs({ 'succeeded', 'dead', 'cancelled' }) do
    if g[outcome] > 0 then
      redis.call('HINCRBY', group, outcome, g[outcome])
      counted = true
    end
  end
  if counted and redis.call('HGET', group, 'state') == 'sealed' and redis.call('HLEN', pending) == 0 then
    fired[g.last + 1] = complete_group(ARGV[1 + 4 * g.r], group, failed, groups, stats, cb_due, cb_payload, cb_dead)
  end
end
return fired
