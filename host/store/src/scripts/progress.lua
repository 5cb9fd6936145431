-- progress: store the latest progress that running tasks' handlers reported.
--
-- KEYS: 1 claimed (see the prelude), 2 progress (HASH id -> JSON), 3 events
-- ARGV: 1 events maxlen (0 = no events), then per report: id, token, claim id,
--       attempt, percent (0-100), detail (JSON text, or empty), the value to store
-- Returns: how many reports were stored.
-- Guarantees:
--   * fencing: a report is stored only while its task is still leased under
--     the claim and token of the run that made it, so a report that arrives
--     after the task settled (or after its lease was lost to another host)
--     never brings progress back; settle drops a task's progress when it
--     ends, and keeps it when it is retried (the next attempt starts from it).
--   * the value, as the host wrote it, is JSON:
--     {"percent":P,"detail":D,"attempt":A,"at_ms":T}, D the handler's detail
--     (null when none), which the host checked is JSON.
--   * events (when maxlen > 0): one XADD MAXLEN ~ per stored report, outcome
--     `progress`, with id, attempt, percent and detail; clients waiting for
--     a task's end skip them.
--   * nothing is written unless every key holds its type (HGFAULT otherwise).

local claimed, progress, events = KEYS[1], KEYS[2], KEYS[3]
local events_maxlen = tonumber(ARGV[1])
local bad = check_keys({ { claimed, 'hash' }, { progress, 'hash' } })
if not bad and events_maxlen > 0 then bad = check_keys({ { events, 'stream' } }) end
if bad then return bad end

local recs, pairs_, stored = {}, {}, 0
local pending_events = {}
for i = 2, #ARGV, 7 do
  local id, token, claim = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local attempt, percent, detail = ARGV[i + 3], ARGV[i + 4], ARGV[i + 5]
  if leased_in(recs, claimed, claim, id, token) then
    pairs_[#pairs_ + 1] = id
    pairs_[#pairs_ + 1] = ARGV[i + 6]
    stored = stored + 1
    if events_maxlen > 0 then
      pending_events[#pending_events + 1] = { 'id', id, 'outcome', 'progress', 'attempt', attempt,
        'percent', percent, 'detail', detail }
    end
  end
end
each_chunk(pairs_, function(...) redis.call('HSET', progress, ...) end)
for _, fields in ipairs(pending_events) do
  redis.call('XADD', events, 'MAXLEN', '~', events_maxlen, '*', unpack(fields))
end
return stored
