// Workflow graphs: declare one whole (graph_open.lua, the host's script), schedule its roots, and show
// it. The host's CLI (`hourglass graph submit`) takes the same steps in the same order.
"use strict";

const { GraphRefused, InvalidArgument, fromReply } = require("./errors");
const { taskType, describe, checkOptions, textId, payloadOf } = require("./args");

// The host's MAX_NODES and MAX_EDGES; lookups per pipeline and nodes per group_child.lua call (its
// BATCH and NODES_PER_CALL).
const MAX_NODES = 10000;
const MAX_EDGES = 50000;
const LOOKUPS_PER_BATCH = 500;
const NODES_PER_CALL = 256;
const GRAPH_ID_MAX = 200;
const NODE_STATES = ["waiting", "scheduled", "succeeded", "dead", "cancelled", "skipped"];
const NODE_KEYS = ["name", "taskType", "id", "payload", "when", "parents"];

function graphKeys(hg, homeType, graph) {
  const c = taskType(homeType);
  const g = textId(graph, "graph id", GRAPH_ID_MAX);
  return { c, g, keys: [hg.key(c, `graph:${g}`), hg.key(c, `graph-nodes:${g}`)] };
}

// A node as graph_open.lua takes it, its arguments checked here first.
function nodeSpec(graph, n) {
  if (n === null || typeof n !== "object" || Array.isArray(n)) {
    throw new InvalidArgument(`a graph's node is { name, taskType, id?, payload?, when?, parents? }, not ${describe(n)}`);
  }
  checkOptions(n, NODE_KEYS, "graphSubmit (a node)");
  const name = textId(n.name, "node name", GRAPH_ID_MAX);
  const when = n.when === undefined ? "all" : n.when;
  if (when !== "all" && when !== "success") {
    throw new InvalidArgument(`node ${JSON.stringify(name)}: invalid when ${describe(when)}: expected "all" or "success"`);
  }
  const parents = n.parents === undefined ? [] : n.parents;
  if (!Array.isArray(parents) || !parents.every((p) => typeof p === "string")) {
    throw new InvalidArgument(`node ${JSON.stringify(name)}: parents are an array of node names`);
  }
  const body = payloadOf(n.payload);
  const payload = body.toString("utf8");
  if (!Buffer.from(payload, "utf8").equals(body)) {
    throw new InvalidArgument(`node ${JSON.stringify(name)}: a graph node's payload is text (UTF-8)`);
  }
  const id = textId(n.id === undefined || n.id === null ? `${graph}/${name}` : n.id, "node id", 1 << 20);
  const spec = { name, type: taskType(n.taskType), id, when, parents: [...parents] };
  if (payload.length) spec.payload = payload;
  return spec;
}

// A node's outbox entry (the prelude's graph_node_entry): `<len>\n<mark>` then the task,
// `<type>\n<due>\n<id len>\n<id><payload>`; null when it is not one (a host logs and drops it).
function decodeNode(data) {
  const nl = data.indexOf(10);
  const len = Number(data.subarray(0, nl).toString());
  if (nl < 0 || !Number.isInteger(len)) return null;
  const mark = data.subarray(nl + 1, nl + 1 + len);
  let at = nl + 1 + len;
  const parts = [];
  for (let i = 0; i < 3; i++) {
    const end = data.indexOf(10, at);
    if (end < 0) return null;
    parts.push(data.subarray(at, end).toString());
    at = end + 1;
  }
  const idLen = Number(parts[2]);
  if (!Number.isInteger(idLen) || data.length < at + idLen) return null;
  return { mark, type: parts[0], due: parts[1], id: data.subarray(at, at + idLen), body: data.subarray(at + idLen) };
}

/** Schedules the graph nodes waiting in `c`'s outbox, each once (its entry's marker), and clears them. */
async function flushNodes(hg, c) {
  const outbox = hg.key(c, "outbox");
  let cursor = "0";
  let moved = 0;
  do {
    const [next, flat] = await hg.redis.hscanBuffer(outbox, cursor, "MATCH", "*:node", "COUNT", LOOKUPS_PER_BATCH);
    cursor = next.toString();
    const bySlot = new Map();
    for (let i = 0; i + 1 < flat.length; i += 2) {
      const node = decodeNode(flat[i + 1]);
      if (node === null) continue;
      const q = hg.shardFor(node.type, node.id);
      if (!bySlot.has(q)) bySlot.set(q, []);
      bySlot.get(q).push({ entry: flat[i], ...node });
    }
    const done = [];
    for (const [q, nodes] of bySlot) {
      for (let start = 0; start < nodes.length; start += NODES_PER_CALL) {
        const batch = nodes.slice(start, start + NODES_PER_CALL);
        const keys = ["due", "payload", "member", "dead", "outbox", "seq"].map((s) => hg.key(q, s));
        const args = [q];
        for (const n of batch) {
          keys.push(hg.key(q, `delivered:${n.entry.toString()}`));
          args.push(n.id, n.due, n.body, n.body.length ? "1" : "0", n.mark, "create", "1");
        }
        await hg.run("group_child", keys, args);
        done.push(...batch.map((n) => n.entry));
      }
    }
    if (done.length) {
      await hg.redis.hdel(outbox, ...done);
      moved += done.length;
    }
  } while (cursor !== "0");
  return moved;
}

