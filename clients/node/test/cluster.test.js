// The client on an ioredis Cluster: a one-node cluster (every slot on it) on a free local TCP port
// (never 6379), so the Cluster code paths run: pipelines per slot, the duplicated blocking reader.
"use strict";

const { test, before, after } = require("node:test");
const assert = require("node:assert/strict");
const { spawn } = require("node:child_process");
const fs = require("node:fs");
const net = require("node:net");
const os = require("node:os");
const path = require("node:path");
const Redis = require("ioredis");
const hg = require("..");

let server, dir, port, cluster, client;

const freePort = () =>
  new Promise((resolve, reject) => {
    const s = net.createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const { port: p } = s.address();
      s.close(() => resolve(p));
    });
  });

before(async () => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), "hourglass-node-cluster-"));
  port = await freePort();
  // A lone node names no address of its own in CLUSTER SLOTS unless told one.
  const args = ["--port", String(port), "--bind", "127.0.0.1", "--cluster-enabled", "yes", "--cluster-announce-ip", "127.0.0.1"];
  args.push("--cluster-config-file", path.join(dir, "nodes.conf"), "--save", "", "--appendonly", "no", "--dir", dir);
  server = spawn("redis-server", args, { stdio: "ignore" });
  const deadline = Date.now() + 20000;
  for (;;) {
    const up = await new Promise((resolve) => {
      const probe = net.connect(port, "127.0.0.1", () => (probe.end(), resolve(true)));
      probe.on("error", () => resolve(false));
    });
    if (up) break;
    if (Date.now() > deadline) throw new Error("redis-server did not start");
    await new Promise((r) => setTimeout(r, 50));
  }
  const direct = new Redis({ port, host: "127.0.0.1" });
  await direct.cluster("ADDSLOTSRANGE", 0, 16383);
  while (!/cluster_state:ok/.test(await direct.cluster("INFO"))) {
    if (Date.now() > deadline) throw new Error("the cluster did not come up");
    await new Promise((r) => setTimeout(r, 50));
  }
  direct.disconnect();
  cluster = new Redis.Cluster([{ host: "127.0.0.1", port }], { redisOptions: { maxRetriesPerRequest: 1 } });
  client = new hg.Hourglass(cluster, { shards: { hot: 3 } });
  await cluster.ping();
}, { timeout: 60000 });

after(async () => {
  if (cluster) cluster.disconnect();
  // A cluster node writes nodes.conf as it shuts down: remove its folder once it has exited.
  if (server.exitCode === null) await new Promise((resolve) => (server.once("exit", resolve), server.kill()));
  fs.rmSync(dir, { recursive: true, force: true });
});

test("scheduleMany, schedule, show and a group on a Cluster", { timeout: 60000 }, async () => {
  const tasks = Array.from({ length: 2500 }, (_, i) => ({ taskType: i % 2 ? "hot" : "cold", id: `k-${i}`, delayMs: 600000, payload: { i } }));
  const written = await client.scheduleMany(tasks);
  assert.equal(written.filter((w) => w === true).length, 2500);
  assert.equal((await client.stats("hot")).scheduledLater + (await client.stats("cold")).scheduledLater, 2500);
  const view = await client.show("hot", "k-1");
  assert.deepEqual([view.state, view.taskType, view.payload.toString()], ["scheduled", client.shardFor("hot", "k-1"), '{"i":1}']);
  assert.equal(await client.schedule("hot", "k-1", { delayMs: 5, mode: "if-absent" }), false);
  await client.groupOpen("ship", "g", { callbackId: "cb" });
  assert.deepEqual(await client.groupSeal("ship", "g"), { state: "completed", fired: "callback" });
  // A graph over three types and a sharded one: its lookups are pipelined per slot, its roots delivered per shard.
  const nodes = Array.from({ length: 40 }, (_, i) => ({ name: `r${i}`, taskType: ["hot", "cold", "mail"][i % 3] }));
  nodes.push({ name: "end", taskType: "cold", parents: nodes.map((n) => n.name) });
  assert.deepEqual(await client.graphSubmit("flow", "g", nodes), { nodes: 41, edges: 40, roots: 40 });
  assert.equal((await client.show("hot", "g/r3")).graph, "flow/g");
  assert.equal((await client.graphShow("flow", "g")).counts.scheduled, 40);
});

test("waitUntilFinished on a Cluster reads the shard's stream on a duplicated connection", { timeout: 60000 }, async () => {
  const id = ["w-1", "w-2", "w-3", "w-4", "w-5"].find((i) => hg.shardOf(i, 3) !== 0);
  const q = client.shardFor("hot", id);
  const events = `hourglass:{${q}}:events`;
  await cluster.xadd(events, "*", "x", "y");
  await cluster.xtrim(events, "MAXLEN", 0);
  await client.schedule("hot", id, { delayMs: 600000 });
  const ended = client.waitUntilFinished("hot", id, { timeoutMs: 10000 });
  await new Promise((r) => setTimeout(r, 100));
  await cluster.xadd(events, "*", "id", id, "outcome", "dead", "attempt", 2, "finished_ms", 7, "error", "no answer");
  assert.deepEqual(await ended, { outcome: "dead", attempt: 2, error: "no answer", finishedMs: 7 });
  await assert.rejects(client.waitUntilFinished("cold", "k-0", { timeoutMs: 100 }), hg.NoEvents);
});
