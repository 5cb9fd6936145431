-- extend: heartbeat; push the leases of running tasks out to now + lease_ms.
--
-- KEYS: 1 claims, 2 claimed (see the prelude), 3 cancels
-- ARGV: 1 lease_ms, then id, token, claim id triples
-- Returns: { 1 = extended | 0 = fenced | 2 = extended, but cancelled (stop it) } per task, in order.
-- Guarantees: only a task still leased under its claim and token is extended
-- (fencing); a task's lease is its claim's, so the claim is extended, once per
-- call; a reaped claim is never re-created; nothing is written unless every
-- key holds its type (HGFAULT otherwise).

local claims, claimed, cancels = KEYS[1], KEYS[2], KEYS[3]
local bad = check_keys({ { claims, 'zset' }, { claimed, 'hash' }, { cancels, 'hash' } })
if bad then return bad end
local now = now_ms()
local expiry = string.format('%d', now + tonumber(ARGV[1]))
local has_cancels = redis.call('EXISTS', cancels) == 1

local recs, extended = {}, {}
local results = {}
for i = 2, #ARGV, 3 do
  local id, token, c = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  if leased_in(recs, claimed, c, id, token) then
    if not extended[c] then
      redis.call('ZADD', claims, 'XX', expiry, c)
      extended[c] = true
    end
    -- A cancel whose message the holder missed is picked up here.
    results[#results + 1] = (has_cancels and redis.call('HGET', cancels, id) == token) and 2 or 1
  else
    results[#results + 1] = 0
  end
end
return results