async function graphSubmit(hg, homeType, graph, nodes) {
  const { c, g, keys } = graphKeys(hg, homeType, graph);
  if (!Array.isArray(nodes)) throw new InvalidArgument(`graphSubmit takes an array of nodes (got ${describe(nodes)})`);
  const spec = nodes.map((n) => nodeSpec(g, n));
  if (spec.length === 0) throw new InvalidArgument(`graph ${c}/${g} has no nodes`);
  const name = `${c}/${g}`;
  const state = await hg.redis.hget(keys[0], "state");
  if (state !== null) throw new GraphRefused(`graph ${name} exists (${state}): graph ids are used once; nothing was written`);
  // A node is create-only, so one whose task is already in use would not run: refuse the graph whole.
  // (An id taken between this read and the node's turn makes that node end as cancelled.)
  // One pipeline per slot (a cluster pipeline stays in one) and LOOKUPS_PER_BATCH nodes.
  const bySlot = new Map();
  for (const n of spec) {
    const q = hg.shardFor(n.type, n.id);
    if (!bySlot.has(q)) bySlot.set(q, []);
    bySlot.get(q).push(n);
  }
  const batches = [];
  for (const [q, all] of bySlot) {
    for (let start = 0; start < all.length; start += LOOKUPS_PER_BATCH) batches.push([q, all.slice(start, start + LOOKUPS_PER_BATCH)]);
  }
  for (const [q, batch] of batches) {
    const pipe = hg.redis.pipeline();
    for (const n of batch) {
      pipe.zscore(hg.key(q, "due"), n.id).zscore(hg.key(q, "dead"), n.id).hexists(hg.key(q, "member"), n.id);
    }
    const replies = await pipe.exec();
    batch.forEach((n, i) => {
      const [due, dead, member] = replies.slice(3 * i, 3 * i + 3).map(([err, value]) => {
        if (err) throw fromReply(err);
        return value;
      });
      const why = due !== null ? "waiting" : dead !== null ? "dead-lettered" : member ? "a workflow group's or graph's already" : null;
      if (why) {
        throw new GraphRefused(`graph ${name}: node ${JSON.stringify(n.name)}: task ${n.type}/${n.id} is ${why}; nothing was written`);
      }
    });
  }
  keys.push(...["graphs", "outbox", "seq", "stats"].map((s) => hg.key(c, s)));
  const [n, edges, roots] = await hg.run("graph_open", keys, [g, c, JSON.stringify(spec), MAX_NODES, MAX_EDGES]);
  // The roots wait in the home type's outbox: schedule them now, not at a host's next pass.
  await flushNodes(hg, c);
  return { nodes: n, edges, roots };
}

async function graphCancel(hg, homeType, graph) {
  const { c, g, keys } = graphKeys(hg, homeType, graph);
  if ((await hg.redis.hget(keys[0], "state")) === null) return null;
  // graph_cancel.lua skips every waiting node at once; the nodes scheduled are cancelled as tasks.
  const r = await hg.run("graph_cancel", [...keys, hg.key(c, "graphs"), hg.key(c, "stats")], [g, c]);
  const done = { wasDone: false, skipped: 0, removed: 0, stopping: 0, ended: 0 };
  if (r[0] < 0) return { ...done, wasDone: true };
  done.skipped = r[0];
  // Nodes on their way in the outbox become tasks first, so cancelling finds them.
  await flushNodes(hg, c);
  for (let i = 1; i + 1 < r.length; i += 2) {
    const { state } = await hg.cancel(String(r[i]), String(r[i + 1]));
    if (state === "scheduled") done.removed += 1;
    else if (state === "running") done.stopping += 1;
    else done.ended += 1;
  }
  return done;
}

async function graphShow(hg, homeType, graph) {
  const { c, g, keys } = graphKeys(hg, homeType, graph);
  const f = await hg.redis.hgetall(keys[0]);
  if (Object.keys(f).length === 0) return null;
  const stored = new Map();
  let cursor = "0";
  do {
    const [next, flat] = await hg.redis.hscan(keys[1], cursor, "COUNT", LOOKUPS_PER_BATCH);
    cursor = next;
    for (let i = 0; i + 1 < flat.length; i += 2) stored.set(Number(flat[i]), JSON.parse(flat[i + 1]));
  } while (cursor !== "0");
  const order = [...stored.keys()].sort((a, b) => a - b);
  const nodes = order.map((i) => {
    const n = stored.get(i);
    // cjson writes an empty list as {}.
    const parents = Array.isArray(n.parents) ? n.parents : [];
    return {
      name: n.name,
      taskType: n.type,
      id: n.id,
      when: n.when,
      state: n.state,
      parents: parents.filter((p) => stored.has(p)).map((p) => stored.get(p).name),
      waitingFor: n.state === "waiting" ? Math.max(0, Number(n.left) || 0) : 0,
      reason: n.reason === undefined ? null : n.reason,
    };
  });
  const number = (name) => (f[name] === undefined ? null : Number(f[name]));
  const counts = {};
  for (const s of NODE_STATES) counts[s] = Math.max(0, number(s) || 0);
  return {
    homeType: c,
    graph: g,
    state: f.state || "",
    edges: number("edges") || 0,
    counts,
    openedMs: number("opened_ms"),
    completedMs: number("completed_ms"),
    cancelledMs: number("cancelled_ms"),
    nodes,
  };
}

module.exports = { graphSubmit, graphShow, graphCancel, flushNodes, MAX_NODES, MAX_EDGES };
