-- graph_cancel: cancel a running workflow graph of home type C: every node still waiting is skipped at once, and the nodes scheduled are named for the caller to cancel as tasks.
--
-- KEYS: 1 graph (HASH), 2 nodes (HASH node index → JSON), 3 graphs (ZSET of C), 4 stats (of C)
-- ARGV: 1 graph id, 2 C's name
-- Returns: { skipped, type, id, type, id, ... }: how many waiting nodes it
--   skipped, then the type and id of each node scheduled (its task waiting,
--   running, or on its way in C's outbox); { -1 } when the graph is done.
-- Errors (HGGRAPH, nothing written): no such graph.
-- Guarantees: afterwards no node of the graph is ever scheduled, since
-- graph_reports.lua schedules only waiting nodes and none is left; each
-- skipped node's reason is "graph cancelled". The scheduled nodes end as
-- their tasks do; the caller cancels those (cancel.lua), and each comes back
-- as cancelled, or as it ended if it ended first. With none scheduled, the
-- graph is done in this step. Every key, counter and node is checked before
-- the first write (HGFAULT otherwise).

local graph, nodes_key, graphs, stats = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local gid, home = ARGV[1], ARGV[2]
local bad = check_keys({ { graph, 'hash' }, { nodes_key, 'hash' }, { graphs, 'zset' } })
  or check_counters(stats, { 'graphs_completed', 'graphs_failed' })
  or check_counters(graph, { 'waiting', 'scheduled', 'succeeded', 'dead', 'cancelled', 'skipped' })
if bad then return bad end
local state = redis.call('HGET', graph, 'state')
if not state then
  return redis.error_reply(string.format('HGGRAPH no graph %q of %s (never declared, or done more than 7 days ago)', gid, home))
end
if state ~= 'running' then return { -1 } end

local rows, scheduled, skipped = {}, {}, 0
local all = redis.call('HGETALL', nodes_key)
for k = 1, #all, 2 do
  local ok, node = pcall(cjson.decode, all[k + 1])
  if not ok or type(node) ~= 'table' or type(node.state) ~= 'string' then
    return fault(string.format('%s field %s is not a graph node (%s): delete the graph (DEL %s %s)',
      nodes_key, all[k], string.sub(all[k + 1], 1, 60), graph, nodes_key))
  end
  if node.state == 'waiting' then
    node.state = 'skipped'
    node.reason = 'graph cancelled'
    node.payload = nil
    skipped = skipped + 1
    rows[#rows + 1] = all[k]
    rows[#rows + 1] = graph_node_json(node)
  elseif node.state == 'scheduled' then
    scheduled[#scheduled + 1] = tostring(node.type)
    scheduled[#scheduled + 1] = tostring(node.id)
  end
end

local now = string.format('%d', now_ms())
each_chunk(rows, function(...) redis.call('HSET', nodes_key, ...) end)
redis.call('HSET', graph, 'cancelled_ms', now)
if skipped > 0 then
  redis.call('HINCRBY', graph, 'waiting', -skipped)
  redis.call('HINCRBY', graph, 'skipped', skipped)
end
graph_finish(graph, nodes_key, graphs, stats, gid, now)
local reply = { skipped }
for _, v in ipairs(scheduled) do reply[#reply + 1] = v end
return reply
