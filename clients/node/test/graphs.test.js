// Workflow graphs declared from Node against a real redis-server: what is written, what is refused
// (whole, nothing written), and how a graph is shown. Nodes running to the end under a real host is
// tests/host/workflows/clients.rs's part.
"use strict";

const { test, before, after, beforeEach } = require("node:test");
const assert = require("node:assert/strict");
const hg = require("..");
const { startRedis } = require("./support/redis");

let server, redis, client;

before(async () => {
  server = await startRedis();
  redis = server.redis;
});

after(() => server.stop());

beforeEach(async () => {
  await redis.flushall();
  client = new hg.Hourglass(redis, { shards: { check: 3 } });
});

const diamond = () => [
  { name: "a", taskType: "step", payload: { n: 1 } },
  { name: "b", taskType: "step", parents: ["a"] },
  { name: "c", taskType: "check", id: "c-17", parents: ["a"], when: "success" },
  { name: "d", taskType: "step", parents: ["b", "c"] },
];

test("a diamond is declared whole and its root scheduled at once", async () => {
  assert.deepEqual(await client.graphSubmit("flow", "g-1", diamond()), { nodes: 4, edges: 4, roots: 1 });
  // The root is an ordinary task of its type, due now, with its payload, marked as the graph's node.
  assert.deepEqual(await redis.zrange("hourglass:{step}:due", 0, -1), ["g-1/a"]);
  assert.equal(await redis.hget("hourglass:{step}:payload", "g-1/a"), '{"n":1}');
  assert.equal(await redis.hget("hourglass:{step}:member", "g-1/a"), "\x1fflow\ng-1\n1");
  assert.equal(await redis.hlen("hourglass:{flow}:outbox"), 0, "the root's entry was delivered");
  const view = await client.show("step", "g-1/a");
  assert.deepEqual([view.graph, view.group], ["flow/g-1", null]);
  assert.equal((await client.show("check", "c-17")).graph, null, "not scheduled until its parent ends");

  const shown = await client.graphShow("flow", "g-1");
  assert.deepEqual([shown.state, shown.edges], ["running", 4]);
  assert.deepEqual(shown.counts, { waiting: 3, scheduled: 1, succeeded: 0, dead: 0, cancelled: 0, skipped: 0 });
  assert.deepEqual(
    shown.nodes.map((n) => [n.name, n.state, n.parents, n.waitingFor]),
    [
      ["a", "scheduled", [], 0],
      ["b", "waiting", ["a"], 1],
      ["c", "waiting", ["a"], 1],
      ["d", "waiting", ["b", "c"], 2],
    ],
  );
  assert.deepEqual([shown.nodes[2].taskType, shown.nodes[2].id, shown.nodes[2].when], ["check", "c-17", "success"]);
  assert.equal(await client.graphShow("flow", "never"), null);
  const stats = await client.stats("flow");
  assert.deepEqual([stats.graphsRunning, stats.graphsOpened, stats.graphsCompleted, stats.graphsFailed], [1, 1, 0, 0]);
});

test("a refused graph is a typed one-line error and writes nothing", async () => {
  await redis.zadd("hourglass:{step}:due", 1, "taken");
  const before = (await redis.keys("*")).sort();
  const cases = [
    [[{ name: "a", taskType: "step", parents: ["b"] }, { name: "b", taskType: "step", parents: ["a"] }], "has a cycle through edge"],
    [[{ name: "a", taskType: "step" }, { name: "b", taskType: "step", parents: ["x"] }], '"x" is not a node of the graph'],
    [[{ name: "a", taskType: "step" }, { name: "a", taskType: "step", id: "other" }], 'two nodes are named "a"'],
    [[{ name: "a", taskType: "step", id: "same" }, { name: "b", taskType: "step", id: "same" }], "are both task step/same"],
    [[{ name: "a", taskType: "step", id: "taken" }], 'node "a": task step/taken is waiting'],
  ];
  for (const [nodes, says] of cases) {
    await assert.rejects(client.graphSubmit("flow", "g", nodes), (e) => {
      assert.ok(e instanceof hg.GraphRefused, `${says}: ${e}`);
      assert.equal(e.code, "HG_GRAPH_REFUSED");
      assert.ok(e.message.includes(says), `${e.message} lacks ${says}`);
      assert.equal(e.message.split("\n").length, 1);
      return true;
    });
    assert.deepEqual((await redis.keys("*")).sort(), before, `${says}: something was written`);
  }
  await client.graphSubmit("flow", "g", [{ name: "a", taskType: "step" }]);
  await assert.rejects(client.graphSubmit("flow", "g", [{ name: "z", taskType: "step" }]), /graph flow\/g exists \(running\)/);

  const bad = [
    [() => client.graphSubmit("Flow", "g2", [{ name: "a", taskType: "step" }]), hg.InvalidTaskType],
    [() => client.graphSubmit("flow", "", [{ name: "a", taskType: "step" }]), hg.InvalidId],
    [() => client.graphSubmit("flow", "g2", []), hg.InvalidArgument],
    [() => client.graphSubmit("flow", "g2", "nodes"), hg.InvalidArgument],
    [() => client.graphSubmit("flow", "g2", [{ name: "a", taskType: "Step" }]), hg.InvalidTaskType],
    [() => client.graphSubmit("flow", "g2", [{ name: "a", taskType: "step", when: "sometimes" }]), hg.InvalidArgument],
    [() => client.graphSubmit("flow", "g2", [{ name: "a", taskType: "step", parents: "b" }]), hg.InvalidArgument],
    [() => client.graphSubmit("flow", "g2", [{ name: "a", taskType: "step", payload: Buffer.from([0xff]) }]), hg.InvalidArgument],
    [() => client.graphSubmit("flow", "g2", [{ name: "a", taskType: "step", after: ["b"] }]), hg.InvalidArgument],
  ];
  for (const [call, kind] of bad) await assert.rejects(call(), kind);
  assert.equal(await client.graphShow("flow", "g2"), null);
});

test("nodes of a sharded type go to their shards", async () => {
  const nodes = [{ name: "root", taskType: "step" }];
  for (let i = 0; i < 3; i++) nodes.push({ name: `n${i}`, taskType: "check", parents: ["root"] });
  for (let i = 0; i < 20; i++) nodes.push({ name: `r${i}`, taskType: "check" });
  assert.equal((await client.graphSubmit("flow", "s", nodes)).roots, 21);
  for (let i = 0; i < 20; i++) {
    const q = client.shardFor("check", `s/r${i}`);
    assert.notEqual(await redis.zscore(`hourglass:{${q}}:due`, `s/r${i}`), null, `s/r${i} not in ${q}`);
  }
  assert.equal((await client.show("check", "s/r7")).graph, "flow/s");
});

test("a cancelled graph skips what waits and removes what is scheduled", async () => {
  await client.graphSubmit("flow", "g-c", diamond());
  assert.equal(await client.graphCancel("flow", "never"), null);
  assert.deepEqual(await client.graphCancel("flow", "g-c"), { wasDone: false, skipped: 3, removed: 1, stopping: 0, ended: 0 });
  assert.equal(await redis.zcard("hourglass:{step}:due"), 0, "the root waited to run: removed");
  const shown = await client.graphShow("flow", "g-c");
  assert.ok(shown.cancelledMs > 0);
  assert.deepEqual(shown.nodes.slice(1).map((n) => [n.state, n.reason]), Array(3).fill(["skipped", "graph cancelled"]));
  // The root's end waits in its type's outbox for a host, which then finishes the graph.
  assert.equal(await redis.hlen("hourglass:{step}:outbox"), 1);
});
