-- holders: how many leases of one type each host holds (read-only).
--
-- KEYS: 1 tokens (HASH id → "<token>:<attempt>@<host id>", or without "@<host id>" from hosts without an id)
-- ARGV: 1 most ids listed per host
-- Returns: flat { host id, count, { ids... } } per host; "" for leases without a holder;
-- an HGFAULT when the key is not a hash.

local bad = check_keys({ { KEYS[1], 'hash' } })
if bad then return bad end
local most = tonumber(ARGV[1])
local counts, ids, order = {}, {}, {}
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local host = string.match(all[i + 1], '^[%d:]+@(.*)$') or ''
  if not counts[host] then
    counts[host] = 0
    ids[host] = {}
    order[#order + 1] = host
  end
  counts[host] = counts[host] + 1
  if #ids[host] < most then
    ids[host][#ids[host] + 1] = all[i]
  end
end
local out = {}
for _, host in ipairs(order) do
  out[#out + 1] = host
  out[#out + 1] = counts[host]
  out[#out + 1] = ids[host]
end
return out
