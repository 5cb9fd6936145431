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

-- `expected`: { { key, 'zset' | 'hash' | 'string' | 'stream' }, ... }.
-- Returns an error reply for the first key of another type, else nil.
local function check_keys(expected)
  for _, e in ipairs(expected) do
    local actual = redis.call('TYPE', e[1])['ok']
    if actual ~= 'none' and actual ~= e[2] then
      return fault(string.format(
        '%s holds a %s, not a %s: delete or rename it (DEL %s); its tasks resume by themselves once it is fixed',
        e[1], actual, e[2], e[1]))
    end
  end
  return nil
end

local function is_integer(v)
  return string.match(v, '^-?%d+$') ~= nil and #v <= 18
end

-- The string at `key` (if any) must be an integer (INCRBY would fail).
local function check_integer(key)
  local v = redis.call('GET', key)
  if v and not is_integer(v) then
    return fault(string.format(
      '%s holds %q, not an integer: delete it (DEL %s); its tasks resume by themselves once it is fixed', key, v, key))
  end
  return nil
end

-- The counters hash at `key`: each field in `fields` absent or an integer (HINCRBY would fail).
local function check_counters(key, fields)
  local values = redis.call('HMGET', key, unpack(fields))
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

-- Leases are held per claim, not per task. A claim takes the tokens
-- first .. first + n - 1; `first` is its id, and task k of it (from 1) has
-- token first + k - 1. The type keeps:
--   `claims`  ZSET  claim id → lease expiry (ms): one lease for the claim;
--   `claimed` HASH  claim id → msgpack { holder host id, { id... }, { attempt... } },
--                   "<claim id>:live" → one byte per task, '1' while it is leased,
--                   "leased" → how many tasks are leased under claims (every host).
-- Hosts before claim leases leased each task in `leases` (ZSET id → expiry)
-- and `tokens` (HASH id → "<token>:<attempt>[@<host id>]"); those are still
-- reaped, counted, shown and cancelled, never written.

-- How many tasks a claim's "<claim id>:live" bytes mark as leased.
local function count_live(live)
  return select(2, string.gsub(live or '', '1', ''))
end

-- A claim record's packed value: holder, ids and attempts (nil when it is not
-- a table), or nil when it is unreadable.
local function decode_claim(packed)
  local ok, rec = pcall(cmsgpack.unpack, packed)
  if not ok or type(rec) ~= 'table' or type(rec[2]) ~= 'table' then return nil end
  return rec[1] or '', rec[2], type(rec[3]) == 'table' and rec[3] or nil
end

-- Claim `c` as `claimed` holds it: { holder, ids, attempts, live = { '0'|'1' ... },
-- left (how many are leased), changed = 0 }, or nil when it is gone or unreadable.
local function read_claim(claimed, c)
  local f = redis.call('HMGET', claimed, c, c .. ':live')
  if not f[1] or not f[2] then return nil end
  local holder, ids, attempts = decode_claim(f[1])
  if not attempts then return nil end
  local live = {}
  for k = 1, #f[2] do live[k] = string.sub(f[2], k, k) end
  return { holder = holder, ids = ids, attempts = attempts, live = live, left = count_live(f[2]), changed = 0 }
end

-- Task `k` of claim record `rec` is no longer leased (written by write_claims).
local function leave_claim(rec, k)
  rec.live[k] = '0'
  rec.changed = rec.changed + 1
end

-- Whether task `id` with `token` is still leased under claim `c`: its claim
-- record and index, else nil. `recs` caches the records read (claim id → record | false).
local function leased_in(recs, claimed, c, id, token)
  local rec = recs[c]
  if rec == nil then
    rec = read_claim(claimed, c) or false
    recs[c] = rec
  end
  if not rec then return nil end
  local k = (tonumber(token) or -1) - (tonumber(c) or 0) + 1
  if k >= 1 and rec.ids[k] == id and rec.live[k] == '1' then return rec, k end
  return nil
end

-- Writes back the claims in `recs` whose tasks the caller took out with
-- leave_claim: a claim with none left leased is dropped with its lease.
-- Writes: the caller checks first (the `leased` counter is an integer).
local function write_claims(claims, claimed, recs)
  local released = 0
  for c, rec in pairs(recs) do
    if rec and rec.changed > 0 then
      released = released + rec.changed
      if rec.left > rec.changed then
        redis.call('HSET', claimed, c .. ':live', table.concat(rec.live))
      else
        redis.call('HDEL', claimed, c, c .. ':live')
        redis.call('ZREM', claims, c)
      end
    end
  end
  if released > 0 then redis.call('HINCRBY', claimed, 'leased', -released) end
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
