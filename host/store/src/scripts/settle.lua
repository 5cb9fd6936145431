-- settle: commit the outcomes of many finished tasks of one type at once.
--
-- KEYS: 1 due, 2 payload, 3 claims, 4 claimed (see the prelude), 5 attempts, 6 errors, 7 dead,
--       8 stats, 9 outbox, 10 events, 11 cancels (id -> the token `hourglass cancel` asked to stop),
--       12 member (id -> its workflow group, see the prelude's report_ended), 13 running, 14 held
--       (both: see the prelude's unhold), 15 progress (id -> the latest progress reported, JSON),
--       then per follow-up target delivered directly (one server only: all keys on it), three:
--       its due, payload and dead (target k, from 1, at 16 + 3(k-1))
-- ARGV: 1 outbox entry prefix (the source type), 2 events maxlen (0 = no events), then entries:
--       plain acks (no follow-ups, no events) of one claim: 'm', claim id, mask (byte k is
--         '1' when task k of the claim, from 1, is acked; the mask may stop at the last one),
--         n, then the n acked ids in the mask's order (they leave `running` as they are,
--         so the claim record need not be decoded)
--       or acks whose only other write is follow-ups delivered directly, of one claim:
--         'f', claim id, mask, n, the n acked ids as for 'm', then each one's number of
--         follow-ups (n arguments), then their follow-ups in that order, each 'd' and the
--         rest as below (a fenced task's are skipped)
--       or one task in full: kind ('ack'|'retry'|'dead'|'cancel'), id, token, claim id, attempt,
--         due_ms, started_ms, finished_ms, delay_ms, error, n_followups, followup_1..n, each
--         'c' (create-only) or 'r' (may replace) and then the encoded follow-up (into the
--         outbox), or 'd' and then a follow-up delivered directly: 'k,mode,due_ms,id_len,' with
--         mode 'c' or 'r', then the id's bytes and the payload's (empty: no payload), or 'g'
--         and then a run's encoded work on one workflow group (entry id ends ":group"), or 'G'
--         and then a workflow graph the run declares, as JSON (entry id ends ":graph");
--         a retry's only item may be 'p' and then the run's last progress, as stored (JSON)
-- Returns: per entry, in order: for plain acks ('m', 'f') the mask of those settled (the
--          others were fenced); for a task in full how it ended, by name:
--          succeeded | retried | dead | cancelled | rescheduled (a dead letter
--          a client's schedule overrode: failed, not dead) | fenced; then one
--          two more elements: how many entries went into the outbox (follow-ups, group
--          reports, workflow work and graphs: the host moves them on), and the create-only
--          follow-ups delivered directly that found their id taken, as a flat list of target
--          number k and id.
-- Guarantees:
--   * fencing: a task that is no longer leased under the given claim and
--     token (its claim's lease expired and was reaped: someone else may hold
--     it) is left completely untouched.
--   * a settled task leaves its claim; the claim and its lease go with its last task.
--   * a schedule a client wrote for the id during the run, held back by a
--     claim until this run ended, gets its own due time back (unhold).
--   * ack: attempts, errors gone; the payload is dropped only if
--     the id is not due again (a client re-scheduled it while it ran: that
--     schedule and its payload stay); follow-ups go into the outbox in the
--     same atomic step, under entry ids "<type>:<token>:<n>" unique forever,
--     ":create" appended for a create-only one (hosts before it deliver
--     every entry as a replace, none is lost in a rolling upgrade). A
--     follow-up given directly ('d') is written into its target type's keys
--     in this step instead, after everything else the settle writes, as
--     deliver.lua would (same modes, the effect of writing them in order,
--     batched per target): nothing to deliver later, no marker needed for
--     exactly once. Its target's keys are checked with the
--     rest: a broken one fails the whole batch (HGFAULT naming it), and the
--     host settles again through the outbox.
--   * retry: due again at now + delay_ms, ZADD NX so a client schedule wins;
--     the attempt is recorded in attempts (claim counts on from it).
--   * dead: dead-lettered with its attempt count unless a client re-scheduled
--     it during the run; then the client wins and the task starts over
--     (attempts reset).
--   * cancel (the run was stopped by `hourglass cancel`), or a retry or dead
--     letter of a task whose cancel was asked: attempts and
--     errors go, the payload unless the id is due again, and it is never
--     retried; counted as cancelled.
--   * a workflow group's child that ended (acked, dead-lettered or cancelled;
--     not retried, not rescheduled) leaves its group's mark and reports to
--     the group through the outbox in the same step ("<type>:<token>:report").
--   * progress: a task that ended (acked, dead, cancelled, rescheduled) loses
--     its progress; a retried one keeps it, replaced by its run's last report
--     when the run made one (a report the progress writer had not stored yet
--     is not lost to the settle winning the race).
--   * counters: succeeded, failed (failed attempts), retried, dead, cancelled.
--   * events (when maxlen > 0): one XADD MAXLEN ~ per committed outcome, in the
--     same atomic step, with outcome succeeded | retried | dead | rescheduled
--     (a dead letter that a client schedule overrode), and `group` when the
--     task is a group's child; fenced tasks add none.
--   * nothing is written unless every key holds its type and the counters are
--     integers (the prelude's rule): a broken key fails the whole batch with
--     HGFAULT, every task stays leased, and the host writes it again later.
--
-- Cost: the batch is read with one HMGET per claim it touches and, only
-- when a payload or a failure needs it, ZMSCORE due; it is written with one
-- variadic call per key and operation and one per claim, so no sorted set or
-- hash is touched per acked task without a payload, and acks that empty a
-- claim cost no per-task work at all. A batch holds each task at most once
-- (a task is leased to one claim and token at a time), so reading
-- everything first sees what each task needs.

local due, payload, claims, claimed = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local attempts, errors, dead, stats, outbox = KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local events, cancels, member = KEYS[10], KEYS[11], KEYS[12]
local running, held, progress = KEYS[13], KEYS[14], KEYS[15]
local entry_prefix = ARGV[1]
local events_maxlen = tonumber(ARGV[2])
-- Targets of direct follow-ups: { due, payload, dead } each.
local n_targets = (#KEYS - 15) / 3
if n_targets < 0 or n_targets ~= math.floor(n_targets) then
  return redis.error_reply('ERR settle takes 15 keys and three per direct follow-up target, got ' .. #KEYS)
end
local targets = {}
for k = 1, n_targets do
  local at = 16 + 3 * (k - 1)
  targets[k] = { due = KEYS[at], payload = KEYS[at + 1], dead = KEYS[at + 2] }
end

-- Where each entry's arguments start; the ids of tasks in full (for ZMSCORE).
local starts, full_ids = {}, {}
local i = 3
while i <= #ARGV do
  starts[#starts + 1] = i
  if ARGV[i] == 'm' then
    i = i + 4 + tonumber(ARGV[i + 3])
  elseif ARGV[i] == 'f' then
    local n = tonumber(ARGV[i + 3])
    local items = 0
    for k = i + 4 + n, i + 3 + 2 * n do items = items + tonumber(ARGV[k]) end
    i = i + 4 + 2 * n + items
  else
    full_ids[#full_ids + 1] = ARGV[i + 1]
    i = i + 11 + tonumber(ARGV[i + 10])
  end
end
if #starts == 0 then return { 0, {} } end

-- The keys this batch touches: plain acks only need the claims, the
-- counters and (when they exist) payload, attempts, errors and cancels;
-- tasks in full touch everything. Usually absent keys cost one EXISTS.
local types = {}
local bad = check_keys({ { claims, 'zset' }, { running, 'set' } }, types)
  or check_counters(stats, { 'succeeded', 'failed', 'retried', 'dead', 'cancelled' })
  or check_counters(claimed, { 'leased' })
  or check_rare({ { payload, 'hash' }, { attempts, 'hash' }, { errors, 'hash' }, { cancels, 'hash' },
    { member, 'hash' }, { held, 'hash' }, { progress, 'hash' } }, types)
if bad then return bad end
for _, t in ipairs(targets) do
  bad = check_keys({ { t.due, 'zset' }, { t.payload, 'hash' }, { t.dead, 'zset' } })
  if bad then return bad end
end
if #full_ids > 0 or types[payload] ~= 'none' or types[member] ~= 'none' or types[held] ~= 'none' then
  bad = check_keys({ { due, 'zset' } }, types)
  if not bad and (#full_ids > 0 or types[member] ~= 'none') then
    bad = check_keys({ { dead, 'zset' }, { outbox, 'hash' }, { events, 'stream' } }, types)
  end
  if bad then return bad end
end
local now = #full_ids > 0 and now_ms() or 0
local now_s = string.format('%d', now)

local function present(key) return types[key] ~= 'none' end
-- Usually absent: the payload hash (plain ZADDs), attempts and errors
-- (failed attempts only) and cancels. What is absent needs no per-task work.
local has_payload, has_attempts = present(payload), present(attempts)
local has_errors, has_cancels, has_members = present(errors), present(cancels), present(member)
local has_held, has_progress = present(held), present(progress)
-- Due scores of the tasks in full: whether a client re-scheduled one while it ran.
local full_due = {}
if #full_ids > 0 then full_due = multi_get('ZMSCORE', due, full_ids) end
-- Groups of the tasks in full (only where the type has group children at all).
local full_member = {}
if has_members and #full_ids > 0 then full_member = multi_get('HMGET', member, full_ids) end
-- Children that ended: { id, token, outcome, membership or nil (read later) }.
local ended = {}
local recs = {} -- claim id → its record (read once per claim)

local results = {}
local drop_attempts, drop_errors, drop_payload = {}, {}, {}
local error_pairs, retry_pairs, dead_pairs, outbox_pairs, attempt_pairs = {}, {}, {}, {}, {}
local succeeded, failed, retried, dead_n, cancelled_n = 0, 0, 0, 0, 0
local drop_cancels, drop_progress, progress_pairs = {}, {}, {}
local pending_events = {}
-- Follow-ups delivered directly, in order: { mode, due_ms, id, body, target number k }.
local direct = {}
-- Acked ids that may still have something to drop (payload, attempts, errors, cancel marks).
local plain_acked = {}
-- A child with nothing else to drop still has its group to tell.
local track_plain = has_payload or has_attempts or has_errors or has_cancels or has_members or has_progress
-- Every task that left its claim here leaves `running`: these ids, and the
-- ranges of ARGV whose every id left (no per-task copy).
local left, left_ranges = {}, {}

-- A follow-up delivered directly ('d...'), added to `direct`; false when it is malformed.
local function add_direct(follow)
  local k, mode, due_ms, id_len, from = string.match(follow, '^d(%d+),([cr]),(%-?%d+),(%d+),()')
  k, id_len = tonumber(k), tonumber(id_len)
  if not k or not targets[k] or not is_integer(due_ms) or from + id_len - 1 > #follow then return false end
  direct[#direct + 1] = { mode, due_ms, string.sub(follow, from, from + id_len - 1), string.sub(follow, from + id_len), k }
  return true
end

local f = 0 -- index into full_due
for e, at in ipairs(starts) do
  local kind = ARGV[at]
  if kind == 'm' or kind == 'f' then
    local rec = cached_claim(recs, claimed, ARGV[at + 1])
    local taken = rec and not rec.all_left and take_masked(rec, ARGV[at + 2]) or ''
    local n = count_live(taken)
    succeeded = succeeded + n
    if n > 0 then
      local sent, n_sent = ARGV[at + 2], tonumber(ARGV[at + 3])
      if taken == sent then
        left_ranges[#left_ranges + 1] = { at + 4, at + 3 + n_sent }
      else
        local j = 0
        for k = 1, #sent do
          if string.byte(sent, k) == LIVE then
            j = j + 1
            if string.byte(taken, k) == LIVE then left[#left + 1] = ARGV[at + 3 + j] end
          end
        end
      end
    end
    if n > 0 and track_plain then
      local ids = claim_ids(rec)
      if ids then
        for k = 1, #taken do
          if string.byte(taken, k) == LIVE then
            plain_acked[#plain_acked + 1] = ids[k]
            if has_members then
              ended[#ended + 1] = { ids[k], string.format('%d', tonumber(ARGV[at + 1]) + k - 1), 'succeeded' }
            end
          end
        end
      end
    end
    if kind == 'f' and n > 0 then
      -- The follow-ups of the acked ones, in the ids' order; a fenced one's are skipped.
      local sent, n_sent = ARGV[at + 2], tonumber(ARGV[at + 3])
      local item = at + 4 + 2 * n_sent
      local j = 0
      for k = 1, #sent do
        if string.byte(sent, k) == LIVE then
          j = j + 1
          local count = tonumber(ARGV[at + 3 + n_sent + j])
          if string.byte(taken, k) == LIVE then
            for a = item, item + count - 1 do
              if not add_direct(ARGV[a]) then
                return redis.error_reply('ERR settle: a direct follow-up is malformed')
              end
            end
          end
          item = item + count
        end
      end
    end
    results[e] = taken
  else
    f = f + 1
    local id, token = ARGV[at + 1], ARGV[at + 2]
    local due_score = full_due[f]
    local rec, index = leased_in(recs, claimed, ARGV[at + 3], id, token)
    if not rec then
      results[e] = 'fenced'
    else
      leave_claim(rec, index)
      left[#left + 1] = id
      if has_held and due_score then
        -- The schedule held for this run gets its own time back (below).
        due_score = held_original(redis.call('HGET', held, id), due_score) or due_score
      end
      local task = {
        attempt = ARGV[at + 4], due_ms = ARGV[at + 5], started_ms = ARGV[at + 6], finished_ms = ARGV[at + 7],
        delay_ms = ARGV[at + 8], err = ARGV[at + 9], n_follow = tonumber(ARGV[at + 10]),
      }
      -- The attempt the claim recorded (none recorded: the first).
      local attempt = string.format('%d', rec.attempts[index] or 1)
      local outcome, retry_at = nil, nil
      if has_cancels then drop_cancels[#drop_cancels + 1] = id end
      -- A failure of a run whose cancel was asked is a cancel: never retried.
      if kind ~= 'ack' and kind ~= 'cancel' and has_cancels and redis.call('HGET', cancels, id) == token then
        kind = 'cancel'
      end
      if kind == 'cancel' then
        if has_attempts then drop_attempts[#drop_attempts + 1] = id end
        if has_errors then drop_errors[#drop_errors + 1] = id end
        if not due_score then drop_payload[#drop_payload + 1] = id end
        cancelled_n = cancelled_n + 1
        outcome = 'cancelled'
      elseif kind == 'ack' then
        if has_attempts then drop_attempts[#drop_attempts + 1] = id end
        if has_errors then drop_errors[#drop_errors + 1] = id end
        if not due_score then drop_payload[#drop_payload + 1] = id end
        for n = 0, task.n_follow - 1 do
          local follow = ARGV[at + 11 + n]
          local how = string.sub(follow, 1, 1)
          if how == 'd' then
            if not add_direct(follow) then return redis.error_reply('ERR settle: a direct follow-up is malformed') end
          else
            local entry = entry_prefix .. ':' .. token .. ':' .. n
            if how == 'c' then
              entry = entry .. ':create'
            elseif how == 'g' then
              entry = entry .. ':group'
            elseif how == 'G' then
              entry = entry .. ':graph'
            end
            outbox_pairs[#outbox_pairs + 1] = entry
            outbox_pairs[#outbox_pairs + 1] = string.sub(follow, 2)
          end
        end
        succeeded = succeeded + 1
        outcome = 'succeeded'
      elseif kind == 'retry' then
        error_pairs[#error_pairs + 1] = id
        error_pairs[#error_pairs + 1] = task.err
        attempt_pairs[#attempt_pairs + 1] = id
        attempt_pairs[#attempt_pairs + 1] = attempt
        failed = failed + 1
        retried = retried + 1
        if due_score then
          -- A client schedule written during the run wins (ZADD NX would keep it).
          retry_at = string.format('%.0f', tonumber(due_score))
        else
          retry_at = string.format('%.0f', now + tonumber(task.delay_ms))
          retry_pairs[#retry_pairs + 1] = retry_at
          retry_pairs[#retry_pairs + 1] = id
        end
        outcome = 'retried'
      else
        error_pairs[#error_pairs + 1] = id
        error_pairs[#error_pairs + 1] = task.err
        failed = failed + 1
        if due_score then
          if has_attempts then drop_attempts[#drop_attempts + 1] = id end
          outcome = 'rescheduled'
        else
          dead_pairs[#dead_pairs + 1] = now_s
          dead_pairs[#dead_pairs + 1] = id
          attempt_pairs[#attempt_pairs + 1] = id
          attempt_pairs[#attempt_pairs + 1] = attempt
          dead_n = dead_n + 1
          outcome = 'dead'
        end
      end
      results[e] = outcome
      if outcome ~= 'retried' then
        if has_progress then drop_progress[#drop_progress + 1] = id end
      elseif task.n_follow > 0 and string.sub(ARGV[at + 11], 1, 1) == 'p' then
        progress_pairs[#progress_pairs + 1] = id
        progress_pairs[#progress_pairs + 1] = string.sub(ARGV[at + 11], 2)
      end
      local membership = full_member[f]
      if membership and (outcome == 'succeeded' or outcome == 'dead' or outcome == 'cancelled') then
        ended[#ended + 1] = { id, token, outcome, membership }
      end
      if events_maxlen > 0 then
        local fields = {'id', id, 'outcome', outcome, 'attempt', task.attempt, 'due_ms', task.due_ms,
          'started_ms', task.started_ms, 'finished_ms', task.finished_ms}
        if kind ~= 'ack' and kind ~= 'cancel' and task.err ~= '' then
          fields[#fields + 1] = 'error'
          fields[#fields + 1] = task.err
        end
        if retry_at then
          fields[#fields + 1] = 'retry_at_ms'
          fields[#fields + 1] = retry_at
        end
        if membership then
          -- A graph node's mark begins with a unit separator (the prelude's graph_node_entry).
          fields[#fields + 1] = string.byte(membership, 1) == 31 and 'graph' or 'group'
          fields[#fields + 1] = string.match(membership, '^[^\n]*\n([^\n]*)')
        end
        pending_events[#pending_events + 1] = fields
      end
    end
  end
end

-- Plain acks: drop what they still have (the payload only if not due again).
if #plain_acked > 0 then
  if has_payload then
    local due_scores = multi_get('ZMSCORE', due, plain_acked)
    for k, id in ipairs(plain_acked) do
      if not due_scores[k] then drop_payload[#drop_payload + 1] = id end
    end
  end
  for _, id in ipairs(plain_acked) do
    if has_attempts then drop_attempts[#drop_attempts + 1] = id end
    if has_errors then drop_errors[#drop_errors + 1] = id end
    if has_cancels then drop_cancels[#drop_cancels + 1] = id end
    if has_progress then drop_progress[#drop_progress + 1] = id end
  end
end

write_claims(claims, claimed, recs)
if present(running) then
  each_chunk(left, function(...) redis.call('SREM', running, ...) end)
  for _, r in ipairs(left_ranges) do
    for a = r[1], r[2], 1000 do redis.call('SREM', running, unpack(ARGV, a, math.min(a + 999, r[2]))) end
  end
end
if has_held then
  for _, r in ipairs(left_ranges) do
    for a = r[1], r[2] do left[#left + 1] = ARGV[a] end
  end
  unhold(held, due, left)
end
each_chunk(drop_attempts, function(...) redis.call('HDEL', attempts, ...) end)
each_chunk(drop_errors, function(...) redis.call('HDEL', errors, ...) end)
if has_payload then each_chunk(drop_payload, function(...) redis.call('HDEL', payload, ...) end) end
each_chunk(drop_cancels, function(...) redis.call('HDEL', cancels, ...) end)
each_chunk(drop_progress, function(...) redis.call('HDEL', progress, ...) end)
each_chunk(progress_pairs, function(...) redis.call('HSET', progress, ...) end)
each_chunk(error_pairs, function(...) redis.call('HSET', errors, ...) end)
each_chunk(attempt_pairs, function(...) redis.call('HSET', attempts, ...) end)
each_chunk(retry_pairs, function(...) redis.call('ZADD', due, 'NX', ...) end)
each_chunk(dead_pairs, function(...) redis.call('ZADD', dead, ...) end)
each_chunk(outbox_pairs, function(...) redis.call('HSET', outbox, ...) end)
for _, fields in ipairs(pending_events) do
  redis.call('XADD', events, 'MAXLEN', '~', events_maxlen, '*', unpack(fields))
end

-- Direct follow-ups, after the rest (a task's follow-up to its own id finds its payload dropped
-- first), with the effect of deliver.lua's writes one at a time in order: an id given twice ends as
-- the second, and a create-only one keeps an id that is waiting or dead, or that an earlier one here
-- wrote. Batched per target, since each redis.call and each ZADD's keyspace event costs about as much
-- as the write itself: one ZMSCORE of due and of dead for its create-only ids, then one ZADD, HSET
-- and HDEL (each in chunks).
local kept = {}
if #direct > 0 then
  local asked = {} -- k -> its create-only ids
  for _, d in ipairs(direct) do
    if d[1] == 'c' then
      local ids = asked[d[5]] or {}
      ids[#ids + 1] = d[3]
      asked[d[5]] = ids
    end
  end
  local taken = {} -- k -> { id -> true } for ids waiting or dead there now
  for k, ids in pairs(asked) do
    local waiting = multi_get('ZMSCORE', targets[k].due, ids)
    local dead_now = multi_get('ZMSCORE', targets[k].dead, ids)
    local found = {}
    for n, id in ipairs(ids) do
      if waiting[n] or dead_now[n] then found[id] = true end
    end
    taken[k] = found
  end
  local writes = {} -- k -> { order = ids first written, due = id -> due_ms, body = id -> body }
  for _, d in ipairs(direct) do
    local mode, due_ms, id, body, k = d[1], d[2], d[3], d[4], d[5]
    local w = writes[k]
    if not w then
      w = { order = {}, due = {}, body = {} }
      writes[k] = w
    end
    if mode == 'c' and (w.due[id] or (taken[k] and taken[k][id])) then
      kept[#kept + 1] = k
      kept[#kept + 1] = id
    else
      if not w.due[id] then w.order[#w.order + 1] = id end
      w.due[id], w.body[id] = due_ms, body
    end
  end
  for k, w in pairs(writes) do
    local t = targets[k]
    local scored, bodies, bare = {}, {}, {}
    for _, id in ipairs(w.order) do
      scored[#scored + 1] = w.due[id]
      scored[#scored + 1] = id
      if w.body[id] ~= '' then
        bodies[#bodies + 1] = id
        bodies[#bodies + 1] = w.body[id]
      else
        bare[#bare + 1] = id
      end
    end
    each_chunk(scored, function(...) redis.call('ZADD', t.due, ...) end)
    each_chunk(bodies, function(...) redis.call('HSET', t.payload, ...) end)
    each_chunk(bare, function(...) redis.call('HDEL', t.payload, ...) end)
  end
end

-- Group children that ended report to their groups (plain acks' marks read here, at once).
local reports = 0
if #ended > 0 then
  local unread = {}
  for _, e in ipairs(ended) do
    if not e[4] then unread[#unread + 1] = e[1] end
  end
  if #unread > 0 then
    local marks = multi_get('HMGET', member, unread)
    local j = 0
    for _, e in ipairs(ended) do
      if not e[4] then
        j = j + 1
        e[4] = marks[j]
      end
    end
  end
  -- report_ended for the lot: one HDEL and HSETs of many fields, not two calls per child.
  local left, report_pairs = {}, {}
  for _, e in ipairs(ended) do
    if e[4] then
      left[#left + 1] = e[1]
      report_pairs[#report_pairs + 1] = entry_prefix .. ':' .. e[2] .. ':report'
      report_pairs[#report_pairs + 1] = report_text(e[3], e[4], e[1])
    end
  end
  each_chunk(left, function(...) redis.call('HDEL', member, ...) end)
  each_chunk(report_pairs, function(...) redis.call('HSET', outbox, ...) end)
  reports = #left
end

if succeeded > 0 then redis.call('HINCRBY', stats, 'succeeded', succeeded) end
if failed > 0 then redis.call('HINCRBY', stats, 'failed', failed) end
if retried > 0 then redis.call('HINCRBY', stats, 'retried', retried) end
if dead_n > 0 then redis.call('HINCRBY', stats, 'dead', dead_n) end
if cancelled_n > 0 then redis.call('HINCRBY', stats, 'cancelled', cancelled_n) end
results[#results + 1] = reports + #outbox_pairs / 2
results[#results + 1] = kept
return results
