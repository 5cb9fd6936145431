-- extend: heartbeat; push the leases of running tasks out to now + lease_ms.
--
-- KEYS: 1 leases, 2 tokens, 3 cancels
-- ARGV: 1 lease_ms, then id, token pairs
-- Returns: { 1 = extended | 0 = fenced | 2 = extended, but cancelled (stop it) } per task, in order.
-- Guarantees: only the current token holder extends (fencing); ZADD XX never
-- re-creates a lease that was already reaped; nothing is written unless both
-- keys hold their types (HGFAULT otherwise).

local leases, tokens, cancels = KEYS[1], KEYS[2], KEYS[3]
local bad = check_keys({ { leases, 'zset' }, { tokens, 'hash' }, { cancels, 'hash' } })
if bad then return bad end
local now = now_ms()
local expiry = string.format('%.0f', now + tonumber(ARGV[1]))

local results = {}
for i = 2, #ARGV, 2 do
  local id, token = ARGV[i], ARGV[i + 1]
  local held = redis.call('HGET', tokens, id) -- "<token>:<attempt>[@<host id>]"
  if held and string.match(held, '^%d+') == token and redis.call('ZSCORE', leases, id) then
    redis.call('ZADD', leases, 'XX', expiry, id)
    -- A cancel whose message the holder missed is picked up here.
    results[#results + 1] = (redis.call('HGET', cancels, id) == token) and 2 or 1
  else
    results[#results + 1] = 0
  end
end
return results
