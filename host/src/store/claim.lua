-- claim: hand out up to `limit` due tasks of one type under fresh leases.
--
-- KEYS: 1 due, 2 payload, 3 leases, 4 tokens, 5 attempts, 6 errors, 7 dead, 8 seq, 9 stats
-- ARGV: 1 limit, 2 lease_ms, 3 max_payload_bytes, 4 max_id_bytes, 5 holder (host id, '' = none)
-- Returns: { now_ms,
--            claimed: flat { id, payload|nil, attempt, due_score (string) } per task,
--            dead_lettered: flat { id, reason } per task,
--            next_due_score (string)|nil, next_lease_expiry (string)|nil (both
--            nil when `limit` tasks were claimed: the caller claims again),
--            lease_expiry_ms, first_token }: the claimed tasks' tokens are
--            first_token, first_token + 1, ... in the order they are listed.
-- Guarantees:
--   * up to `limit` expired leases go back to due at `now` first; ZADD NX, so a
--     schedule a client wrote meanwhile wins; their tokens die, attempts stay.
--   * then up to `limit` members with score <= now, oldest first, leave `due`
--     atomically: no two claimers ever get the same task.
--   * a due id that is also dead was re-scheduled by a client: it becomes a
--     fresh task (dead entry, attempts and errors dropped).
--   * ids over max_id_bytes and payloads over max_payload_bytes are dead-lettered
--     at once with a reason, and never handed out.
--   * every claimed task gets a unique token (INCRBY seq), a lease until
--     now + lease_ms and the attempt number attempts + 1. The attempt rides
--     in the tokens hash ("<token>:<attempt>[@<host id>]") while the lease
--     holds; the attempts hash only records attempts that ended without an
--     ack (a retry, a dead letter, or here a lease that expired), so a task
--     that succeeds first time never writes it.
-- All times come from this server's TIME, so hosts never compare their own clocks.

local due, payload, leases, tokens = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local attempts, errors, dead, seq, stats = KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local limit = tonumber(ARGV[1])
local lease_ms = tonumber(ARGV[2])
local max_payload = tonumber(ARGV[3])
local max_id = tonumber(ARGV[4])
-- The tokens hash records the attempt and the holder: "<token>:<attempt>@<host id>";
-- fencing compares the token only.
local holder_suffix = (ARGV[5] and ARGV[5] ~= '') and ('@' .. ARGV[5]) or ''

local now = now_ms()
-- '%d', not '%.0f': integer formatting skips glibc's float printer, which
-- showed in Redis's profile when it ran per task.
local now_s = string.format('%d', now)
local expiry = now + lease_ms
local expiry_s = string.format('%d', expiry)

