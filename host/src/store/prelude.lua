-- prelude: helpers that store.rs puts in front of every script here (Redis
-- scripts cannot share code otherwise). Defines locals only; touches nothing.

-- This server's clock in ms: every time comes from Redis, never from a host.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Lua's unpack() has a stack limit, so variadic calls go out in chunks of
-- 1000 arguments (even, so field/value and score/member pairs never split).
local function each_chunk(items, fn)
  local n = #items
  local i = 1
  while i <= n do
    local j = math.min(i + 999, n)
    fn(unpack(items, i, j))
    i = j + 1
  end
end

-- One variadic read (HMGET, ZMSCORE) of many ids, chunked like each_chunk.
local function multi_get(cmd, key, ids)
  local out = {}
  each_chunk(ids, function(...)
    local r = redis.call(cmd, key, ...)
    for k = 1, #r do out[#out + 1] = r[k] end
  end)
  return out
end

-- For dead_requeue and dead_purge. ARGV: 1 mode, 'all' (then 2 = most to take)
-- or 'ids' (then 2.. = ids). Takes the chosen ids that are dead out of `dead`,
-- drops their attempts and errors, and returns them.
local function take_dead(dead, attempts, errors)
  local ids
  if ARGV[1] == 'all' then
    ids = redis.call('ZRANGE', dead, 0, tonumber(ARGV[2]) - 1)
  else
    ids = {}
    for i = 2, #ARGV do ids[#ids + 1] = ARGV[i] end
  end
  local taken = {}
  for _, id in ipairs(ids) do
    if redis.call('ZREM', dead, id) == 1 then
      redis.call('HDEL', attempts, id)
      redis.call('HDEL', errors, id)
      taken[#taken + 1] = id
    end
  end
  return taken
end

