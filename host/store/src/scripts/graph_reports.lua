-- graph_reports: count nodes' ends in their graphs, all of one home type C; schedule the nodes whose parents have all ended, skip those whose rule can no longer be met.
--
-- KEYS: 1 graphs (ZSET of C), 2 stats (of C), 3 outbox (of C), 4 seq (of C); then per
--       report, 2 each from 5: graph, nodes
-- ARGV: 1 C's name; then per report, 3 each: graph id, node index, how it ended
--       (succeeded | dead | cancelled)
-- Returns: per report, 'done' when it finished its graph, else ''.
-- Guarantees: a node's end counts once, while the node is scheduled (a
-- report delivered twice finds it ended and changes nothing). A child
-- waits for every parent: when the last one ends it is scheduled (one
-- outbox entry, the prelude's graph_node_entry), unless its rule is
-- "success" and a parent did not succeed: then it is skipped, with the
-- parent named as the reason, and its own children see it end as skipped
-- (a skip reaches every node below that needs success; a node whose rule
-- is "all" runs once its parents have ended, skipped ones included). A
-- graph is done in the step that ends its last node. Every key's type, the
-- counters and every node read are checked, and every write computed,
-- before the first write (HGFAULT otherwise).

local graphs, stats, outbox, seq, home = KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[1]
local n = (#ARGV - 1) / 3
local expected = { { graphs, 'zset' }, { outbox, 'hash' } }
for r = 0, n - 1 do
  expected[#expected + 1] = { KEYS[5 + 2 * r], 'hash' }
  expected[#expected + 1] = { KEYS[6 + 2 * r], 'hash' }
  local outcome = ARGV[4 + 3 * r]
  if outcome ~= 'succeeded' and outcome ~= 'dead' and outcome ~= 'cancelled' then
    return fault(string.format('a report for graph %q says %q, not succeeded, dead or cancelled', ARGV[2 + 3 * r], outcome))
  end
end
local bad = check_keys(expected) or check_integer(seq)
  or check_counters(stats, { 'graphs_completed', 'graphs_failed' })
if bad then return bad end
local counted = { 'waiting', 'scheduled', 'succeeded', 'dead', 'cancelled', 'skipped' }
for r = 0, n - 1 do
  bad = check_counters(KEYS[5 + 2 * r], counted)
  if bad then return bad end
end

-- Everything is worked out in memory first: graphs by key, with their nodes as read.
local by_key, order = {}, {}
local function graph_of(r)
  local key = KEYS[5 + 2 * r]
  local g = by_key[key]
  if not g then
    g = { key = key, nodes_key = KEYS[6 + 2 * r], gid = ARGV[2 + 3 * r], nodes = {}, dirty = {}, delta = {}, r = r }
    local state = redis.call('HGET', key, 'state')
    g.running = state == 'running'
    for _, c in ipairs(counted) do g.delta[c] = 0 end
    by_key[key] = g
    order[#order + 1] = g
  end
  return g
end
local function node_of(g, i)
  local node = g.nodes[i]
  if node == nil then
    local raw = redis.call('HGET', g.nodes_key, tostring(i))
    if not raw then return nil, nil end
    local ok, decoded = pcall(cjson.decode, raw)
    if not ok or type(decoded) ~= 'table' or type(decoded.children) ~= 'table' or type(decoded.state) ~= 'string' then
      return nil, fault(string.format('%s field %d is not a graph node (%s): the graph cannot go on; delete the graph (DEL %s %s)',
        g.nodes_key, i, string.sub(raw, 1, 60), g.key, g.nodes_key))
    end
    node = decoded
    g.nodes[i] = node
  end
  return node, nil
end

local entries = {}
local function ended(g, i, node, outcome)
  g.delta[node.state] = g.delta[node.state] - 1
  node.state = outcome
  g.delta[outcome] = g.delta[outcome] + 1
  g.dirty[i] = true
  -- What it means below: breadth first, a skip travelling down.
  local queue, head = { i }, 1
  while head <= #queue do
    local at = queue[head]
    head = head + 1
    local parent = g.nodes[at]
    for _, c in ipairs(parent.children) do
      local child, err = node_of(g, c)
      if err then return err end
      if child and child.state == 'waiting' then
        child.left = child.left - 1
        g.dirty[c] = true
        if parent.state ~= 'succeeded' and child.when == 'success' then
          child.state = 'skipped'
          child.reason = string.format('parent %s %s', parent.name, parent.state)
          child.payload = nil
          g.delta.waiting = g.delta.waiting - 1
          g.delta.skipped = g.delta.skipped + 1
          queue[#queue + 1] = c
        elseif child.left <= 0 then
          child.state = 'scheduled'
          g.delta.waiting = g.delta.waiting - 1
          g.delta.scheduled = g.delta.scheduled + 1
          entries[#entries + 1] = { c, child.type, child.id, child.payload or '', g.gid }
          -- The payload goes with the node's entry.
          child.payload = nil
        end
      end
    end
  end
  return nil
end

for r = 0, n - 1 do
  local g = graph_of(r)
  if g.running then
    local i = tonumber(ARGV[3 + 3 * r])
    local node, err = node_of(g, i)
    if err then return err end
    -- Only a scheduled node ends: a report delivered twice finds it ended.
    if node and node.state == 'scheduled' then
      err = ended(g, i, node, ARGV[4 + 3 * r])
      if err then return err end
    end
  end
end

-- Then the writes: each graph's nodes and counts, the scheduled nodes' entries, the graphs done.
local now = string.format('%d', now_ms())
local results = {}
for r = 1, n do results[r] = '' end
for _, g in ipairs(order) do
  local rows = {}
  for i in pairs(g.dirty) do
    rows[#rows + 1] = tostring(i)
    rows[#rows + 1] = graph_node_json(g.nodes[i])
  end
  each_chunk(rows, function(...) redis.call('HSET', g.nodes_key, ...) end)
  for _, c in ipairs(counted) do
    if g.delta[c] ~= 0 then redis.call('HINCRBY', g.key, c, g.delta[c]) end
  end
end
for _, e in ipairs(entries) do
  local entry = home .. ':x' .. redis.call('INCRBY', seq, 1) .. ':node'
  redis.call('HSET', outbox, entry, graph_node_entry(home, e[5], e[1], e[2], e[3], e[4], now))
end
for _, g in ipairs(order) do
  if g.running and next(g.dirty) ~= nil and graph_finish(g.key, g.nodes_key, graphs, stats, g.gid, now) then
    results[g.r + 1] = 'done'
  end
end
return results
