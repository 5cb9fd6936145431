-- prelude: helpers that the store puts in front of every script here (Redis
-- scripts cannot share code otherwise). Defines locals only; touches nothing.
--
-- THE RULE: every script checks everything that can fail before its first
-- write. Redis keeps the writes a script made before an error, so a script
-- failing half-way could leave a task neither due, nor leased, nor dead.
-- Each script therefore starts with check_keys (every key it touches holds
-- the type it expects, or does not exist) and check_counters / check_integer
-- (every stored number it will increment is one), returning the error they
-- give before anything else. What it then does cannot fail: its own numbers,
-- ids and scores it read itself. The error names the key, what it holds and
-- the fix; the host reports it as a fault of that type (code HGFAULT) and
-- tries again later, and the tasks stay exactly where they were.

-- An error reply the host reads as a fault of this type's data.
local function fault(text)
  return redis.error_reply('HGFAULT ' .. text)
end

-- The fault for `key`, which holds another type than `expected`.
local function wrong_type(key, expected)
  local actual = redis.call('TYPE', key)['ok']
  return fault(string.format(
    '%s holds a %s, not a %s: delete or rename it (DEL %s); its tasks resume by themselves once it is fixed',
    key, actual, expected, key))
end

-- `expected`: { { key, 'zset' | 'hash' | 'string' | 'stream' }, ... }.
-- Returns an error reply for the first key of another type, else nil. With
-- `types`, records each key's type there ('none' when absent), so the
-- script can skip what is not there without asking again (EXISTS).
local function check_keys(expected, types)
  for _, e in ipairs(expected) do
    local actual = redis.call('TYPE', e[1])['ok']
    if actual ~= 'none' and actual ~= e[2] then return wrong_type(e[1], e[2]) end
    if types then types[e[1]] = actual end
  end
  return nil
end

-- check_keys for keys that are usually all absent: one EXISTS for them
-- all, and a TYPE each only when some exist.
local function check_rare(expected, types)
  local keys = {}
  for i, e in ipairs(expected) do keys[i] = e[1] end
  if redis.call('EXISTS', unpack(keys)) > 0 then return check_keys(expected, types) end
  for _, key in ipairs(keys) do types[key] = 'none' end
  return nil
end

local function is_integer(v)
  return string.match(v, '^-?%d+$') ~= nil and #v <= 18
end

-- The string at `key` (if any) must be an integer (INCRBY would fail); this
-- also checks that it is a string.
local function check_integer(key)
  local v = redis.pcall('GET', key)
  if type(v) == 'table' and v.err then return wrong_type(key, 'string') end
  if v and not is_integer(v) then
    return fault(string.format(
      '%s holds %q, not an integer: delete it (DEL %s); its tasks resume by themselves once it is fixed', key, v, key))
  end
  return nil
end

-- The counters hash at `key`: each field in `fields` absent or an integer
-- (HINCRBY would fail); this also checks that it is a hash.
local function check_counters(key, fields)
  local values = redis.pcall('HMGET', key, unpack(fields))
  if values.err then return wrong_type(key, 'hash') end
  for i, v in ipairs(fields) do
    if values[i] and not is_integer(values[i]) then
      return fault(string.format(
        '%s field %s holds %q, not an integer: fix it (HSET %s %s 0); its tasks resume by themselves once it is fixed',
        key, v, values[i], key, v))
    end
  end
  return nil
end

-- This server's clock in ms: every time comes from Redis, never from a host.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Lua's unpack() has a stack limit, so variadic calls go out in chunks of
-- 1000 arguments (even, so field/value and score/member pairs never split).
local function each_chunk(items, fn)
  local n = #items
  local i = 1
  while i <= n do
    local j = math.min(i + 999, n)
    fn(unpack(items, i, j))
    i = j + 1
  end
end

-- One variadic read (HMGET, ZMSCORE) of many ids, chunked like each_chunk.
local function multi_get(cmd, key, ids)
  local out = {}
  each_chunk(ids, function(...)
    local r = redis.call(cmd, key, ...)
    for k = 1, #r do out[#out + 1] = r[k] end
  end)
  return out
end

