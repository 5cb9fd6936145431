-- pause: stop every host from claiming tasks of one type, for a while or until resumed.
--
-- KEYS: 1 paused, 2 due
-- ARGV: 1 how long in ms (0 = until resumed)
-- Returns: the pause's end in ms since the epoch (this server's clock), or 0 for "until resumed".
-- Guarantees: claims of the type hand out nothing while the key exists
-- (claim.lua); a pause with a length ends by itself (PX), and a new pause
-- replaces the old one; schedules keep arriving; nothing is written unless
-- both keys hold their types (HGFAULT otherwise).

local bad = check_keys({ { KEYS[1], 'string' }, { KEYS[2], 'zset' } })
if bad then return bad end
local ms = tonumber(ARGV[1])
if ms > 0 then
  local ends = now_ms() + ms
  redis.call('SET', KEYS[1], string.format('%d', ends), 'PX', ms)
  return ends
end
redis.call('SET', KEYS[1], '0')
return 0
