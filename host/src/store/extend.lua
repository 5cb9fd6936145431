-- extend: heartbeat; push the leases of running tasks out to now + lease_ms.
--
-- KEYS: 1 leases, 2 tokens
-- ARGV: 1 lease_ms, then id, token pairs
-- Returns: { 1 = extended | 0 = fenced } per task, in order.
-- Guarantees: only the current token holder extends (fencing); ZADD XX never
-- re-creates a lease that was already reaped.

local leases, tokens = KEYS[1], KEYS[2]
local now = now_ms()
local expiry = string.format('%.0f', now + tonumber(ARGV[1]))

local results = {}
for i = 2, #ARGV, 2 do
  local id, token = ARGV[i], ARGV[i + 1]
  local held = redis.call('HGET', tokens, id) -- "<token>:<attempt>[@<host id>]"
  if held and string.match(held, '^%d+') == token and redis.call('ZSCORE', leases, id) then
    redis.call('ZADD', leases, 'XX', expiry, id)
    results[#results + 1] = 1
  else
    results[#results + 1] = 0
  end
end
return results
