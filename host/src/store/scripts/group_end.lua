-- group_end: count a child's end, or seal a group; the last of both schedules the callback, once.
--
-- KEYS: 1 group, 2 pending, 3 failed, 4 groups, 5 stats (of C), 6 C's due, 7 C's payload,
--       8 C's dead, 9 marker (STRING; used only when ARGV 3 is '1')
-- ARGV: 1 group id, 2 'report' | 'seal', 3 '1' = run once per marker (an outbox entry's),
--       4 child "<type>\n<id>" (report), 5 how it ended: succeeded | dead | cancelled (report)
-- Returns: { what, fired } where what is 'counted' (a child's end), 'ignored' (not a
--          pending child: ran before, or the group is gone), 'sealed', 'again' (sealed
--          or done before; or the marker says this ran before), and fired is 'callback'
--          when this step scheduled the callback, 'skipped' when the group completed
--          without it (when = success and a child failed), else ''.
-- Errors (HGGROUP, nothing written): sealing a group that does not exist.
-- Guarantees: a group completes exactly once, in the step that removes its
-- last pending child of a sealed group, or seals a group with none pending:
-- state done, its callback due now (a JSON summary as its payload: the
-- counts and up to 100 failed children; the opener's payload under
-- "payload"), counted in groups_completed; the group's keys are kept for 7
-- days for `hourglass group show`. Nothing is written unless every key holds
-- its type and the counters are integers (HGFAULT otherwise).

local group, pending, failed, groups, stats = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local cb_due, cb_payload, cb_dead, marker = KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local gid, what, once = ARGV[1], ARGV[2], ARGV[3] == '1'
local bad = check_keys({ { group, 'hash' }, { pending, 'set' }, { failed, 'hash' }, { groups, 'zset' },
  { cb_due, 'zset' }, { cb_payload, 'hash' }, { cb_dead, 'zset' }, { marker, 'string' } })
  or check_counters(group, { 'succeeded', 'dead', 'cancelled' })
  or check_counters(stats, { 'groups_completed', 'groups_failed' })
if bad then return bad end
local outcome = ARGV[5]
if what == 'report' and outcome ~= 'succeeded' and outcome ~= 'dead' and outcome ~= 'cancelled' then
  return fault(string.format('a report for group %q says %q, not succeeded, dead or cancelled', gid, outcome or ''))
end
if once and redis.call('EXISTS', marker) == 1 then return { 'again', '' } end
local state = redis.call('HGET', group, 'state')
if what == 'seal' and not state then
  return redis.error_reply(string.format('HGGROUP no group %q: open it first (hourglass group open)', gid))
end
if once then redis.call('SET', marker, '1', 'PX', 86400000) end

local result
if what == 'report' then
  if not state or redis.call('SREM', pending, ARGV[4]) == 0 then return { 'ignored', '' } end
  redis.call('HINCRBY', group, outcome, 1)
  if outcome ~= 'succeeded' then redis.call('HSET', failed, ARGV[4], outcome) end
  result = 'counted'
elseif state ~= 'open' then
  return { 'again', '' }
else
  redis.call('HSET', group, 'state', 'sealed')
  state = 'sealed'
  result = 'sealed'
end
if state ~= 'sealed' or redis.call('SCARD', pending) > 0 then return { result, '' } end

-- Complete: every child ended and no more can come.
local now = string.format('%d', now_ms())
local g = redis.call('HGETALL', group)
local f = {}
for i = 1, #g, 2 do f[g[i]] = g[i + 1] end
local ok, dead_n, cancelled_n = tonumber(f.succeeded), tonumber(f.dead), tonumber(f.cancelled)
local fired = 'callback'
if f.when == 'success' and dead_n + cancelled_n > 0 then
  fired = 'skipped'
  redis.call('HINCRBY', stats, 'groups_failed', 1)
else
  local listed, shown = {}, 0
  local rows = redis.call('HSCAN', failed, 0, 'COUNT', 100)[2]
  for i = 1, #rows, 2 do
    if shown < 100 then
      local t, id = string.match(rows[i], '^([^\n]*)\n(.*)$')
      listed[#listed + 1] = string.format('{"type":%s,"id":%s,"outcome":%s}',
        cjson.encode(t or ''), cjson.encode(id or rows[i]), cjson.encode(rows[i + 1]))
      shown = shown + 1
    end
  end
  local summary = string.format(
    '{"group":%s,"payload":%s,"added":%s,"succeeded":%d,"dead":%d,"cancelled":%d,"failed":[%s],"failed_listed_all":%s}',
    cjson.encode(gid), cjson.encode(f.callback_payload or ''), f.added or '0', ok, dead_n, cancelled_n,
    table.concat(listed, ','), (dead_n + cancelled_n == shown) and 'true' or 'false')
  local cb = f.callback_id
  local taken = f.callback_mode == 'create'
    and (redis.call('ZSCORE', cb_due, cb) or redis.call('ZSCORE', cb_dead, cb))
  if taken then
    fired = 'kept'
  else
    redis.call('ZADD', cb_due, now, cb)
    redis.call('HSET', cb_payload, cb, summary)
  end
end
redis.call('HSET', group, 'state', 'done', 'completed_ms', now, 'fired', fired)
redis.call('ZREM', groups, gid)
redis.call('HINCRBY', stats, 'groups_completed', 1)
redis.call('PEXPIRE', group, 7 * 86400000)
redis.call('PEXPIRE', failed, 7 * 86400000)
return { result, fired }
