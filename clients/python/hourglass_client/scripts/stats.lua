-- stats: one consistent snapshot of a type's queue sizes and counters, and whether its keys are sound (read-only).
--
-- KEYS: 1 due, 2 leases, 3 dead, 4 stats, 5 payload, 6 tokens, 7 attempts, 8 errors, 9 seq, 10 outbox, 11 events,
--       12 recur, 13 throttle, 14 paused, 15 cancels, 16 claims, 17 claimed (2 and 6: per-task leases of older hosts),
--       18 groups (workflow groups with callbacks of this type, not done), 19 member (workflow marks),
--       20 graphs (workflow graphs of this home type, not done)
-- ARGV: none
-- Returns: { due_now, due_total, in_flight, dead, succeeded, failed, retried, dead_total, fault | false,
--            paused: false | 0 (until resumed) | ms until the pause ends, cancelled,
--            oldest_due_age_ms, groups_open, groups_completed, groups_failed,
--            graphs_running, graphs_opened, graphs_completed, graphs_failed } where in_flight counts the tasks leased (under
--          claims, and per task by older hosts) and oldest_due_age_ms is now minus the lowest due
--          score when that is in the past (0 otherwise: nothing due yet), and
--          fault names every key holding the wrong type or a counter that
--          is not an integer, with the fix (the claims and settles of this type
--          fail with the same text until it is fixed).
-- Guarantees: "now" is this server's TIME, the same clock claims use; a broken
-- key is reported, never an error, so `hourglass stats` always answers.

local expected = {
  { KEYS[1], 'zset' }, { KEYS[2], 'zset' }, { KEYS[3], 'zset' }, { KEYS[4], 'hash' }, { KEYS[5], 'hash' },
  { KEYS[6], 'hash' }, { KEYS[7], 'hash' }, { KEYS[8], 'hash' }, { KEYS[9], 'string' }, { KEYS[10], 'hash' },
  { KEYS[11], 'stream' }, { KEYS[12], 'hash' }, { KEYS[13], 'hash' }, { KEYS[14], 'string' }, { KEYS[15], 'hash' },
  { KEYS[16], 'zset' }, { KEYS[17], 'hash' }, { KEYS[18], 'zset' }, { KEYS[19], 'hash' }, { KEYS[20], 'zset' },
}
local faults = {}
local sound = {}
for i, e in ipairs(expected) do
  local bad = check_keys({ e })
  if bad then faults[#faults + 1] = string.sub(bad['err'], 9) else sound[i] = true end
end
if sound[9] then
  local bad = check_integer(KEYS[9])
  if bad then faults[#faults + 1] = string.sub(bad['err'], 9) end
end
local leased = 0
if sound[17] then
  local bad = check_counters(KEYS[17], { 'leased' })
  if bad then
    faults[#faults + 1] = string.sub(bad['err'], 9)
  else
    leased = tonumber(redis.call('HGET', KEYS[17], 'leased')) or 0
  end
end

local counters = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0 }
if sound[4] then
  local names = { 'succeeded', 'failed', 'retried', 'dead', 'cancelled', 'groups_completed', 'groups_failed',
    'graphs_opened', 'graphs_completed', 'graphs_failed' }
  local bad = check_counters(KEYS[4], names)
  if bad then
    faults[#faults + 1] = string.sub(bad['err'], 9)
  else
    local c = redis.call('HMGET', KEYS[4], unpack(names))
    for i = 1, #names do counters[i] = tonumber(c[i]) or 0 end
  end
end

local now_number = now_ms()
local now = string.format('%d', now_number)
-- false when not paused; 0 when paused until resumed; else ms left.
local function pause_left()
  local ttl = redis.call('PTTL', KEYS[14])
  if ttl == -2 then return false end
  if ttl == -1 then return 0 end
  return ttl
end
local function count(i, cmd, ...)
  if sound[i] then return redis.call(cmd, KEYS[i], ...) end
  return 0
end
-- The lowest score is one O(log n) read; a client's '-inf' counts as due since forever, so it is capped at now.
local oldest_age = 0
if sound[1] then
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  local score = first[2] and tonumber(first[2])
  if score and score < now_number then oldest_age = math.min(now_number - score, now_number) end
end
return {
  count(1, 'ZCOUNT', '-inf', now),
  count(1, 'ZCARD'),
  leased + count(6, 'HLEN'),
  count(3, 'ZCARD'),
  counters[1], counters[2], counters[3], counters[4],
  #faults > 0 and table.concat(faults, '; ') or false,
  sound[14] and pause_left() or false,
  counters[5],
  string.format('%d', oldest_age),
  count(18, 'ZCARD'),
  counters[6], counters[7],
  count(20, 'ZCARD'), counters[8], counters[9], counters[10],
}
