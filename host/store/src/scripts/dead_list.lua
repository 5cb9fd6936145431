-- dead_list: the oldest dead-lettered tasks with why they died (read-only).
--
-- KEYS: 1 dead, 2 errors, 3 attempts, 4 payload
-- ARGV: 1 limit
-- Returns: flat { id, died_ms (string), error|nil, attempts|nil, payload_len } per task.
-- Guarantees: one consistent snapshot; payloads are measured, never sent; a
-- key of the wrong type is an HGFAULT naming it.

local dead, errors, attempts, payload = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local bad = check_keys({ { dead, 'zset' }, { errors, 'hash' }, { attempts, 'hash' }, { payload, 'hash' } })
if bad then return bad end
local rows = redis.call('ZRANGE', dead, 0, tonumber(ARGV[1]) - 1, 'WITHSCORES')
local out = {}
for i = 1, #rows, 2 do
  local id = rows[i]
  out[#out + 1] = id
  out[#out + 1] = rows[i + 1]
  out[#out + 1] = redis.call('HGET', errors, id)
  out[#out + 1] = redis.call('HGET', attempts, id)
  out[#out + 1] = redis.call('HSTRLEN', payload, id)
end
return out
