-- stats: one consistent snapshot of a type's queue sizes and counters (read-only).
--
-- KEYS: 1 due, 2 leases, 3 dead, 4 stats
-- ARGV: none
-- Returns: { due_now, due_total, in_flight, dead, succeeded|nil, failed|nil, retried|nil, dead_total|nil }
-- Guarantees: "now" is this server's TIME, the same clock claims use.

local now = string.format('%.0f', now_ms())
local c = redis.call('HMGET', KEYS[4], 'succeeded', 'failed', 'retried', 'dead')
return {
  redis.call('ZCOUNT', KEYS[1], '-inf', now),
  redis.call('ZCARD', KEYS[1]),
  redis.call('ZCARD', KEYS[2]),
  redis.call('ZCARD', KEYS[3]),
  c[1], c[2], c[3], c[4],
}
