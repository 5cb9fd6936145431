-- presence: host heartbeats in one hash (no hash tag: a single-key script, any slot).
--
-- KEYS: 1 hosts (HASH host id → "<last_seen_ms> <state> <info json>")
-- ARGV: 1 op ('beat' | 'list'); for 'beat': 2 host id, 3 state ('up' | 'stopped'),
--       4 info json, 5 forget_after_ms
-- Returns: 'beat' → now_ms; 'list' → { now_ms, flat { id, value } }
-- Guarantees: last_seen is this server's TIME, so hosts never compare their own
-- clocks; a beat forgets hosts silent for longer than forget_after_ms; nothing
-- is written unless the key is a hash (HGFAULT otherwise).

local bad = check_keys({ { KEYS[1], 'hash' } })
if bad then return bad end
local now = now_ms()
local now_s = string.format('%d', now)

if ARGV[1] == 'beat' then
  redis.call('HSET', KEYS[1], ARGV[2], now_s .. ' ' .. ARGV[3] .. ' ' .. ARGV[4])
  local forget = tonumber(ARGV[5])
  local all = redis.call('HGETALL', KEYS[1])
  for i = 1, #all, 2 do
    local seen = tonumber(string.match(all[i + 1], '^(%d+)'))
    if seen and now - seen > forget then
      redis.call('HDEL', KEYS[1], all[i])
    end
  end
  return now
end
return { now, redis.call('HGETALL', KEYS[1]) }
