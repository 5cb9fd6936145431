-- cancel: cancel a task: remove it when it is scheduled; when it is running, ask its host to stop it.
--
-- KEYS: 1 due, 2 payload, 3 tokens (per-task leases of older hosts), 4 claimed (see the prelude),
--       5 cancels (HASH id -> the lease token to stop), 6 member (workflow marks), 7 outbox, 8 seq,
--       9 held (see the prelude's unhold), 10 progress (id -> latest progress reported)
-- ARGV: 1 id, 2 the type's name, 3 the channel hosts listen on for cancels
-- Returns: { 'scheduled', reported } when it was removed from `due` (with its
--          payload, its progress, and the time held for it if it waited for an earlier run); reported is '1' when it was a workflow group's child: its
--          group is told it was cancelled, through the outbox (report_ended);
--          { 'running', holder host id } when it runs under a lease: its
--          token is recorded in `cancels` and a message "<type>\n<token>\n<id>"
--          is published, so the holder interrupts it at once (or at its next
--          lease renewal, if it missed the message) and settles it as
--          cancelled, never retried; { 'unknown' } when it is neither.
-- Guarantees: one atomic step; nothing is written unless every key holds
-- its type (HGFAULT otherwise).

local due, payload, tokens, claimed, cancels = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local member, outbox, seq, held, progress = KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local id = ARGV[1]
local bad = check_keys({ { due, 'zset' }, { payload, 'hash' }, { tokens, 'hash' }, { claimed, 'hash' },
  { cancels, 'hash' }, { member, 'hash' }, { outbox, 'hash' }, { held, 'hash' }, { progress, 'hash' } })
  or check_integer(seq)
if bad then return bad end
if redis.call('ZSCORE', due, id) then
  redis.call('ZREM', due, id)
  redis.call('HDEL', payload, id)
  redis.call('HDEL', held, id)
  redis.call('HDEL', progress, id)
  local reported = false
  if redis.call('HEXISTS', member, id) == 1 then
    reported = report_ended(member, outbox, ARGV[2] .. ':x' .. redis.call('INCRBY', seq, 1), id, 'cancelled')
  end
  return { 'scheduled', reported and '1' or '0' }
end
local token, _, holder = find_leased(tokens, claimed, id)
if not token then return { 'unknown' } end
redis.call('HSET', cancels, id, token)
-- Marks outlive any lease: a day is plenty, and the hash never grows for good.
redis.call('PEXPIRE', cancels, 86400000)
redis.call('PUBLISH', ARGV[3], ARGV[2] .. '\n' .. token .. '\n' .. id)
return { 'running', holder }
