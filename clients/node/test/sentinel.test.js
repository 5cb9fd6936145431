// The client behind Redis Sentinel: an ioredis connection made with `sentinels:`, a durable schedule
// (`replicas: N`: WAIT N after the write) and a failover between two schedules.
"use strict";

const { test, before, after } = require("node:test");
const assert = require("node:assert");
const { spawn } = require("node:child_process");
const fs = require("node:fs");
const net = require("node:net");
const os = require("node:os");
const path = require("node:path");
const Redis = require("ioredis");
const { Hourglass, ReplicationTimeout, InvalidArgument } = require("..");

const MASTER = "mymaster";
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** A TCP port of 127.0.0.1 that nothing listens on now. */
function freePort() {
  return new Promise((resolve, reject) => {
    const server = net.createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });
}

let dir;
let procs = [];
let ports;
let redis;

/** A master, its replica and one sentinel on loopback TCP ports (a sentinel names the master by address). */
before(async () => {
  const set = new Set();
  while (set.size < 3) set.add(await freePort());
  const [master, replica, sentinel] = [...set];
  ports = { master, replica, sentinel };
  dir = fs.mkdtempSync(path.join(os.tmpdir(), "hourglass-node-sentinel-"));
  const server = (port, extra) =>
    spawn("redis-server", ["--port", String(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir,
      "--dbfilename", `dump-${port}.rdb`, ...extra], { stdio: "ignore" });
  procs.push(server(master, []), server(replica, ["--replicaof", "127.0.0.1", String(master)]));
  const conf = path.join(dir, "sentinel.conf");
  fs.writeFileSync(
    conf,
    `port ${sentinel}\nbind 127.0.0.1\ndir ${dir}\nsentinel monitor ${MASTER} 127.0.0.1 ${master} 1\n` +
      `sentinel down-after-milliseconds ${MASTER} 2000\nsentinel failover-timeout ${MASTER} 4000\n`,
  );
  procs.push(spawn("redis-server", [conf, "--sentinel"], { stdio: "ignore" }));
  const deadline = Date.now() + 30000;
  for (;;) {
    try {
      const r = new Redis({ port: replica, host: "127.0.0.1", lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => null });
      await r.connect();
      const info = await r.info("replication");
      r.disconnect();
      const s = new Redis({ port: sentinel, host: "127.0.0.1", lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => null });
      await s.connect();
      const replicas = await s.call("SENTINEL", "REPLICAS", MASTER);
      s.disconnect();
      if (info.includes("master_link_status:up") && replicas.length) break;
    } catch {
      // not up yet
    }
    if (Date.now() > deadline) throw new Error("the master, replica and sentinel did not start");
    await sleep(50);
  }
  redis = new Redis({ sentinels: [{ host: "127.0.0.1", port: sentinel }], name: MASTER });
  // A failover makes ioredis report passing errors while it finds the new master; the calls say what failed.
  redis.on("error", () => {});
});

after(async () => {
  if (redis) redis.disconnect();
  for (const p of procs) if (p.exitCode === null) await new Promise((resolve) => (p.once("exit", resolve), p.kill()));
  fs.rmSync(dir, { recursive: true, force: true });
});

/** The master's port as the sentinel names it now. */
async function masterNow() {
  const s = new Redis({ port: ports.sentinel, host: "127.0.0.1" });
  try {
    return Number((await s.call("SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER))[1]);
  } finally {
    s.disconnect();
  }
}

async function onReplica(key, member) {
  const port = (await masterNow()) === ports.master ? ports.replica : ports.master;
  const r = new Redis({ port, host: "127.0.0.1" });
  try {
    return (await r.zscore(key, member)) !== null;
  } finally {
    r.disconnect();
  }
}

test("a schedule acknowledged by a replica is on the replica", async () => {
  const hg = new Hourglass(redis);
  assert.strictEqual(await hg.schedule("sent", "durable", { delayMs: 60000, payload: "x", replicas: 1 }), true);
  // WAIT 1 returned 1: the replica has it now, no polling needed.
  assert.ok(await onReplica("hourglass:{sent}:due", "durable"));
  const tasks = Array.from({ length: 2500 }, (_, i) => ({ taskType: "sent", id: `bulk-${i}`, delayMs: 60000 }));
  const written = await hg.scheduleMany(tasks, { replicas: 1 });
  assert.strictEqual(written.filter(Boolean).length, 2500);
  assert.ok(await onReplica("hourglass:{sent}:due", "bulk-2499"));
});

test("fewer replicas than asked is a typed error after the write", async () => {
  const hg = new Hourglass(redis);
  await assert.rejects(hg.schedule("sent", "two", { delayMs: 60000, replicas: 2, replicasTimeoutMs: 100 }), (e) => {
    assert.ok(e instanceof ReplicationTimeout);
    assert.strictEqual(e.code, "HG_REPLICATION_TIMEOUT");
    assert.deepStrictEqual([e.acked, e.wanted], [1, 2]);
    assert.match(e.message, /1 of 2 replicas/);
    return true;
  });
  // The write itself happened on the master.
  assert.notStrictEqual(await redis.zscore("hourglass:{sent}:due", "two"), null);
  await assert.rejects(hg.scheduleMany([{ taskType: "sent", id: "b2" }], { replicas: 2, replicasTimeoutMs: 100 }), /all 1 tasks were sent/);
});

test("bad replicas options are refused before anything is sent", async () => {
  const hg = new Hourglass(redis);
  for (const options of [{ replicas: 0 }, { replicas: 1.5 }, { replicas: "1" }, { replicasTimeoutMs: 100 }, { replicas: 1, replicasTimeoutMs: 0 }]) {
    await assert.rejects(hg.schedule("sent", "bad", options), InvalidArgument, JSON.stringify(options));
  }
  await assert.rejects(hg.scheduleMany([], { replica: 1 }), InvalidArgument);
  assert.strictEqual(await redis.zscore("hourglass:{sent}:due", "bad"), null);
});

test("zz: a failover between two schedules", async () => {
  // Last in the file: the master moves for good.
  const hg = new Hourglass(redis);
  const before = await masterNow();
  assert.strictEqual(await hg.schedule("sent", "before", { delayMs: 60000, replicas: 1 }), true);
  const s = new Redis({ port: ports.sentinel, host: "127.0.0.1" });
  await s.call("SENTINEL", "FAILOVER", MASTER);
  s.disconnect();
  const deadline = Date.now() + 30000;
  while ((await masterNow()) === before) {
    assert.ok(Date.now() < deadline, "the sentinel did not fail over");
    await sleep(50);
  }
  // ioredis asks the sentinel again when its master closes the connection or turns replica
  // (READONLY: nothing written); a ReplicationTimeout means the old master is not yet the new one's replica.
  let written = null;
  while (written === null) {
    try {
      written = await hg.schedule("sent", "after", { delayMs: 60000, replicas: 1, replicasTimeoutMs: 1000 });
    } catch (e) {
      assert.ok(Date.now() < deadline, `no schedule went through after the failover: ${e}`);
      await sleep(100);
    }
  }
  assert.strictEqual(written, true);
  const master = new Redis({ port: await masterNow(), host: "127.0.0.1" });
  try {
    assert.notStrictEqual(await master.zscore("hourglass:{sent}:due", "before"), null);
    assert.notStrictEqual(await master.zscore("hourglass:{sent}:due", "after"), null);
  } finally {
    master.disconnect();
  }
});
