// scheduleMany: many tasks in batches, each batch one call of the host's own schedule_batch script
// per shard (type) in it. Every task is checked first, so one bad task sends nothing.
"use strict";

const crypto = require("crypto");
const fs = require("fs");
const path = require("path");
const { HourglassError, InvalidArgument, fromReply } = require("./errors");
const { rawId, checkOptions, payloadOf, nowMs, dueMs, modeOf, describe } = require("./args");

// The schedule_batch script's SHA, as the Hourglass constructor defines it (prelude + body): each
// call is a plain EVALSHA in the pipeline; a NOSCRIPT answer is sent again through the defined
// command, which loads the script.
const LUA = ["prelude", "schedule_batch"].map((n) => fs.readFileSync(path.join(__dirname, "scripts", `${n}.lua`), "utf8")).join("");
const SHA = crypto.createHash("sha1").update(LUA).digest("hex");

/** Tasks per round trip. */
const BATCH = 1000;
/**
 * Most tasks, and bytes of ids and payloads, in one script call (the host's MAX_BATCH_TASKS and
 * MAX_BATCH_BYTES): a call holds Redis while it runs, about a millisecond at most.
 */
const MAX_BATCH_TASKS = 200;
const MAX_BATCH_BYTES = 256 * 1024;
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

/** Tasks [from, to) of `prepared` as schedule_batch calls: per shard in their order, cut at MAX_BATCH_TASKS and MAX_BATCH_BYTES. */
function calls(prepared, from, to) {
  const byQueue = new Map();
  for (let i = from; i < to; i++) {
    const q = prepared[i][0];
    if (!byQueue.has(q)) byQueue.set(q, []);
    byQueue.get(q).push(i);
  }
  const out = [];
  for (const [q, members] of byQueue) {
    let call = { q, indexes: [], size: 0 };
    for (const i of members) {
      const [, , , id, , body] = prepared[i];
      const size = Buffer.byteLength(id) + Buffer.byteLength(body);
      if (call.indexes.length === MAX_BATCH_TASKS || (call.indexes.length > 0 && call.size + size > MAX_BATCH_BYTES)) {
        out.push(call);
        call = { q, indexes: [], size: 0 };
      }
      call.indexes.push(i);
      call.size += size;
    }
    out.push(call);
  }
  return out;
}

/** Sends tasks [from, to) of `prepared` and writes each answer into `written`. */
async function sendBatch(hg, prepared, from, to, written, order) {
  const redis = hg.redis;
  // A Cluster pipeline must stay in one slot: one pipeline per shard (hash tag), all sent at once.
  const groups = new Map();
  for (const call of calls(prepared, from, to)) {
    const slot = redis.isCluster ? call.q : "";
    if (!groups.has(slot)) groups.set(slot, []);
    groups.get(slot).push(call);
  }
  await Promise.all(
    [...groups.values()].map(async (batch) => {
      const pipe = redis.pipeline();
      const args = (call) => {
        const [, due, payload] = prepared[call.indexes[0]];
        const out = [2, due, payload];
        for (const i of call.indexes) {
          const [, , , id, ms, body, mode] = prepared[i];
          out.push(id, ms, body, mode);
        }
        return out;
      };
      for (const call of batch) pipe.evalsha(SHA, ...args(call));
      const replies = await pipe.exec();
      // Not loaded on that server (yet): the defined command loads it (EVAL) and runs them again, in
      // the order the batches were sent (`order`), so a later task still sees an earlier one's write.
      const again = replies.flatMap(([err], j) => (err && String(err.message).includes("NOSCRIPT") ? [j] : []));
      if (again.length > 0) {
        const resend = async () => {
          for (const j of again) {
            try {
              replies[j] = [null, await redis.hourglass_schedule_batch(...args(batch[j]))];
            } catch (err) {
              replies[j] = [err, null];
            }
          }
        };
        order.last = order.last.then(resend, resend);
        await order.last;
      }
      replies.forEach(([err, reply], j) => {
        const { indexes } = batch[j];
        if (err) {
          const e = fromReply(err);
          e.message = `tasks[${indexes[0]}]: ${e.message} (the ${indexes.length} of its shard in its batch, from tasks[${indexes[0]}], were not written)`;
          throw e;
        }
        indexes.forEach((i, k) => {
          written[i] = reply[k] === 1;
        });
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
  // The resends after NOSCRIPT, one after the other in the order their batches were sent.
  const order = { last: Promise.resolve() };
  const worker = async () => {
    while (next < prepared.length && failed === null) {
      const from = next;
      next = Math.min(prepared.length, from + BATCH);
      try {
        await sendBatch(hg, prepared, from, next, written, order);
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
