-- claim: hand out up to `limit` due tasks of one type under fresh leases.
--
-- KEYS: 1 due, 2 payload, 3 leases, 4 tokens (both: per-task leases of older hosts), 5 attempts,
--       6 errors, 7 dead, 8 seq, 9 stats, 10 recur (recurring schedules), 11 throttle (the rate
--       limit's bucket), 12 paused (exists while the type is paused; its value is when the pause
--       ends, 0 = until resumed), 13 cancels, 14 claims, 15 claimed (see the prelude),
--       16 member (workflow marks), 17 outbox, 18 running, 19 held (both: see the prelude's unhold)
-- ARGV: 1 limit, 2 lease_ms, 3 max_payload_bytes, 4 max_id_bytes, 5 holder (host id, '' = none),
--       6 max_running over all hosts (0 = no limit), 7 rate in tasks per second (0 = no limit),
--       8 rate burst (tokens the bucket holds at most), 9 fairness separator ('' = off),
--       10 fairness window (how many of the oldest, and of the newest, due tasks it looks at),
--       11 the type's name (outbox entries of group reports)
-- Returns: { now_ms,
--            claimed: flat { id, due_score (string) } per task, oldest due first,
--            payloads: { payload|false } per claimed task, or false when none has one,
--            attempts: { attempt } per claimed task, or false when every one is 1,
--            dead_lettered: flat { id, reason } per task,
--            next_due_score (string)|nil, next_lease_expiry (string)|nil (both
--            nil when `limit` tasks were claimed: the caller claims again),
--            lease_expiry_ms, first_token, throttled_ms|nil, paused }: the
--            claimed tasks' tokens are first_token, first_token + 1, ... in
--            the order they are listed; throttled_ms is set when max_running,
--            the rate or a pause held the claim back: how long until it may
--            take more; paused is 1 while the type is paused.
-- Guarantees:
--   * a paused type hands out nothing and changes nothing (its tasks stay
--     due; schedules keep arriving); its running tasks finish.
--   * up to `limit` expired claims (and per-task leases of older hosts) are
--     reaped first: their tasks still leased go back to due at the earliest
--     due time of their claim (`now` for records of older hosts), at or
--     before their own, so they run in their turn, not behind everything that
--     fell due while they were lost; ZADD NX, so a schedule a client wrote
--     meanwhile wins; their tokens die, attempts stay.
--   * then up to `limit` members with score <= now, oldest first, leave `due`
--     atomically: no two claimers ever get the same task.
--   * one run of an id at a time: a due id whose earlier run still holds its
--     lease (a client scheduled it again meanwhile) is not handed out; it
--     waits in `due` until that lease's end, and goes back to its own due
--     time when the earlier run leaves its claim (the prelude's unhold).
--   * a due id that is also dead was re-scheduled by a client: it becomes a
--     fresh task (dead entry, attempts and errors dropped).
--   * ids over max_id_bytes and payloads over max_payload_bytes are dead-lettered
--     at once with a reason, and never handed out.
--   * every claimed task gets a unique token (INCRBY seq) and the attempt
--     number attempts + 1; the claim gets one lease until now + lease_ms, in
--     `claims`, and one record in `claimed` (holder, ids, attempts, which are
--     still leased), so a claim costs a few writes whatever its size. The
--     attempts hash only records attempts that ended without an ack (a
--     retry, a dead letter, or here a lease that expired), so a task that
--     succeeds first time never writes it.
--   * a claim id is never handed out while a claim of that id is in flight,
--     even when seq was deleted or lowered meanwhile (seq then moves past
--     every claim in flight).
--   * throttles, over every host: no more than max_running tasks are leased
--     at once, and no more than `rate` per second are handed out (a token
--     bucket in `throttle`, refilled by this server's clock); what is over
--     stays due, in due order.
--   * with fairness, the claim takes tasks in turns among the keys of their
--     ids (the part before the separator): one of each key, then a second,
--     ... so a key with thousands due holds another back by one claim at
--     most, as long as the other's tasks are among the `fair_window` oldest
--     or newest due (a task due now is among the newest) and the claim is
--     no smaller than the number of keys. Off, it costs nothing.
--   * a claimed occurrence of a recurring schedule arms the next one in this
--     same step (`name@<ms>` into `due`, from the times hosts computed): an
--     occurrence is armed once, whatever fails later. Missed occurrences
--     follow the schedule's policy: latest (the claimed one runs as the
--     latest missed occurrence, once), all, or skip (one missed by more than
--     a minute is dropped unrun).
--   * a workflow group's child that ends here (dead-lettered as oversize, or
--     a cancelled run whose host died) reports to its group through the
--     outbox in the same step (the prelude's report_ended).
--   * nothing is written unless every key holds its type and seq and the
--     counters are integers (the prelude's rule): a broken key fails the
--     claim with HGFAULT and every task stays where it was.
-- All times come from this server's TIME, so hosts never compare their own clocks.

local due, payload, leases, tokens = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local attempts, errors, dead, seq, stats = KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local recur, throttle, paused, cancels = KEYS[10], KEYS[11], KEYS[12], KEYS[13]
local claims, claimed, member, outbox = KEYS[14], KEYS[15], KEYS[16], KEYS[17]
local running, held = KEYS[18], KEYS[19]
local type_name = ARGV[11] or ''
-- One claim is one record in `claimed`: hosts ask for at most batch_size
-- (10,000), and any caller is held to 65535 so that a record stays bounded.
local limit = math.min(tonumber(ARGV[1]), 65535)
local max_running = tonumber(ARGV[6]) or 0
local rate = tonumber(ARGV[7]) or 0
local burst = tonumber(ARGV[8]) or 1
local fair_by = ARGV[9] or ''
local fair_window = tonumber(ARGV[10]) or 1000
local lease_ms = tonumber(ARGV[2])
local max_payload = tonumber(ARGV[3])
local max_id = tonumber(ARGV[4])
local holder = ARGV[5] or ''

-- Which keys exist (their type, or 'none'): most are usually absent, and
-- what is absent costs no further call. Kept up to date where this script
-- creates one. seq, stats and claimed are checked by reading their numbers.
local types = {}
local bad = check_keys({ { due, 'zset' }, { payload, 'hash' }, { claims, 'zset' }, { running, 'set' } }, types)
  or check_integer(seq) or check_counters(stats, { 'dead', 'cancelled' }) or check_counters(claimed, { 'leased' })
  or check_rare({
    { leases, 'zset' }, { tokens, 'hash' }, { attempts, 'hash' }, { errors, 'hash' }, { dead, 'zset' },
    { recur, 'hash' }, { throttle, 'hash' }, { paused, 'string' }, { cancels, 'hash' }, { member, 'hash' },
    { held, 'hash' },
  }, types)
if not bad and types[member] ~= 'none' then bad = check_keys({ { outbox, 'hash' } }) end
if bad then return bad end

local function present(key) return types[key] ~= 'none' end

local now = now_ms()
if present(paused) then
  -- Look again within a second: a pause given a length ends by itself (PX).
  return { now, {}, false, false, {}, false, false, now, 0, 1000, 1 }
end
-- '%d', not '%.0f': integer formatting skips glibc's float printer, which
-- showed in Redis's profile when it ran per task.
local now_s = string.format('%d', now)
local expiry = now + lease_ms
local expiry_s = string.format('%d', expiry)

-- 1. Reap expired leases back into due: read what they still hold (per-task
-- leases of older hosts, then whole claims), then write.
local lost_ids, lost_tokens, lost_attempts, lost_at = {}, {}, {}, {}
local reaped_legacy = {}
if present(leases) then
  reaped_legacy = redis.call('ZRANGEBYSCORE', leases, '-inf', now_s, 'LIMIT', 0, limit)
end
if #reaped_legacy > 0 then
  local held = multi_get('HMGET', tokens, reaped_legacy)
  for i, id in ipairs(reaped_legacy) do
    local token, attempt = false, false
    if held[i] then token, attempt = string.match(held[i], '^(%d+):(%d+)') end
    lost_ids[#lost_ids + 1] = id
    lost_tokens[#lost_tokens + 1] = token or false
    lost_attempts[#lost_attempts + 1] = attempt or false
    lost_at[#lost_at + 1] = now_s
  end
end
local reaped_claims = {}
if present(claims) then
  reaped_claims = redis.call('ZRANGEBYSCORE', claims, '-inf', now_s, 'LIMIT', 0, limit)
end
local reaped_leased = 0
for _, c in ipairs(reaped_claims) do
  local rec = read_claim(claimed, c)
  local ids = rec and claim_ids(rec)
  if ids then
    for k, id in ipairs(ids) do
      if string.byte(rec.live, k) == LIVE then
        lost_ids[#lost_ids + 1] = id
        lost_tokens[#lost_tokens + 1] = string.format('%d', tonumber(c) + k - 1)
        lost_attempts[#lost_attempts + 1] = tostring(rec.attempts[k] or 1)
        lost_at[#lost_at + 1] = rec.oldest and string.format('%d', math.min(rec.oldest, now)) or now_s
        reaped_leased = reaped_leased + 1
      end
    end
  else
    -- A record someone damaged names no ids to bring back; its count still
    -- leaves `leased`, or max_running would stay short for good.
    reaped_leased = reaped_leased + count_live(rec and rec.live or redis.call('HGET', claimed, c .. ':live'))
  end
end
if #lost_ids > 0 then
  -- Their runs are over: a schedule held for one of them is its own again.
  if present(running) then each_chunk(lost_ids, function(...) redis.call('SREM', running, ...) end) end
  if present(held) then unhold(held, due, lost_ids) end
  -- A run whose cancel was asked, and whose host died, is not run again.
  local marks = {}
  if present(cancels) then marks = multi_get('HMGET', cancels, lost_ids) end
  local zpairs = {}
  local spent = {}
  local stopped = 0
  for i, id in ipairs(lost_ids) do
    if lost_tokens[i] and marks[i] == lost_tokens[i] then
      redis.call('HDEL', cancels, id)
      if not redis.call('ZSCORE', due, id) then redis.call('HDEL', payload, id) end
      if present(member) then report_ended(member, outbox, type_name .. ':' .. lost_tokens[i], id, 'cancelled') end
      stopped = stopped + 1
    else
      zpairs[#zpairs + 1] = lost_at[i]
      zpairs[#zpairs + 1] = id
      -- The lost run counts as an attempt (a handler that kills its host must
      -- still end up dead-lettered after max_attempts).
      if lost_attempts[i] then
        spent[#spent + 1] = id
        spent[#spent + 1] = lost_attempts[i]
      end
    end
  end
  if stopped > 0 then redis.call('HINCRBY', stats, 'cancelled', stopped) end
  each_chunk(zpairs, function(...) redis.call('ZADD', due, 'NX', ...) end)
  if #spent > 0 then
    each_chunk(spent, function(...) redis.call('HSET', attempts, ...) end)
    types[attempts] = 'hash'
  end
end
if #reaped_legacy > 0 then
  each_chunk(reaped_legacy, function(...) redis.call('ZREM', leases, ...) end)
  each_chunk(reaped_legacy, function(...) redis.call('HDEL', tokens, ...) end)
end
for _, c in ipairs(reaped_claims) do
  redis.call('HDEL', claimed, c, c .. ':live')
  redis.call('ZREM', claims, c)
end
if reaped_leased > 0 then redis.call('HINCRBY', claimed, 'leased', -reaped_leased) end

-- 2. Throttles: what every host together may still take.
local throttled = false
if max_running > 0 then
  local room = max_running - (tonumber(redis.call('HGET', claimed, 'leased')) or 0) - redis.call('HLEN', tokens)
  if room < limit then
    limit = math.max(room, 0)
    -- A slot frees when any host settles: look again soon.
    if limit == 0 then throttled = 100 end
  end
end
local bucket = nil
if rate > 0 then
  local state = redis.call('HMGET', throttle, 'tokens', 'at')
  local tokens, at = tonumber(state[1]), tonumber(state[2])
  if not tokens or not at then tokens, at = burst, now end
  tokens = math.min(burst, tokens + math.max(now - at, 0) * rate / 1000)
  bucket = tokens
  if math.floor(tokens) < limit then
    limit = math.floor(tokens)
    if limit == 0 then throttled = math.max(math.ceil((1 - tokens) * 1000 / rate), 1) end
  end
end

-- 3. Take due tasks, oldest first; or, with fairness, in turns among the
-- keys of the ids found among the oldest and the newest `fair_window` due.
local rows = {}
if limit > 0 and fair_by ~= '' then
  local seen, groups, order = {}, {}, {}
  local function add(found)
    for i = 1, #found, 2 do
      local id = found[i]
      if not seen[id] then
        seen[id] = true
        local at = string.find(id, fair_by, 1, true)
        local group = at and string.sub(id, 1, at - 1) or id
        if not groups[group] then
          groups[group] = {}
          order[#order + 1] = group
        end
        local g = groups[group]
        g[#g + 1] = { id, found[i + 1] }
      end
    end
  end
  add(redis.call('ZRANGEBYSCORE', due, '-inf', now_s, 'WITHSCORES', 'LIMIT', 0, fair_window))
  add(redis.call('ZREVRANGEBYSCORE', due, now_s, '-inf', 'WITHSCORES', 'LIMIT', 0, fair_window))
  -- Oldest first within a key (the newest end was read backwards).
  for _, group in ipairs(order) do
    table.sort(groups[group], function(a, b)
      local sa, sb = tonumber(a[2]), tonumber(b[2])
      if sa ~= sb then return sa < sb end
      return a[1] < b[1]
    end)
  end
  local round = 1
  while #rows / 2 < limit do
    local took = false
    for _, group in ipairs(order) do
      local entry = groups[group][round]
      if entry and #rows / 2 < limit then
        rows[#rows + 1] = entry[1]
        rows[#rows + 1] = entry[2]
        took = true
      end
    end
    if not took then break end
    round = round + 1
  end
elseif limit > 0 then
  rows = redis.call('ZRANGEBYSCORE', due, '-inf', now_s, 'WITHSCORES', 'LIMIT', 0, limit)
end
-- `rows` (id, due score pairs) are what is handed out, unless a step below
-- changes the list; most claims go through with a loop over the ids only.
local function ids_of(flat)
  local out = {}
  for j = 1, #flat / 2 do out[j] = flat[2 * j - 1] end
  return out
end
local ids = ids_of(rows)

local payloads_out, attempts_out, dead_out = false, false, {}
local first_token = 0
if #ids > 0 then
  if fair_by == '' then
    -- The rows are the first #ids by rank: no per-member lookup.
    redis.call('ZREMRANGEBYRANK', due, 0, #ids - 1)
  else
    each_chunk(ids, function(...) redis.call('ZREM', due, ...) end)
  end

  -- One run of an id at a time (the prelude's unhold). The ids join
  -- `running` now: when every one is new to it (the rule), nothing more is
  -- asked. Otherwise some id is in it already: one a client scheduled again
  -- while an earlier run holds it, or one left behind by a damaged claim
  -- record. Only then are the claims in flight read, to tell which: an id
  -- an earlier run holds goes back into `due` at that lease's expiry (it
  -- stays in `running`, for that run), and `held` keeps the time it had.
  local joined = ids
  local added, expected = 0, #ids
  local join = ids
  if not present(running) then
    join = { RUNNING_TABLE_MEMBER }
    for j, id in ipairs(ids) do join[j + 1] = id end
    expected = expected + 1
    types[running] = 'set'
  end
  each_chunk(join, function(...) added = added + redis.call('SADD', running, ...) end)
  if added < expected then
    local wanted, holder_of = {}, {}
    for _, id in ipairs(ids) do wanted[id] = true end
    each_leased(claimed, function(c, _, id)
      if wanted[id] then holder_of[id] = c end
      return false
    end)
    local kept, due_pairs, held_pairs = {}, {}, {}
    for j, id in ipairs(ids) do
      local score = rows[2 * j]
      local e = holder_of[id] and redis.call('ZSCORE', claims, holder_of[id])
      if e then
        local until_at = string.format('%d', tonumber(e))
        -- Held before and untouched since: keep the time the client gave.
        local original = held_original(present(held) and redis.call('HGET', held, id), score) or score
        due_pairs[#due_pairs + 1] = until_at
        due_pairs[#due_pairs + 1] = id
        held_pairs[#held_pairs + 1] = id
        held_pairs[#held_pairs + 1] = original .. ':' .. until_at
      else
        kept[#kept + 1] = id
        kept[#kept + 1] = score
      end
    end
    if #due_pairs > 0 then
      each_chunk(due_pairs, function(...) redis.call('ZADD', due, ...) end)
      each_chunk(held_pairs, function(...) redis.call('HSET', held, ...) end)
      types[held] = 'hash'
      rows, ids = kept, ids_of(kept)
      joined = ids
    end
  end
  -- What the steps below take out of the claim (or rename) leaves `running` again, at the end.
  local reshaped = false

  -- 4. A claimed occurrence of a recurring schedule arms the next one.
  if present(recur) then
    local kept = {}
    for j, id in ipairs(ids) do
      local run_id, run_score = id, rows[2 * j]
      local at = string.find(id, '@', 1, true)
      if at then
        local name = string.sub(id, 1, at - 1)
        local f = redis.call('HMGET', recur, name .. ':armed', name .. ':then', name .. ':missed', name .. ':payload')
        if f[1] == id then
          local times, policy = parse_times(f[2]), f[3] or 'latest'
          local next_j = pick_next(times, now, policy)
          local moved = false
          if policy == 'latest' and next_j and times[next_j] <= now then
            -- More occurrences were missed: this run stands for the latest of them.
            run_score = string.format('%d', times[next_j])
            run_id = name .. '@' .. run_score
            moved = true
            next_j = times[next_j + 1] and (next_j + 1) or nil
          elseif policy == 'skip' and tonumber(run_score) < now - SKIP_GRACE_MS then
            run_id = false
            moved = true
          end
          if moved then
            redis.call('HDEL', payload, id)
            if run_id and f[4] and f[4] ~= '' then
              redis.call('HSET', payload, run_id, f[4])
              types[payload] = 'hash'
            end
          end
          if next_j then
            arm(recur, due, payload, name, times, next_j, f[4])
            if f[4] and f[4] ~= '' then types[payload] = 'hash' end
          else
            -- Nothing computed to arm yet: the hosts' sync arms the next one.
            redis.call('HSET', recur, name .. ':armed', run_id or id, name .. ':then', '')
          end
        end
      end
      if run_id then
        kept[#kept + 1] = run_id
        kept[#kept + 1] = run_score
      end
    end
    rows, ids = kept, ids_of(kept)
    reshaped = true
  end

  if present(dead) then
    local in_dead = multi_get('ZMSCORE', dead, ids)
    local revived = {}
    for j, s in ipairs(in_dead) do
      if s then revived[#revived + 1] = ids[j] end
    end
    if #revived > 0 then
      each_chunk(revived, function(...) redis.call('ZREM', dead, ...) end)
      each_chunk(revived, function(...) redis.call('HDEL', attempts, ...) end)
      each_chunk(revived, function(...) redis.call('HDEL', errors, ...) end)
    end
  end

  -- Tasks without a payload (a plain ZADD) leave the payload hash absent.
  local payloads = {}
  if present(payload) then payloads = multi_get('HMGET', payload, ids) end
  local oversize = false
  for j, id in ipairs(ids) do
    if #id > max_id or (payloads[j] and #payloads[j] > max_payload) then
      oversize = true
      break
    end
  end
  if oversize then
    local kept, kept_payloads = {}, {}
    local dead_pairs, error_pairs = {}, {}
    for j, id in ipairs(ids) do
      local reason = nil
      if #id > max_id then
        reason = string.format('id of %d bytes is over the %d-byte limit', #id, max_id)
      elseif payloads[j] and #payloads[j] > max_payload then
        reason = string.format('payload of %d bytes is over the %d-byte limit', #payloads[j], max_payload)
      end
      if reason then
        dead_pairs[#dead_pairs + 1] = now_s
        dead_pairs[#dead_pairs + 1] = id
        error_pairs[#error_pairs + 1] = id
        error_pairs[#error_pairs + 1] = reason
        dead_out[#dead_out + 1] = id
        dead_out[#dead_out + 1] = reason
        if present(member) then
          report_ended(member, outbox, type_name .. ':x' .. redis.call('INCRBY', seq, 1), id, 'dead')
        end
      else
        kept[#kept + 1] = id
        kept[#kept + 1] = rows[2 * j]
        kept_payloads[#kept_payloads + 1] = payloads[j] or false
      end
    end
    each_chunk(dead_pairs, function(...) redis.call('ZADD', dead, ...) end)
    each_chunk(error_pairs, function(...) redis.call('HSET', errors, ...) end)
    redis.call('HINCRBY', stats, 'dead', #dead_pairs / 2)
    rows, ids, payloads = kept, ids_of(kept), kept_payloads
    reshaped = true
  end
  if reshaped then
    local final, gone, new = {}, {}, {}
    for _, id in ipairs(ids) do final[id] = true end
    local before = {}
    for _, id in ipairs(joined) do
      before[id] = true
      if not final[id] then gone[#gone + 1] = id end
    end
    for _, id in ipairs(ids) do
      if not before[id] then new[#new + 1] = id end
    end
    each_chunk(gone, function(...) redis.call('SREM', running, ...) end)
    each_chunk(new, function(...) redis.call('SADD', running, ...) end)
  end

  if #ids > 0 then
    first_token = redis.call('INCRBY', seq, #ids) - #ids + 1
    if redis.call('HEXISTS', claimed, string.format('%d', first_token)) == 1 then
      -- seq went back (someone deleted or lowered it). Acks name a task by
      -- its claim id and index, so a claim id in flight is never handed out
      -- twice: move past every claim in flight.
      local top = 0
      local all = redis.call('HGETALL', claimed)
      for j = 1, #all, 2 do
        local c = tonumber(string.match(all[j], '^(%d+):live$'))
        if c then top = math.max(top, c + #all[j + 1] - 1) end
      end
      first_token = top + 1
      redis.call('SET', seq, string.format('%d', top + #ids))
    end
    if present(payload) then payloads_out = payloads end
    -- Usually absent: it holds only attempts that ended without an ack.
    -- The record keeps no attempts when all are first ones (a missing one is 1).
    local tried = {}
    if present(attempts) then
      local prior = multi_get('HMGET', attempts, ids)
      local any = false
      for j = 1, #ids do
        tried[j] = (tonumber(prior[j]) or 0) + 1
        any = any or prior[j] ~= false
      end
      if any then attempts_out = tried else tried = {} end
    end
    -- Where lost tasks go back to (see the reaping above): one number per
    -- claim, not one per task. Rows are oldest first unless fairness took turns.
    local oldest = tonumber(rows[2])
    if fair_by ~= '' then
      for j = 2, #ids do oldest = math.min(oldest, tonumber(rows[2 * j])) end
    end
    local claim_id = string.format('%d', first_token)
    redis.call('HSET', claimed, claim_id, cmsgpack.pack({ holder, ids, tried, oldest }),
      claim_id .. ':live', string.rep('1', #ids))
    redis.call('HINCRBY', claimed, 'leased', #ids)
    redis.call('ZADD', claims, expiry_s, claim_id)
  end
end
if bucket then
  redis.call('HSET', throttle, 'tokens', tostring(bucket - #ids), 'at', now_s)
end

-- A full claim means the caller claims again at once and ignores both.
local next_due, next_lease = false, false
if #ids < limit or limit == 0 then
  next_due = redis.call('ZRANGE', due, 0, 0, 'WITHSCORES')[2] or false
  next_lease = redis.call('ZRANGE', claims, 0, 0, 'WITHSCORES')[2] or false
  if present(leases) then
    local legacy = redis.call('ZRANGE', leases, 0, 0, 'WITHSCORES')[2]
    if legacy and (not next_lease or tonumber(legacy) < tonumber(next_lease)) then next_lease = legacy end
  end
end
return { now, rows, payloads_out, attempts_out, dead_out, next_due, next_lease, expiry, first_token, throttled, 0 }
