// scheduleMany: many tasks in pipelined batches, each task the host's own schedule script on its
// shard's keys. Every task is checked first, so one bad task sends nothing.
"use strict";

const crypto = require("crypto");
const fs = require("fs");
const path = require("path");
const { HourglassError, InvalidArgument, fromReply } = require("./errors");
const { rawId, checkOptions, payloadOf, nowMs, dueMs, modeOf, describe } = require("./args");

// The schedule script's SHA, as the Hourglass constructor defines it (prelude + body): each task is a
// plain EVALSHA in the pipeline; a NOSCRIPT answer is sent again through the defined command, which
// loads the script.
const LUA = ["prelude", "schedule"].map((n) => fs.readFileSync(path.join(__dirname, "scripts", `${n}.lua`), "utf8")).join("");
const SHA = crypto.createHash("sha1").update(LUA).digest("hex");

/** Tasks per pipeline: one round trip each. */
const BATCH = 1000;
/** Pipelines in flight at once, so the client packs the next batch while Redis runs this one. */
const IN_FLIGHT = 4;
const KNOWN = ["taskType", "id", "payload", "at", "atMs", "delayMs", "mode"];

/**
 * An id as it goes on the wire: text stays text (ioredis writes strings faster than Buffers), an
 * integer its decimal text, bytes as they are; rawId refuses the rest.
 */
function wireId(id) {
  if (typeof id === "string" && id.length > 0) return id;
  if (typeof id === "number" && Number.isSafeInteger(id)) return String(id);
  return rawId(id);
}

/** A payload as it goes on the wire: text (a string, or any other value's JSON) or bytes. */
function wirePayload(p) {
  if (typeof p === "string") return p;
  const body = payloadOf(p);
  return Buffer.isBuffer(p) || p instanceof Uint8Array ? body : body.toString();
}

/** The checked form of each task: [queue, due key, payload key, id, due ms, payload, mode]. */
function prepare(hg, tasks) {
  if (tasks === null || typeof tasks !== "object" || typeof tasks[Symbol.iterator] !== "function") {
    throw new InvalidArgument(`scheduleMany takes an array of tasks (got ${describe(tasks)})`);
  }
  const now = nowMs();
  const keys = new Map();
  const out = [];
  let i = 0;
  for (const task of tasks) {
    try {
      if (task !== null && typeof task === "object" && "traceparent" in task) {
        throw new InvalidArgument("scheduleMany takes no traceparent: schedule that task with schedule()");
      }
      const { taskType: t, id, payload, mode } = checkOptions(task, KNOWN, "scheduleMany");
      const wire = wireId(id);
      const q = hg.shardFor(t, wire);
      let k = keys.get(q);
      if (k === undefined) keys.set(q, (k = [hg.key(q, "due"), hg.key(q, "payload")]));
      out.push([q, k[0], k[1], wire, dueMs(task, now), wirePayload(payload), modeOf(mode)]);
    } catch (e) {
      if (!(e instanceof HourglassError)) throw e;
      // As the Python client: an InvalidArgument naming the task; what was wrong with it is its cause.
      throw new InvalidArgument(`tasks[${i}]: ${e.message}`, { cause: e });
    }
    i++;
  }
  return out;
}

/** Sends tasks [from, to) of `prepared` and writes each answer into `written`. */
async function sendBatch(hg, prepared, from, to, written) {
  const redis = hg.redis;
  // A Cluster pipeline must stay in one slot: one pipeline per shard (hash tag), all sent at once.
  const groups = new Map();
  for (let i = from; i < to; i++) {
    const q = redis.isCluster ? prepared[i][0] : "";
    if (!groups.has(q)) groups.set(q, []);
    groups.get(q).push(i);
  }
  await Promise.all(
    [...groups.values()].map(async (indexes) => {
      const pipe = redis.pipeline();
      const args = (i) => {
        const [, due, payload, id, ms, body, mode] = prepared[i];
        return [2, due, payload, id, ms, body, body.length ? "1" : "0", mode];
      };
      for (const i of indexes) pipe.evalsha(SHA, ...args(i));
      const replies = await pipe.exec();
      // Not loaded on that server (yet): the defined command loads it (EVAL) and runs them again.
      const again = replies.flatMap(([err], j) => (err && String(err.message).includes("NOSCRIPT") ? [j] : []));
      await Promise.all(
        again.map(async (j) => {
          try {
            replies[j] = [null, await redis.hourglass_schedule(...args(indexes[j]))];
          } catch (err) {
            replies[j] = [err, null];
          }
        }),
      );
      replies.forEach(([err, reply], j) => {
        if (err) {
          const e = fromReply(err);
          e.message = `tasks[${indexes[j]}]: ${e.message}`;
          throw e;
        }
        written[indexes[j]] = reply === 1;
      });
    }),
  );
}

/**
 * Schedules `tasks`, BATCH per round trip with up to IN_FLIGHT round trips at once; resolves to
 * whether each task's due time was written, in input order. An error from Redis (a DataFault) stops
 * it: the batches sent before it are written, and the error names the task.
 */
async function scheduleMany(hg, tasks) {
  const prepared = prepare(hg, tasks);
  const written = new Array(prepared.length);
  let next = 0;
  let failed = null;
  const worker = async () => {
    while (next < prepared.length && failed === null) {
      const from = next;
      next = Math.min(prepared.length, from + BATCH);
      try {
        await sendBatch(hg, prepared, from, next, written);
      } catch (e) {
        failed = failed || e;
      }
    }
  };
  await Promise.all(Array.from({ length: Math.min(IN_FLIGHT, Math.ceil(prepared.length / BATCH)) }, worker));
  if (failed !== null) throw failed;
  return written;
}

module.exports = { scheduleMany, BATCH };
