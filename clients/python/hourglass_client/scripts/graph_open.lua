-- graph_open: declare a workflow graph in its home type C's slot, whole or not at all, and schedule its roots through C's outbox.
--
-- KEYS: 1 graph (HASH), 2 nodes (HASH node index → JSON), 3 graphs (ZSET of C), 4 outbox (of C),
--       5 seq (of C), 6 stats (of C), 7 (optional) the marker of the outbox entry that
--       asked for it (STRING, in C's slot: a graph a handler declared, declared once)
-- ARGV: 1 graph id, 2 C's name, 3 the nodes as JSON: [{"name","type","id","payload","when","parents":[names]}],
--       4 most nodes, 5 most edges
-- Returns: { nodes, edges, roots }; {} when the marker says it was declared before.
-- Errors (HGGRAPH, nothing written): the graph exists (running, or done less
-- than 7 days ago); the JSON is not a list of nodes; a node without a name,
-- type or id, or with a name used twice; a task (type and id) used by two
-- nodes; `when` not "all" or "success"; a parent that is not a node of the
-- graph, a node its own parent, a parent given twice; a cycle (one of its
-- edges is named); more nodes or edges than the limits.
-- Guarantees: everything is checked before the first write; then the graph,
-- every node (waiting, with how many parents it waits for) and one outbox
-- entry per root (`<C>:x<seq>:node`, the prelude's graph_node_entry) are
-- written in one step, so a client that dies leaves either the whole graph
-- or nothing. Hosts serving C deliver the entries (group_child.lua, once
-- each), and every node's end comes back to graph_reports.lua.

local graph, nodes_key, graphs, outbox, seq, stats = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local gid, home = ARGV[1], ARGV[2]
local max_nodes, max_edges = tonumber(ARGV[4]), tonumber(ARGV[5])
local marker = KEYS[7]
local bad = check_keys({ { graph, 'hash' }, { nodes_key, 'hash' }, { graphs, 'zset' }, { outbox, 'hash' } })
  or check_integer(seq) or check_counters(stats, { 'graphs_opened' })
  or (marker and check_rare({ { marker, 'string' } }, {}))
if bad then return bad end
if marker and redis.call('EXISTS', marker) == 1 then return {} end
local function refuse(text, ...)
  return redis.error_reply('HGGRAPH ' .. string.format(text, ...))
end
if redis.call('EXISTS', graph) == 1 then
  return refuse('graph %q of %s exists (%s): graph ids are used once', gid, home,
    redis.call('HGET', graph, 'state') or 'unknown state')
end

local ok, spec = pcall(cjson.decode, ARGV[3])
if not ok or type(spec) ~= 'table' or #spec == 0 then
  return refuse('graph %q: the nodes are not a JSON list of at least one node', gid)
end
if #spec > max_nodes then
  return refuse('graph %q has %d nodes, more than the limit of %d', gid, #spec, max_nodes)
end
local function text(v) return type(v) == 'string' and v ~= '' end
local index, tasks, edges = {}, {}, 0
for i, n in ipairs(spec) do
  if type(n) ~= 'table' or not text(n.name) then return refuse('graph %q: node %d has no name', gid, i) end
  if string.find(n.name, '%c') or #n.name > 200 then
    return refuse('graph %q: node name %q is not 1-200 bytes of text without control characters', gid, n.name)
  end
  if index[n.name] then return refuse('graph %q: two nodes are named %q', gid, n.name) end
  index[n.name] = i
  if not text(n.type) or not text(n.id) then return refuse('graph %q: node %q needs a type and an id', gid, n.name) end
  local task = n.type .. '\n' .. n.id
  if tasks[task] then
    return refuse('graph %q: nodes %q and %q are both task %s/%s', gid, tasks[task], n.name, n.type, n.id)
  end
  tasks[task] = n.name
  if n.when == nil then n.when = 'all' end
  if n.when ~= 'all' and n.when ~= 'success' then
    return refuse('graph %q: node %q has when %q, not "all" or "success"', gid, n.name, tostring(n.when))
  end
  if n.payload ~= nil and type(n.payload) ~= 'string' then
    return refuse('graph %q: node %q has a payload that is not a string', gid, n.name)
  end
  if n.parents == nil then n.parents = {} end
  if type(n.parents) ~= 'table' then return refuse('graph %q: node %q has parents that are not a list', gid, n.name) end
  edges = edges + #n.parents
end
if edges > max_edges then
  return refuse('graph %q has %d edges, more than the limit of %d', gid, edges, max_edges)
end
-- Parents as indexes, children lists, and how many parents each waits for.
local children, left = {}, {}
for i = 1, #spec do children[i] = {} end
for i, n in ipairs(spec) do
  local seen, parents = {}, {}
  for _, p in ipairs(n.parents) do
    local at = type(p) == 'string' and index[p]
    if not at then return refuse('graph %q: edge %s -> %q: %s is not a node of the graph', gid, cjson.encode(p), n.name, cjson.encode(p)) end
    if at == i then return refuse('graph %q: edge %q -> %q: a node cannot be its own parent', gid, p, n.name) end
    if seen[at] then return refuse('graph %q: edge %q -> %q is given twice', gid, p, n.name) end
    seen[at] = true
    parents[#parents + 1] = at
    local c = children[at]
    c[#c + 1] = i
  end
  n.parents = parents
  left[i] = #parents
end
-- Kahn's order: what it cannot reach lies on or below a cycle.
local waiting, queue, reached = {}, {}, 0
for i = 1, #spec do
  waiting[i] = left[i]
  if left[i] == 0 then queue[#queue + 1] = i end
end
local head = 1
while head <= #queue do
  local i = queue[head]
  head = head + 1
  reached = reached + 1
  for _, c in ipairs(children[i]) do
    waiting[c] = waiting[c] - 1
    if waiting[c] == 0 then queue[#queue + 1] = c end
  end
end
if reached < #spec then
  -- Walk back from an unreached node through unreached parents until one repeats: that is a cycle.
  local at = nil
  for i = 1, #spec do
    if waiting[i] > 0 then at = i break end
  end
  local on_path = {}
  while not on_path[at] do
    on_path[at] = true
    for _, p in ipairs(spec[at].parents) do
      if waiting[p] > 0 then
        at = p
        break
      end
    end
  end
  local parent = at
  for _, p in ipairs(spec[at].parents) do
    if waiting[p] > 0 then parent = p break end
  end
  return refuse('graph %q has a cycle through edge %q -> %q', gid, spec[parent].name, spec[at].name)
end

-- Written: the nodes, then each root's entry in the outbox.
local now = string.format('%d', now_ms())
local rows, entries, roots = {}, {}, 0
for i, n in ipairs(spec) do
  local node = { name = n.name, type = n.type, id = n.id, when = n.when, parents = n.parents,
    children = children[i], left = left[i], state = 'waiting' }
  if left[i] == 0 then
    roots = roots + 1
    node.state = 'scheduled'
    entries[#entries + 1] = home .. ':x' .. redis.call('INCRBY', seq, 1) .. ':node'
    entries[#entries + 1] = graph_node_entry(home, gid, i, n.type, n.id, n.payload or '', now)
  else
    node.payload = n.payload
  end
  rows[#rows + 1] = tostring(i)
  rows[#rows + 1] = graph_node_json(node)
end
each_chunk(rows, function(...) redis.call('HSET', nodes_key, ...) end)
each_chunk(entries, function(...) redis.call('HSET', outbox, ...) end)
redis.call('HSET', graph, 'state', 'running', 'nodes', #spec, 'edges', edges, 'waiting', #spec - roots,
  'scheduled', roots, 'succeeded', 0, 'dead', 0, 'cancelled', 0, 'skipped', 0, 'opened_ms', now)
redis.call('ZADD', graphs, now, gid)
redis.call('HINCRBY', stats, 'graphs_opened', 1)
if marker then redis.call('SET', marker, '1', 'PX', 86400000) end
return { #spec, edges, roots }
