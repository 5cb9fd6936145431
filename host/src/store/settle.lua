-- settle: commit the outcomes of many finished tasks of one type at once.
--
-- KEYS: 1 due, 2 payload, 3 leases, 4 tokens, 5 attempts, 6 errors, 7 dead, 8 stats, 9 outbox, 10 events
-- ARGV: 1 outbox entry prefix (the source type), 2 events maxlen (0 = no events), then per task:
--         id, token, attempt, due_ms, started_ms, finished_ms,
--         kind ('ack'|'retry'|'dead'), delay_ms, error, n_followups, followup_1..n
-- Returns: { 1 = settled | 0 = fenced } per task, in order.
-- Guarantees:
--   * fencing: a task whose stored token differs from the given one (its lease
--     expired and someone else may hold it) is left completely untouched.
--   * ack: lease, token, attempts, errors gone; the payload is dropped only if
--     the id is not due again (a client re-scheduled it while it ran: that
--     schedule and its payload stay); follow-ups go into the outbox in the
--     same atomic step, under entry ids "<type>:<token>:<n>" unique forever.
--   * retry: due again at now + delay_ms, ZADD NX so a client schedule wins.
--   * dead: dead-lettered unless a client re-scheduled it during the run; then
--     the client wins and the task starts over (attempts reset).
--   * counters: succeeded, failed (failed attempts), retried, dead.
--   * events (when maxlen > 0): one XADD MAXLEN ~ per committed outcome, in the
--     same atomic step, with outcome succeeded | retried | dead | rescheduled
--     (a dead letter that a client schedule overrode); fenced tasks add none.

local due, payload, leases, tokens = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local attempts, errors, dead, stats, outbox = KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local events = KEYS[10]
local entry_prefix = ARGV[1]
local events_maxlen = tonumber(ARGV[2])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local results = {}
local succeeded, failed, retried, dead_n = 0, 0, 0, 0
local function event(id, outcome, attempt, due_ms, started_ms, finished_ms, err, retry_at)
  if events_maxlen <= 0 then return end
  local fields = {'id', id, 'outcome', outcome, 'attempt', attempt, 'due_ms', due_ms,
    'started_ms', started_ms, 'finished_ms', finished_ms}
  if err ~= '' then
    fields[#fields + 1] = 'error'
    fields[#fields + 1] = err
  end
  if retry_at then
    fields[#fields + 1] = 'retry_at_ms'
    fields[#fields + 1] = retry_at
  end
  redis.call('XADD', events, 'MAXLEN', '~', events_maxlen, '*', unpack(fields))
end

local i = 3
while i <= #ARGV do
  local id, token = ARGV[i], ARGV[i + 1]
  local attempt, due_ms, started_ms, finished_ms = ARGV[i + 2], ARGV[i + 3], ARGV[i + 4], ARGV[i + 5]
  local kind, delay_ms, err = ARGV[i + 6], ARGV[i + 7], ARGV[i + 8]
  local n_follow = tonumber(ARGV[i + 9])
  local follow_at = i + 10
  i = follow_at + n_follow

  local held = redis.call('HGET', tokens, id) -- "<token>" or "<token>@<host id>"
  if not held or string.match(held, '^%d+') ~= token then
    results[#results + 1] = 0
  else
    redis.call('ZREM', leases, id)
    redis.call('HDEL', tokens, id)
    if kind == 'ack' then
      redis.call('HDEL', attempts, id)
      redis.call('HDEL', errors, id)
      if not redis.call('ZSCORE', due, id) then
        redis.call('HDEL', payload, id)
      end
      for k = 0, n_follow - 1 do
        redis.call('HSET', outbox, entry_prefix .. ':' .. token .. ':' .. k, ARGV[follow_at + k])
      end
      succeeded = succeeded + 1
      event(id, 'succeeded', attempt, due_ms, started_ms, finished_ms, '', nil)
    elseif kind == 'retry' then
      redis.call('HSET', errors, id, err)
      local retry_at = string.format('%.0f', now + tonumber(delay_ms))
      redis.call('ZADD', due, 'NX', retry_at, id)
      failed = failed + 1
      retried = retried + 1
      event(id, 'retried', attempt, due_ms, started_ms, finished_ms, err,
        string.format('%.0f', tonumber(redis.call('ZSCORE', due, id))))
    else
      redis.call('HSET', errors, id, err)
      failed = failed + 1
      if redis.call('ZSCORE', due, id) then
        redis.call('HDEL', attempts, id)
        event(id, 'rescheduled', attempt, due_ms, started_ms, finished_ms, err, nil)
      else
        redis.call('ZADD', dead, string.format('%.0f', now), id)
        dead_n = dead_n + 1
        event(id, 'dead', attempt, due_ms, started_ms, finished_ms, err, nil)
      end
    end
    results[#results + 1] = 1
  end
end

if succeeded > 0 then redis.call('HINCRBY', stats, 'succeeded', succeeded) end
if failed > 0 then redis.call('HINCRBY', stats, 'failed', failed) end
if retried > 0 then redis.call('HINCRBY', stats, 'retried', retried) end
if dead_n > 0 then redis.call('HINCRBY', stats, 'dead', dead_n) end
return results
