-- release: graceful shutdown; hand leased tasks back so any host can run them now.
--
-- KEYS: 1 claims, 2 claimed (see the prelude), 3 due, 4 running, 5 held (both: see the prelude's unhold)
-- ARGV: id, token, claim id triples
-- Returns: how many tasks were handed back.
-- Guarantees: fenced (a task no longer leased under that claim and token
-- changes nothing); the task is due at once (ZADD NX: a client schedule wins)
-- and leaves its claim (the claim and its lease go with its last task), and a
-- schedule held for it gets its own time back; the
-- unfinished attempt is not counted (only the claim recorded it); nothing is
-- written unless every key holds its type and the `leased` counter is an
-- integer (HGFAULT otherwise: the leases expire instead).

local claims, claimed, due, running, held = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local bad = check_keys({ { claims, 'zset' }, { claimed, 'hash' }, { due, 'zset' }, { running, 'set' },
  { held, 'hash' } })
  or check_counters(claimed, { 'leased' })
if bad then return bad end
local now = string.format('%d', now_ms())

local recs = {}
local back, left = {}, {}
for i = 1, #ARGV, 3 do
  local id = ARGV[i]
  local rec, k = leased_in(recs, claimed, ARGV[i + 2], id, ARGV[i + 1])
  if rec then
    leave_claim(rec, k)
    back[#back + 1] = now
    back[#back + 1] = id
    left[#left + 1] = id
  end
end
each_chunk(left, function(...) redis.call('SREM', running, ...) end)
unhold(held, due, left)
each_chunk(back, function(...) redis.call('ZADD', due, 'NX', ...) end)
write_claims(claims, claimed, recs)
return #back / 2
