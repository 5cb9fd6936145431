-- settle: commit the outcomes of many finished tasks of one type at once.
--
-- KEYS: 1 due, 2 payload, 3 claims, 4 claimed (see the prelude), 5 attempts, 6 errors, 7 dead,
--       8 stats, 9 outbox, 10 events, 11 cancels (id -> the token `hourglass cancel` asked to stop)
-- ARGV: 1 outbox entry prefix (the source type), 2 events maxlen (0 = no events), then per task
--       either a plain ack (no follow-ups, no events): 'a', id, token, claim id
--       or in full: kind ('ack'|'retry'|'dead'|'cancel'), id, token, claim id, attempt, due_ms,
--         started_ms, finished_ms, delay_ms, error, n_followups, followup_1..n
-- Returns: { 1 = settled | 2 = settled as cancelled | 0 = fenced } per task, in order.
-- Guarantees:
--   * fencing: a task that is no longer leased under the given claim and
--     token (its claim's lease expired and was reaped: someone else may hold
--     it) is left completely untouched.
--   * a settled task leaves its claim; the claim and its lease go with its last task.
--   * ack: attempts, errors gone; the payload is dropped only if
--     the id is not due again (a client re-scheduled it while it ran: that
--     schedule and its payload stay); follow-ups go into the outbox in the
--     same atomic step, under entry ids "<type>:<token>:<n>" unique forever.
--   * retry: due again at now + delay_ms, ZADD NX so a client schedule wins;
--     the attempt is recorded in attempts (claim counts on from it).
--   * dead: dead-lettered with its attempt count unless a client re-scheduled
--     it during the run; then the client wins and the task starts over
--     (attempts reset).
--   * cancel (the run was stopped by `hourglass cancel`), or a retry or dead
--     letter of a task whose cancel was asked: attempts and
--     errors go, the payload unless the id is due again, and it is never
--     retried; counted as cancelled.
--   * counters: succeeded, failed (failed attempts), retried, dead, cancelled.
--   * events (when maxlen > 0): one XADD MAXLEN ~ per committed outcome, in the
--     same atomic step, with outcome succeeded | retried | dead | rescheduled
--     (a dead letter that a client schedule overrode); fenced tasks add none.
--   * nothing is written unless every key holds its type and the counters are
--     integers (the prelude's rule): a broken key fails the whole batch with
--     HGFAULT, every task stays leased, and the host writes it again later.
--
-- Cost: the batch is read with one HMGET per claim it touches and, only
-- when a payload or a failure needs it, one ZMSCORE due; it is written with
-- one variadic call per key and operation and one per claim, so no sorted set
-- or hash is touched per acked task without a payload. A batch holds each id
-- at most once with a valid token (an id is leased to one token at a time),
-- so reading everything first sees what each task needs.

local due, payload, claims, claimed = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local attempts, errors, dead, stats, outbox = KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local events, cancels = KEYS[10], KEYS[11]
local entry_prefix = ARGV[1]
local events_maxlen = tonumber(ARGV[2])

local bad = check_keys({
  { due, 'zset' }, { payload, 'hash' }, { claims, 'zset' }, { claimed, 'hash' }, { attempts, 'hash' },
  { errors, 'hash' }, { dead, 'zset' }, { stats, 'hash' }, { outbox, 'hash' }, { events, 'stream' },
  { cancels, 'hash' },
}) or check_counters(stats, { 'succeeded', 'failed', 'retried', 'dead', 'cancelled' })
  or check_counters(claimed, { 'leased' })
if bad then return bad end

local now = now_ms()
local now_s = string.format('%d', now)

-- Where each task's arguments start (no table per task: most are plain acks).
local starts, ids = {}, {}
local all_plain = true
local i = 3
while i <= #ARGV do
  starts[#starts + 1] = i
  ids[#ids + 1] = ARGV[i + 1]
  if ARGV[i] == 'a' then
    i = i + 4
  else
    all_plain = false
    i = i + 11 + tonumber(ARGV[i + 10])
  end
end
if #starts == 0 then return {} end

-- Without payloads, plain acks need no due scores (they only decide whether a payload stays).
local has_payload = redis.call('EXISTS', payload) == 1
local due_scores = {}
if has_payload or not all_plain then due_scores = multi_get('ZMSCORE', due, ids) end
local recs = {} -- claim id → its record (read once per claim)

-- Both usually do not exist (they hold only failed attempts): one EXISTS
-- each, instead of collecting ids to drop from them.
local has_attempts = redis.call('EXISTS', attempts) == 1
local has_errors = redis.call('EXISTS', errors) == 1
-- Usually absent: one EXISTS, then a look per failed task only.
local has_cancels = redis.call('EXISTS', cancels) == 1

local results = {}
local drop_attempts, drop_errors, drop_payload = {}, {}, {}
local error_pairs, retry_pairs, dead_pairs, outbox_pairs, attempt_pairs = {}, {}, {}, {}, {}
local succeeded, failed, retried, dead_n, cancelled_n = 0, 0, 0, 0, 0
local drop_cancels = {}
local pending_events = {}

for k, at in ipairs(starts) do
  local kind, id, token = ARGV[at], ARGV[at + 1], ARGV[at + 2]
  local rec, index = leased_in(recs, claimed, ARGV[at + 3], id, token)
  if rec then leave_claim(rec, index) end
  if not rec then
    results[k] = 0
  elseif kind == 'a' then
    results[k] = 1
    if has_attempts then drop_attempts[#drop_attempts + 1] = id end
    if has_errors then drop_errors[#drop_errors + 1] = id end
    if has_payload and not due_scores[k] then drop_payload[#drop_payload + 1] = id end
    if has_cancels then drop_cancels[#drop_cancels + 1] = id end
    succeeded = succeeded + 1
  else
    results[k] = 1
    local task = {
      attempt = ARGV[at + 4], due_ms = ARGV[at + 5], started_ms = ARGV[at + 6], finished_ms = ARGV[at + 7],
      delay_ms = ARGV[at + 8], err = ARGV[at + 9], n_follow = tonumber(ARGV[at + 10]),
    }
    -- The attempt the claim recorded (the caller's copy is the fallback).
    local attempt = rec.attempts[index] and string.format('%d', rec.attempts[index]) or task.attempt
    local outcome, retry_at = nil, nil
    if has_cancels then drop_cancels[#drop_cancels + 1] = id end
    -- A failure of a run whose cancel was asked is a cancel: never retried.
    if kind ~= 'ack' and kind ~= 'cancel' and has_cancels and redis.call('HGET', cancels, id) == token then
      kind = 'cancel'
    end
    if kind == 'cancel' then
      if has_attempts then drop_attempts[#drop_attempts + 1] = id end
      if has_errors then drop_errors[#drop_errors + 1] = id end
      if not due_scores[k] then drop_payload[#drop_payload + 1] = id end
      cancelled_n = cancelled_n + 1
      results[k] = 2
      outcome = 'cancelled'
    elseif kind == 'ack' then
      if has_attempts then drop_attempts[#drop_attempts + 1] = id end
      if has_errors then drop_errors[#drop_errors + 1] = id end
      if not due_scores[k] then drop_payload[#drop_payload + 1] = id end
      for f = 0, task.n_follow - 1 do
        outbox_pairs[#outbox_pairs + 1] = entry_prefix .. ':' .. token .. ':' .. f
        outbox_pairs[#outbox_pairs + 1] = ARGV[at + 11 + f]
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
      if due_scores[k] then
        -- A client schedule written during the run wins (ZADD NX would keep it).
        retry_at = string.format('%.0f', tonumber(due_scores[k]))
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
      if due_scores[k] then
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
      pending_events[#pending_events + 1] = fields
    end
  end
end

write_claims(claims, claimed, recs)
each_chunk(drop_attempts, function(...) redis.call('HDEL', attempts, ...) end)
each_chunk(drop_errors, function(...) redis.call('HDEL', errors, ...) end)
each_chunk(drop_payload, function(...) redis.call('HDEL', payload, ...) end)
each_chunk(drop_cancels, function(...) redis.call('HDEL', cancels, ...) end)
each_chunk(error_pairs, function(...) redis.call('HSET', errors, ...) end)
each_chunk(attempt_pairs, function(...) redis.call('HSET', attempts, ...) end)
each_chunk(retry_pairs, function(...) redis.call('ZADD', due, 'NX', ...) end)
each_chunk(dead_pairs, function(...) redis.call('ZADD', dead, ...) end)
each_chunk(outbox_pairs, function(...) redis.call('HSET', outbox, ...) end)
for _, fields in ipairs(pending_events) do
  redis.call('XADD', events, 'MAXLEN', '~', events_maxlen, '*', unpack(fields))
end

if succeeded > 0 then redis.call('HINCRBY', stats, 'succeeded', succeeded) end
if failed > 0 then redis.call('HINCRBY', stats, 'failed', failed) end
if retried > 0 then redis.call('HINCRBY', stats, 'retried', retried) end
if dead_n > 0 then redis.call('HINCRBY', stats, 'dead', dead_n) end
if cancelled_n > 0 then redis.call('HINCRBY', stats, 'cancelled', cancelled_n) end
return results
