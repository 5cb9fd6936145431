#!/usr/bin/env node
// Bulk scheduling throughput from one Node process into a private local redis-server (a free TCP
// port, never 6379): Hourglass scheduleMany, a raw ioredis pipeline of the same writes (ZADD due +
// HSET payload per task), and BullMQ's Queue.addBulk with `delay` set (when BullMQ is installed:
// see ../../../shared/peers/README.md; BULLMQ=<path to the bullmq package> to point elsewhere).
// Each the same N tasks, batches of 1000 with 4 in flight, after a warm-up; the kinds take turns,
// ROUNDS times (the machine's speed drifts), and each figure is the median of its rounds (all of
// them in `rounds`), with what each cost Redis per task (its INFO cpu before and after,
// `redis_cpu_us_per_task`). Prints one JSON line.
//
//   node bench-bulk.js [N=100000] [ROUNDS=3]
"use strict";

const { spawn } = require("node:child_process");
const fs = require("node:fs");
const net = require("node:net");
const os = require("node:os");
const path = require("node:path");
const Redis = require("ioredis");
const { Hourglass, version } = require(".");

const N = Number(process.argv[2] || 100000);
const ROUNDS = Number(process.argv[3] || 3);
const BATCH = 1000;
const IN_FLIGHT = 4;
const DELAY = 3_600_000;

function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

async function startRedis(port) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "hourglass-bench-"));
  const server = spawn("redis-server", ["--port", String(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir], {
    stdio: "ignore",
  });
  for (let i = 0; ; i++) {
    const up = await new Promise((resolve) => {
      const probe = net.connect(port, "127.0.0.1", () => (probe.end(), resolve(true)));
      probe.on("error", () => resolve(false));
    });
    if (up) break;
    if (i > 200) {
      server.kill();
      throw new Error(`redis-server did not start on port ${port}`);
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  const redis = new Redis({ port, host: "127.0.0.1", maxRetriesPerRequest: 1 });
  return { redis, stop: () => (redis.disconnect(), server.kill(), fs.rmSync(dir, { recursive: true, force: true })) };
}

/** Runs `send(from, to)` over [0, n) in batches, IN_FLIGHT at once. */
async function batched(n, send) {
  let next = 0;
  const worker = async () => {
    while (next < n) {
      const from = next;
      next = Math.min(n, from + BATCH);
      await send(from, next);
    }
  };
  await Promise.all(Array.from({ length: IN_FLIGHT }, worker));
}

/** Redis's own CPU time so far (INFO cpu: user + sys), in µs. */
async function redisCpuUs(redis) {
  const info = await redis.info("cpu");
  const field = (name) => Number(info.match(new RegExp(`${name}:([0-9.]+)`))[1]);
  return (field("used_cpu_user") + field("used_cpu_sys")) * 1e6;
}

/** Per label, the Redis CPU each of its runs cost per task (µs). */
const redisCpu = {};

async function timed(redis, label, count, run) {
  await redis.flushall();
  const cpuBefore = await redisCpuUs(redis);
  const started = process.hrtime.bigint();
  await run();
  const seconds = Number(process.hrtime.bigint() - started) / 1e9;
  (redisCpu[label] ||= []).push(Math.round(((await redisCpuUs(redis)) - cpuBefore) / N * 100) / 100);
  const stored = await count();
  if (stored !== N && stored !== undefined) throw new Error(`${label}: ${stored} stored, not ${N}`);
  return Math.round(N / seconds);
}

function loadBullmq() {
  const where = process.env.BULLMQ || path.join(os.homedir(), ".cache", "peers", "node_modules", "bullmq");
  try {
    return { bullmq: require(where), where };
  } catch {
    return { bullmq: null, where };
  }
}

async function main() {
  const port = await freePort();
  const { redis, stop } = await startRedis(port);
  const result = { bench: "bulk-schedule", n: N, batch: BATCH, in_flight: IN_FLIGHT, node: process.version, client: version };
  try {
    result.redis = (await redis.info("server")).match(/(?:redis|valkey)_version:(\S+)/)[1];
    const hg = new Hourglass(redis, { shards: { sharded: 8 } });
    const tasks = (t) => Array.from({ length: N }, (_, i) => ({ taskType: t, id: `t-${i}`, delayMs: DELAY, payload: `{"n":${i}}` }));
    const zcard = (key) => async () => Number(await redis.zcard(key));
    // Warm-up: scripts loaded, code paths compiled.
    await hg.scheduleMany(tasks("warm").slice(0, 5000));

    const shardCount = async () => {
      let n = 0;
      for (const q of hg.shardsOf("sharded")) n += Number(await redis.zcard(hg.key(q, "due")));
      return n;
    };
    const plain = tasks("bench");
    const sharded = tasks("sharded");
    const kinds = {
      scheduleMany_per_s: () => timed(redis, "scheduleMany", zcard("hourglass:{bench}:due"), () => hg.scheduleMany(plain)),
      scheduleMany_8_shards_per_s: () => timed(redis, "scheduleMany (8 shards)", shardCount, () => hg.scheduleMany(sharded)),
      raw_pipeline_per_s: () =>
        timed(redis, "raw pipeline", zcard("hourglass:{bench}:due"), () =>
          batched(N, async (from, to) => {
            const pipe = redis.pipeline();
            const due = Date.now() + DELAY;
            for (let i = from; i < to; i++) {
              pipe.zadd("hourglass:{bench}:due", due, `t-${i}`);
              pipe.hset("hourglass:{bench}:payload", `t-${i}`, `{"n":${i}}`);
            }
            for (const [err] of await pipe.exec()) if (err) throw err;
          }),
        ),
    };

    const { bullmq, where } = loadBullmq();
    let queue = null;
    if (bullmq) {
      queue = new bullmq.Queue("bench", { connection: { host: "127.0.0.1", port } });
      const jobs = Array.from({ length: N }, (_, i) => ({ name: "bench", data: { n: i }, opts: { delay: DELAY, jobId: `t-${i}` } }));
      await queue.addBulk(jobs.slice(0, 5000).map((j) => ({ ...j, opts: { ...j.opts, jobId: `w-${j.opts.jobId}` } })));
      result.bullmq_version = require(path.join(where, "package.json")).version;
      kinds.bullmq_addBulk_per_s = () =>
        timed(redis, "BullMQ addBulk", () => queue.getDelayedCount(), () => batched(N, (from, to) => queue.addBulk(jobs.slice(from, to))));
    } else {
      result.bullmq_addBulk_per_s = null;
      result.bullmq_missing = `no bullmq at ${where}`;
    }
    const rounds = {};
    for (let r = 0; r < ROUNDS; r++) {
      for (const [name, measure] of Object.entries(kinds)) (rounds[name] ||= []).push(await measure());
    }
    for (const [name, all] of Object.entries(rounds)) result[name] = [...all].sort((a, b) => a - b)[Math.floor(all.length / 2)];
    result.rounds = rounds;
    // What each kind cost Redis per task (µs of its CPU), the median of its rounds, and every round.
    result.redis_cpu_us_per_task = Object.fromEntries(
      Object.entries(redisCpu).map(([label, all]) => [label, [...all].sort((a, b) => a - b)[Math.floor(all.length / 2)]]),
    );
    result.redis_cpu_rounds = redisCpu;
    if (queue) await queue.close();
  } finally {
    stop();
  }
  console.log(JSON.stringify(result));
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
