-- release: graceful shutdown; hand leased tasks back so any host can run them now.
--
-- KEYS: 1 leases, 2 tokens, 3 due
-- ARGV: id, token pairs
-- Returns: how many tasks were handed back.
-- Guarantees: fenced (a stale token changes nothing); the task is due at once
-- (ZADD NX: a client schedule wins); the unfinished attempt is not counted
-- (it only lived in the tokens hash, which forgets it here); nothing is written
-- unless every key holds its type (HGFAULT otherwise: the leases expire instead).

local leases, tokens, due = KEYS[1], KEYS[2], KEYS[3]
local bad = check_keys({ { leases, 'zset' }, { tokens, 'hash' }, { due, 'zset' } })
if bad then return bad end
local now = string.format('%.0f', now_ms())

local released = 0
for i = 1, #ARGV, 2 do
  local id, token = ARGV[i], ARGV[i + 1]
  local held = redis.call('HGET', tokens, id) -- "<token>:<attempt>[@<host id>]"
  if held and string.match(held, '^%d+') == token then
    redis.call('ZREM', leases, id)
    redis.call('HDEL', tokens, id)
    redis.call('ZADD', due, 'NX', now, id)
    released = released + 1
  end
end
return released
