-- show: where one task is and what is known about it, in one consistent snapshot (read-only).
--
-- KEYS: 1 due, 2 leases, 3 tokens, 4 attempts, 5 errors, 6 dead, 7 payload
-- ARGV: 1 id, 2 most payload bytes to return
-- Returns: { now_ms, due_score | false, lease_expiry | false, token_entry | false,
--            attempts | false, error | false, died_score | false, payload_len, payload_head | false }
--          where token_entry is "<token>:<attempt>[@<host id>]" while a lease holds,
--          and payload_head the payload's first ARGV[2] bytes.
-- Guarantees: reads only; "now" is this server's TIME, the clock claims compare
-- due scores with; the payload is cut here, so a large one is never sent
-- whole; a key of the wrong type is an HGFAULT naming it.

local due, leases, tokens, attempts = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local errors, dead, payload = KEYS[5], KEYS[6], KEYS[7]
local bad = check_keys({
  { due, 'zset' }, { leases, 'zset' }, { tokens, 'hash' }, { attempts, 'hash' },
  { errors, 'hash' }, { dead, 'zset' }, { payload, 'hash' },
})
if bad then return bad end
local id, most = ARGV[1], tonumber(ARGV[2])
local body = redis.call('HGET', payload, id)
return {
  string.format('%d', now_ms()),
  redis.call('ZSCORE', due, id),
  redis.call('ZSCORE', leases, id),
  redis.call('HGET', tokens, id),
  redis.call('HGET', attempts, id),
  redis.call('HGET', errors, id),
  redis.call('ZSCORE', dead, id),
  body and #body or 0,
  body and string.sub(body, 1, most) or false,
}