-- 1. Reap expired leases back into due.
local expired = redis.call('ZRANGEBYSCORE', leases, '-inf', now_s, 'LIMIT', 0, limit)
if #expired > 0 then
  local zpairs = {}
  for i, id in ipairs(expired) do
    zpairs[2 * i - 1] = now_s
    zpairs[2 * i] = id
  end
  each_chunk(zpairs, function(...) redis.call('ZADD', due, 'NX', ...) end)
  -- The lost run counts as an attempt (a handler that kills its host must
  -- still end up dead-lettered after max_attempts).
  local held = multi_get('HMGET', tokens, expired)
  local spent = {}
  for i, id in ipairs(expired) do
    local attempt = held[i] and string.match(held[i], '^%d+:(%d+)')
    if attempt then
      spent[#spent + 1] = id
      spent[#spent + 1] = attempt
    end
  end
  each_chunk(spent, function(...) redis.call('HSET', attempts, ...) end)
  each_chunk(expired, function(...) redis.call('ZREM', leases, ...) end)
  each_chunk(expired, function(...) redis.call('HDEL', tokens, ...) end)
end

-- 2. Take due tasks, oldest first.
local rows = redis.call('ZRANGEBYSCORE', due, '-inf', now_s, 'WITHSCORES', 'LIMIT', 0, limit)
local ids, scores = {}, {}
for i = 1, #rows, 2 do
  ids[#ids + 1] = rows[i]
  scores[#scores + 1] = rows[i + 1]
end

local claimed, dead_out = {}, {}
local first_token = 0
if #ids > 0 then
  each_chunk(ids, function(...) redis.call('ZREM', due, ...) end)

  if redis.call('EXISTS', dead) == 1 then
    local in_dead = multi_get('ZMSCORE', dead, ids)
    local revived = {}
    for i, s in ipairs(in_dead) do
      if s then revived[#revived + 1] = ids[i] end
    end
    if #revived > 0 then
      each_chunk(revived, function(...) redis.call('ZREM', dead, ...) end)
      each_chunk(revived, function(...) redis.call('HDEL', attempts, ...) end)
      each_chunk(revived, function(...) redis.call('HDEL', errors, ...) end)
    end
  end

  local payloads = multi_get('HMGET', payload, ids)
  local ok_ids, ok_idx = {}, {}
  local dead_pairs, error_pairs = {}, {}
  for i, id in ipairs(ids) do
    local reason = nil
    if #id > max_id then
      reason = string.format('id of %d bytes is over the %d-byte limit', #id, max_id)
    elseif payloads[i] and #payloads[i] > max_payload then
      reason = string.format('payload of %d bytes is over the %d-byte limit', #payloads[i], max_payload)
    end
    if reason then
      dead_pairs[#dead_pairs + 1] = now_s
      dead_pairs[#dead_pairs + 1] = id
      error_pairs[#error_pairs + 1] = id
      error_pairs[#error_pairs + 1] = reason
      dead_out[#dead_out + 1] = id
      dead_out[#dead_out + 1] = reason
    else
      ok_ids[#ok_ids + 1] = id
      ok_idx[#ok_idx + 1] = i
    end
  end

  if #dead_pairs > 0 then
    each_chunk(dead_pairs, function(...) redis.call('ZADD', dead, ...) end)
    each_chunk(error_pairs, function(...) redis.call('HSET', errors, ...) end)
    redis.call('HINCRBY', stats, 'dead', #dead_pairs / 2)
  end

  if #ok_ids > 0 then
    local first = redis.call('INCRBY', seq, #ok_ids) - #ok_ids + 1
    first_token = first
    -- Usually empty: it holds only attempts that ended without an ack.
    local prior = {}
    if redis.call('EXISTS', attempts) == 1 then prior = multi_get('HMGET', attempts, ok_ids) end
    local lease_pairs, token_pairs = {}, {}
    for k, id in ipairs(ok_ids) do
      local token = first + k - 1
      local attempt = (tonumber(prior[k]) or 0) + 1
      lease_pairs[#lease_pairs + 1] = expiry_s
      lease_pairs[#lease_pairs + 1] = id
      token_pairs[#token_pairs + 1] = id
      token_pairs[#token_pairs + 1] = string.format('%d:%d%s', token, attempt, holder_suffix)
      local i = ok_idx[k]
      claimed[#claimed + 1] = id
      claimed[#claimed + 1] = payloads[i]
      claimed[#claimed + 1] = attempt
      claimed[#claimed + 1] = scores[i]
    end
    each_chunk(lease_pairs, function(...) redis.call('ZADD', leases, ...) end)
    each_chunk(token_pairs, function(...) redis.call('HSET', tokens, ...) end)
  end
end

-- A full claim means the caller claims again at once and ignores both.
local next_due, next_lease = false, false
if #claimed / 4 < limit then
  next_due = redis.call('ZRANGE', due, 0, 0, 'WITHSCORES')[2] or false
  next_lease = redis.call('ZRANGE', leases, 0, 0, 'WITHSCORES')[2] or false
end
return { now, claimed, dead_out, next_due, next_lease, expiry, first_token }
