-- holders: how many leases of one type each host holds (read-only).
--
-- KEYS: 1 tokens (per-task leases of older hosts: HASH id → "<token>:<attempt>[@<host id>]"),
--       2 claimed (see the prelude: each claim records its holder, "" for a host without an id)
-- ARGV: 1 most ids listed per host
-- Returns: flat { host id, count, { ids... } } per host; "" for leases without a holder;
-- an HGFAULT when a key is not a hash. Reads every claim in flight: for
-- `hourglass stats --hosts` and the dashboard, not the path every task takes.

local bad = check_keys({ { KEYS[1], 'hash' }, { KEYS[2], 'hash' } })
if bad then return bad end
local most = tonumber(ARGV[1])
local counts, ids, order = {}, {}, {}
local function count(host, id)
  if not counts[host] then
    counts[host] = 0
    ids[host] = {}
    order[#order + 1] = host
  end
  counts[host] = counts[host] + 1
  if #ids[host] < most then
    ids[host][#ids[host] + 1] = id
  end
end
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  count(string.match(all[i + 1], '^[%d:]+@(.*)$') or '', all[i])
end
each_leased(KEYS[2], function(_, _, id, holder)
  count(holder, id)
  return false
end)
local out = {}
for _, host in ipairs(order) do
  out[#out + 1] = host
  out[#out + 1] = counts[host]
  out[#out + 1] = ids[host]
end
return out