-- Leases are held per claim, not per task. A claim takes the tokens
-- first .. first + n - 1; `first` is its id, and task k of it (from 1) has
-- token first + k - 1. The type keeps:
--   `claims`  ZSET  claim id → lease expiry (ms): one lease for the claim;
--   `claimed` HASH  claim id → msgpack { holder host id, { id... }, { attempt... }, oldest due }
--                   (attempts empty when all are first attempts; a missing one is 1;
--                   oldest due: the earliest due time among its tasks, absent in
--                   records of hosts before it was kept),
--                   "<claim id>:live" → one byte per task, '1' while it is leased,
--                   "leased" → how many tasks are leased under claims (every host).
-- Hosts before claim leases leased each task in `leases` (ZSET id → expiry)
-- and `tokens` (HASH id → "<token>:<attempt>[@<host id>]"); those are still
-- reaped, counted, shown and cancelled, never written.

-- How many tasks a claim's "<claim id>:live" bytes mark as leased.
local function count_live(live)
  return select(2, string.gsub(live or '', '1', ''))
end

-- A string's bytes as a table of numbers, and back (string.byte and
-- string.char take a bounded number of values at once, hence the chunks).
local function bytes_of(s)
  if #s <= 4000 then return { string.byte(s, 1, -1) } end
  local t = {}
  for i = 1, #s, 4000 do
    local part = { string.byte(s, i, math.min(i + 3999, #s)) }
    for j = 1, #part do t[i + j - 1] = part[j] end
  end
  return t
end

local function string_of(t)
  if #t <= 4000 then return string.char(unpack(t)) end
  local parts = {}
  for i = 1, #t, 4000 do parts[#parts + 1] = string.char(unpack(t, i, math.min(i + 3999, #t))) end
  return table.concat(parts)
end

local LIVE, LEFT = 49, 48 -- the bytes '1' (leased) and '0' (left the claim)

-- A claim record's packed value: holder, ids, attempts (an empty table
-- when every attempt is the first) and the earliest due time of its tasks
-- (nil when the record has none), or nil when it is unreadable.
local function decode_claim(packed)
  local ok, rec = pcall(cmsgpack.unpack, packed)
  if not ok or type(rec) ~= 'table' or type(rec[2]) ~= 'table' then return nil end
  return rec[1] or '', rec[2], type(rec[3]) == 'table' and rec[3] or nil,
    tonumber(rec[4])
end

-- Claim `c` as `claimed` holds it, or nil when it is gone: { packed, live
-- (its bytes as read), left (how many are leased), changed = 0 }. The ids
-- (claim_ids) and the live bytes as numbers (live_bytes) are worked out on
-- first need: acks of whole claims need neither.
local function read_claim(claimed, c)
  local f = redis.call('HMGET', claimed, c, c .. ':live')
  if not f[1] or not f[2] then return nil end
  return { packed = f[1], live = f[2], left = count_live(f[2]), changed = 0 }
end

-- The claim's ids (setting rec.holder, rec.attempts and rec.oldest, the
-- earliest due time or nil), or false when its record is unreadable (someone overwrote it).
local function claim_ids(rec)
  if rec.ids == nil then
    local holder, ids, attempts, oldest = decode_claim(rec.packed)
    if attempts then rec.holder, rec.ids, rec.attempts, rec.oldest = holder, ids, attempts, oldest else rec.ids = false end
  end
  return rec.ids
end

local function live_bytes(rec)
  if not rec.bytes then rec.bytes = bytes_of(rec.live) end
  return rec.bytes
end

-- Task `k` of claim record `rec` is no longer leased (written by write_claims).
local function leave_claim(rec, k)
  live_bytes(rec)[k] = LEFT
  rec.changed = rec.changed + 1
end

-- Claim `c` from the cache `recs` (claim id → record | false), read on first use.
local function cached_claim(recs, claimed, c)
  local rec = recs[c]
  if rec == nil then
    rec = read_claim(claimed, c) or false
    recs[c] = rec
  end
  return rec
end

-- Whether task `id` with `token` is still leased under claim `c`: its claim
-- record and index, else nil.
local function leased_in(recs, claimed, c, id, token)
  local rec = cached_claim(recs, claimed, c)
  if not rec or rec.all_left then return nil end
  local k = (tonumber(token) or -1) - (tonumber(c) or 0) + 1
  if k < 1 or live_bytes(rec)[k] ~= LIVE then return nil end
  local ids = claim_ids(rec)
  if ids and ids[k] == id then return rec, k end
  return nil
end

-- Takes the tasks that `mask` marks ('1' at index k = task k) out of claim
-- record `rec`, each only if it is still leased (fencing by claim and index:
-- a claim id is never reused). Returns the mask of those taken. A mask
-- equal to the live bytes (every task still leased) costs no per-task work.
local function take_masked(rec, mask)
  if not rec.bytes and mask == rec.live then
    rec.changed = rec.left
    rec.all_left = true
    return mask
  end
  local live, m = live_bytes(rec), bytes_of(mask)
  for k = 1, #m do
    if m[k] == LIVE then
      if live[k] == LIVE then
        live[k] = LEFT
        rec.changed = rec.changed + 1
      else
        m[k] = LEFT
      end
    end
  end
  return string_of(m)
end

-- Writes back the claims in `recs` whose tasks the caller took out with
-- leave_claim or take_masked: a claim with none left leased is dropped with
-- its lease. One call per operation, whatever the number of claims.
-- Writes: the caller checks first (the `leased` counter is an integer).
local function write_claims(claims, claimed, recs)
  local released = 0
  local kept, gone_fields, gone = {}, {}, {}
  for c, rec in pairs(recs) do
    if rec and rec.changed > 0 then
      released = released + rec.changed
      if rec.left > rec.changed then
        kept[#kept + 1] = c .. ':live'
        kept[#kept + 1] = string_of(rec.bytes)
      else
        gone_fields[#gone_fields + 1] = c
        gone_fields[#gone_fields + 1] = c .. ':live'
        gone[#gone + 1] = c
      end
    end
  end
  each_chunk(kept, function(...) redis.call('HSET', claimed, ...) end)
  each_chunk(gone_fields, function(...) redis.call('HDEL', claimed, ...) end)
  each_chunk(gone, function(...) redis.call('ZREM', claims, ...) end)
  if released > 0 then redis.call('HINCRBY', claimed, 'leased', -released) end
end

-- One run of an id at a time. `running` (SET of the ids leased under
-- claims) is joined by claim.lua for each task it hands out and left when
-- the task leaves its claim (settle, release, reaping). A claim that finds
-- a due id an earlier run still holds (a client scheduled the id again
-- while it ran) does not hand it out: it moves its due score to that
-- lease's expiry and records the score the client gave in `held` (HASH id
-- → "<original>:<bumped>"). When the earlier run leaves
-- its claim, unhold puts the original score back, so the new schedule runs
-- at once, in its turn; a score someone changed since (a postpone) stays,
-- and a ZREM stays a cancel. The entry goes either way.

-- Redis keeps a small set of short members as a listpack (7.2+, Valkey)
-- or an intset, where a write scans or moves every member: a hash of
-- claim ids kept that way cost about 4 µs of Redis time per task
-- (BENCHMARKS.md, round 12). One member longer than set-max-listpack-value
-- (64 bytes unless raised) makes `running` a hash table at once and for
-- good. It is no task that runs: a claim that finds it (a client used it as
-- an id) finds no run of it and hands it out.
local RUNNING_TABLE_MEMBER = '~' .. string.rep('-', 70) .. ' keeps this a hash table'

-- The time a client gave a held id: the original in its `held` entry, when
-- the id's score in `due` is still the bumped one (nobody moved it since);
-- nil otherwise, or when there is no entry.
local function held_original(entry, score)
  if not entry or not score then return nil end
  local original, bumped = string.match(entry, '^(.-):([^:]*)$')
  if original and tonumber(bumped) == tonumber(score) then return original end
  return nil
end

-- The earlier run of each of `ids` left its claim: give back the scores held
-- for them. Writes: the caller checks `held` and `due` first.
local function unhold(held, due, ids)
  if #ids == 0 then return end
  local entries = multi_get('HMGET', held, ids)
  local gone = {}
  for i, id in ipairs(ids) do
    if entries[i] then
      local original = held_original(entries[i], redis.call('ZSCORE', due, id))
      if original then redis.call('ZADD', due, 'XX', original, id) end
      gone[#gone + 1] = id
    end
  end
  each_chunk(gone, function(...) redis.call('HDEL', held, ...) end)
end

-- Calls fn(claim id, index, id, holder, attempt) for every task leased under
-- a claim, until fn returns true. Reads every claim in flight: for cancel,
-- show and holders, not for the path every task takes.
local function each_leased(claimed, fn)
  local all = redis.call('HGETALL', claimed)
  local fields = {}
  for i = 1, #all, 2 do fields[all[i]] = all[i + 1] end
  for c, packed in pairs(fields) do
    local live = fields[c .. ':live']
    local holder, ids, attempts = nil, nil, nil
    if live and string.match(c, '^%d+$') then holder, ids, attempts = decode_claim(packed) end
    for k, id in ipairs(ids or {}) do
      if string.sub(live, k, k) == '1' then
        if fn(c, k, id, holder, attempts and attempts[k] or 1) then return end
      end
    end
  end
end

-- Where task `id` runs now: token, attempt, holder and its claim id (nil for a
-- per-task lease of an older host), or nil when it is not leased.
local function find_leased(tokens, claimed, id)
  local held = redis.call('HGET', tokens, id)
  if held then
    local token, attempt = string.match(held, '^(%d+):(%d+)')
    return token, attempt, string.match(held, '@(.*)$') or '', nil
  end
  local found = nil
  each_leased(claimed, function(c, k, member, holder, attempt)
    if member ~= id then return false end
    found = { string.format('%d', tonumber(c) + k - 1), string.format('%d', attempt), holder, c }
    return true
  end)
  if not found then return nil end
  return found[1], found[2], found[3], found[4]
end

-- For dead_requeue and dead_purge. ARGV: 1 mode, 'all' (then 2 = most to take)
-- or 'ids' (then 2.. = ids). Takes the chosen ids that are dead out of `dead`,
-- drops their attempts and errors, and returns them. Writes: the caller checks first.
local function take_dead(dead, attempts, errors)
  local ids
  if ARGV[1] == 'all' then
    ids = redis.call('ZRANGE', dead, 0, tonumber(ARGV[2]) - 1)
  else
    ids = {}
    for i = 2, #ARGV do ids[#ids + 1] = ARGV[i] end
  end
  local taken = {}
  for _, id in ipairs(ids) do
    if redis.call('ZREM', dead, id) == 1 then
      redis.call('HDEL', attempts, id)
      redis.call('HDEL', errors, id)
      taken[#taken + 1] = id
    end
  end
  return taken
end

-- Recurring schedules (see recur_put.lua). A schedule `name` of a type keeps
-- in the type's `recur` hash: `name` its definition, `name:missed` its policy
-- for missed occurrences (latest | all | skip), `name:payload`, `name:armed`
-- the id of its armed occurrence (`name@<ms>`, a task in `due`) and
-- `name:then` the occurrence times after it, ascending, as hosts computed them.

-- How late an occurrence may be and still run under the `skip` policy.
local SKIP_GRACE_MS = 60000

-- "t1,t2,..." -> { t1, t2, ... } (numbers; anything else is left out).
local function parse_times(text)
  local out = {}
  if not text then return out end
  for part in string.gmatch(text, '[^,]+') do
    local t = tonumber(part)
    if t then out[#out + 1] = t end
  end
  return out
end

local function join_times(times, from)
  local parts = {}
  for j = from, #times do parts[#parts + 1] = string.format('%d', times[j]) end
  return table.concat(parts, ',')
end

-- Which of `times` (ascending) to arm next at `now`, by `policy`: the index
-- of the occurrence to arm, or nil when none is left.
--   latest: the latest one that is already due (it runs once for all the
--           missed ones), else the first one to come;
--   all:    the first one, due or not (missed ones run one after another);
--   skip:   the first one not missed by more than SKIP_GRACE_MS.
local function pick_next(times, now, policy)
  if policy == 'all' then
    return times[1] and 1 or nil
  elseif policy == 'skip' then
    for j, t in ipairs(times) do
      if t >= now - SKIP_GRACE_MS then return j end
    end
    return nil
  end
  local pick = nil
  for j, t in ipairs(times) do
    if t <= now then pick = j elseif not pick then return j else return pick end
  end
  return pick
end

-- Arms occurrence `t` of schedule `name`: a task `name@t` in `due` with the
-- schedule's payload; `recur` records it and keeps the times after it.
-- Writes: the caller checks every key first.
local function arm(recur, due, payload, name, times, j, body)
  local t = string.format('%d', times[j])
  local id = name .. '@' .. t
  redis.call('ZADD', due, 'NX', t, id)
  if body and body ~= '' then
    redis.call('HSET', payload, id, body)
  end
  redis.call('HSET', recur, name .. ':armed', id, name .. ':then', join_times(times, j + 1))
  return id
end

-- Workflows (see group_join.lua): a group's child of type T is marked in
-- `P:{T}:member` (HASH id → "<callback type>\n<group id>\n<join number>").
-- When the child ends (succeeded, dead-lettered or cancelled), the script
-- that ended it drops the mark and writes a report into T's outbox, in the
-- same step: "<entry>:report" → "<outcome>\n<callback type>\n<group id>\n
-- <join number>\n<id>". The host delivers it to the group's slot
-- (group_reports.lua), where it counts once: only while the child is pending
-- with that join number. `entry` must be unique forever in T's outbox (a token).
-- The value of a child's report entry (decoded by the host's decode_report).
local function report_text(outcome, membership, id)
  return outcome .. '\n' .. membership .. '\n' .. id
end

local function report_ended(member, outbox, entry, id, outcome, membership)
  local g = membership or redis.call('HGET', member, id)
  if not g then return false end
  redis.call('HDEL', member, id)
  redis.call('HSET', outbox, entry .. ':report', report_text(outcome, g, id))
  return true
end

-- Workflow graphs (graph_open.lua): a node of type T is marked in
-- `P:{T}:member` like a group's child, with "\31<home type>\n<graph id>\n
-- <node index>" (the leading unit separator, which no type name has, tells
-- the host that the report goes to a graph). Its schedule travels in the
-- home type's outbox as "<len>\n<mark><follow-up>" (the host's
-- decode_graph_node), due `now_text`, create-only.
local function graph_node_entry(home, gid, index, node_type, id, payload, now_text)
  local mark = '\31' .. home .. '\n' .. gid .. '\n' .. index
  return #mark .. '\n' .. mark .. node_type .. '\n' .. now_text .. '\n' .. #id .. '\n' .. id .. payload
end

-- A node as the graph's `nodes` hash holds it.
local function graph_node_json(node)
  return cjson.encode(node)
end

-- Marks graph `gid` (its keys `key`, `nodes_key`) done if no node waits or is
-- scheduled: out of C's `graphs` index, counted in C's graphs_completed (and
-- graphs_failed when a node did not succeed), kept 7 days for `graph show`.
-- The caller has checked the keys' types and the counters. Returns whether it did.
local function graph_finish(key, nodes_key, graphs, stats, gid, now)
  local counts = redis.call('HMGET', key, 'waiting', 'scheduled', 'dead', 'cancelled', 'skipped')
  if tonumber(counts[1] or '0') ~= 0 or tonumber(counts[2] or '0') ~= 0 then return false end
  local failed = tonumber(counts[3] or '0') + tonumber(counts[4] or '0') + tonumber(counts[5] or '0')
  redis.call('HSET', key, 'state', 'done', 'completed_ms', now)
  redis.call('ZREM', graphs, gid)
  redis.call('HINCRBY', stats, 'graphs_completed', 1)
  if failed > 0 then redis.call('HINCRBY', stats, 'graphs_failed', 1) end
  redis.call('PEXPIRE', key, 7 * 86400000)
  redis.call('PEXPIRE', nodes_key, 7 * 86400000)
  return true
end

-- Completes workflow group `gid` of callback type C (sealed, nothing pending):
-- schedules its callback due now with a JSON summary as its payload (the
-- counts, up to 100 failed children, the opener's payload under "payload"),
-- or skips it (when = success and a child failed: counted in groups_failed),
-- or keeps a waiting or dead callback task (create-only); then state done,
-- out of C's `groups` index, counted in groups_completed, and the group's
-- keys kept for 7 days for `hourglass group show`. The caller has checked
-- every key's type and the counters. Returns 'callback', 'skipped' or 'kept'.
local function complete_group(gid, group, failed, groups, stats, cb_due, cb_payload, cb_dead)
  local now = string.format('%d', now_ms())
  local g = redis.call('HGETALL', group)
  local f = {}
  for i = 1, #g, 2 do f[g[i]] = g[i + 1] end
  local ok, dead_n, cancelled_n = tonumber(f.succeeded or '0'), tonumber(f.dead or '0'), tonumber(f.cancelled or '0')
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
  return fired
end
