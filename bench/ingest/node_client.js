#!/usr/bin/env node
// One run of `hourglass bench ingest` for Node: N tasks of one type written into the Redis at URL with the
// client's scheduleMany, a raw ioredis pipeline of the same writes (ZADD due + HSET payload per task, 1,000
// tasks a batch, 4 batches in flight, as the client sends), or BullMQ's Queue.addBulk with `delay` (1,000 jobs
// a call, 4 in flight; BULLMQ=<path of the bullmq package>, default ~/.cache/peers/node_modules/bullmq).
// The tasks are built first; what is timed is the write alone. Prints one JSON line: {"seconds", "stored"}.
//
//   node bench/ingest/node_client.js <redis URL> <many|raw|bullmq> <N> <task type> <payload> <key prefix>
"use strict";

const os = require("node:os");
const path = require("node:path");
const Redis = require(path.join(__dirname, "..", "..", "clients", "node", "node_modules", "ioredis"));
const { Hourglass } = require(path.join(__dirname, "..", "..", "clients", "node"));

const [url, kind, nText, taskType, payload, prefix] = process.argv.slice(2);
const N = Number(nText);
const BATCH = 1000;
const IN_FLIGHT = 4;

function connection() {
  if (url.startsWith("redis+unix://")) return { path: url.slice("redis+unix://".length) };
  const u = new URL(url);
  return { host: u.hostname, port: Number(u.port || 6379) };
}

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

async function main() {
  const redis = new Redis({ ...connection(), maxRetriesPerRequest: 1 });
  const dueKey = `${prefix}:{${taskType}}:due`;
  const due = Date.now() + 3_600_000;
  const ids = Array.from({ length: N }, (_, i) => i.toString(16).padStart(16, "0"));
  let seconds;
  let stored;
  const time = async (run) => {
    const started = process.hrtime.bigint();
    await run();
    seconds = Number(process.hrtime.bigint() - started) / 1e9;
  };
  if (kind === "many") {
    const hg = new Hourglass(redis, { prefix });
    await hg.scheduleMany([{ taskType: `${taskType}.warm`, id: "w", atMs: due, payload }]);
    const tasks = ids.map((id) => ({ taskType, id, atMs: due, payload }));
    await time(() => hg.scheduleMany(tasks));
    stored = Number(await redis.zcard(dueKey));
  } else if (kind === "raw") {
    const payloadKey = `${prefix}:{${taskType}}:payload`;
    await time(() =>
      batched(N, async (from, to) => {
        const pipe = redis.pipeline();
        for (let i = from; i < to; i++) {
          pipe.zadd(dueKey, due, ids[i]);
          pipe.hset(payloadKey, ids[i], payload);
        }
        for (const [err] of await pipe.exec()) if (err) throw err;
      }),
    );
    stored = Number(await redis.zcard(dueKey));
  } else if (kind === "bullmq") {
    const where = process.env.BULLMQ || path.join(os.homedir(), ".cache", "peers", "node_modules", "bullmq");
    const bullmq = require(where);
    const queue = new bullmq.Queue(taskType, { connection: connection(), prefix });
    await queue.addBulk([{ name: "warm", data: {}, opts: { delay: 3_600_000, jobId: "w" } }]);
    await queue.remove("w");
    const jobs = ids.map((id) => ({ name: taskType, data: payload, opts: { delay: 3_600_000, jobId: id } }));
    await time(() => batched(N, (from, to) => queue.addBulk(jobs.slice(from, to))));
    stored = await queue.getDelayedCount();
    await queue.close();
  } else {
    throw new Error(`unknown kind ${kind}: many, raw or bullmq`);
  }
  redis.disconnect();
  console.log(JSON.stringify({ seconds, stored }));
}

main().catch((e) => {
  console.error(e.message || e);
  process.exit(1);
});
