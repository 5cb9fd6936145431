-- schedule: what `hourglass schedule` writes, as an application would: a task's payload and due time.
--
-- KEYS: 1 due, 2 payload
-- ARGV: 1 id, 2 due_ms, 3 payload, 4 has_payload ('1' | '0'), 5 mode: 'upsert' (ZADD),
--       'if-absent' (ZADD NX), 'only-later' (ZADD GT) or 'only-earlier' (ZADD LT)
-- Returns: 1 when the due time was written, 0 when the mode kept the existing one.
-- Guarantees: one atomic step; the payload is written only with the due time
-- (so --if-absent never replaces the first schedule's payload); nothing is
-- written unless both keys hold their types (HGFAULT otherwise).

local due, payload = KEYS[1], KEYS[2]
local id, due_ms, body, has_body, mode = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local bad = check_keys({ { due, 'zset' }, { payload, 'hash' } })
if bad then return bad end

local flags = { ['upsert'] = {}, ['if-absent'] = { 'NX' }, ['only-later'] = { 'GT' }, ['only-earlier'] = { 'LT' } }
local args = flags[mode]
local written
if mode == 'upsert' then
  redis.call('ZADD', due, due_ms, id)
  written = 1
else
  -- CH counts a changed score too: 1 when this call's due time is now the task's.
  written = redis.call('ZADD', due, args[1], 'CH', due_ms, id)
end
if written == 1 then
  if has_body == '1' then
    redis.call('HSET', payload, id, body)
  else
    redis.call('HDEL', payload, id)
  end
end
return written
