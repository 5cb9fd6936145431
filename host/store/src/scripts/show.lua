-- show: where one task is and what is known about it, in one consistent snapshot (read-only).
--
-- KEYS: 1 due, 2 leases, 3 tokens (both: per-task leases of older hosts), 4 attempts, 5 errors,
--       6 dead, 7 payload, 8 claims, 9 claimed (see the prelude), 10 member (workflow marks),
--       11 held (see the prelude's unhold), 12 progress (id -> latest progress reported, JSON)
-- ARGV: 1 id, 2 most payload bytes to return
-- Returns: { now_ms, due_score | false, lease_expiry | false, token_entry | false,
--            attempts | false, error | false, died_score | false, payload_len, payload_head | false,
--            group | false, progress | false } (group: "<callback type>\n<group id>" of a
--            group's child; progress: as its handler last reported it, JSON)
--          where token_entry is "<token>:<attempt>[@<host id>]" while a lease holds
--          (lease_expiry is its claim's; the scan of claims in flight is for
--          this command, not for the path every task takes),
--          and payload_head the payload's first ARGV[2] bytes; due_score of a
--          schedule that waits for the id's earlier run is the time it was given
--          (its score in `due` is that run's lease expiry until the run ends).
-- Guarantees: reads only; "now" is this server's TIME, the clock claims compare
-- due scores with; the payload is cut here, so a large one is never sent
-- whole; a key of the wrong type is an HGFAULT naming it.

local due, leases, tokens, attempts = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local errors, dead, payload, claims, claimed = KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local bad = check_keys({
  { due, 'zset' }, { leases, 'zset' }, { tokens, 'hash' }, { attempts, 'hash' },
  { errors, 'hash' }, { dead, 'zset' }, { payload, 'hash' }, { claims, 'zset' }, { claimed, 'hash' },
  { KEYS[10], 'hash' }, { KEYS[11], 'hash' }, { KEYS[12], 'hash' },
})
if bad then return bad end
local id, most = ARGV[1], tonumber(ARGV[2])
local body = redis.call('HGET', payload, id)
local token, attempt, holder, claim = find_leased(tokens, claimed, id)
local due_score = redis.call('ZSCORE', due, id)
due_score = held_original(due_score and redis.call('HGET', KEYS[11], id), due_score) or due_score
local entry, lease = false, false
if token then
  entry = token .. ':' .. attempt .. (holder ~= '' and ('@' .. holder) or '')
  if claim then lease = redis.call('ZSCORE', claims, claim) else lease = redis.call('ZSCORE', leases, id) end
end
return {
  string.format('%d', now_ms()),
  due_score,
  lease,
  entry,
  redis.call('HGET', attempts, id),
  redis.call('HGET', errors, id),
  redis.call('ZSCORE', dead, id),
  body and #body or 0,
  body and string.sub(body, 1, most) or false,
  redis.call('HGET', KEYS[10], id),
  redis.call('HGET', KEYS[12], id),
}
