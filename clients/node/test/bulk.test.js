// scheduleMany against a real redis-server: the same keys and bytes as schedule, in pipelined
// batches; nothing is sent when one task is bad.
"use strict";

const { test, before, after, beforeEach } = require("node:test");
const assert = require("node:assert/strict");
const keySlot = require("cluster-key-slot");
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
  client = new hg.Hourglass(redis, { shards: { hot: 3 } });
});

const later = Date.UTC(2031, 0, 1);

test("many tasks over batches land where schedule puts them, answers in input order", async () => {
  const tasks = [];
  for (let i = 0; i < 2600; i++) {
    if (i % 3 === 0) tasks.push({ taskType: "hot", id: `h-${i}`, atMs: later + i, payload: { n: i } });
    else if (i % 3 === 1) tasks.push({ taskType: "plain", id: i, at: new Date(later + i), payload: Buffer.from([0, 255, i & 255]) });
    else tasks.push({ taskType: "plain", id: Buffer.from(`b-${i}`), delayMs: 600000, mode: "if-absent" });
  }
  const before = Date.now();
  const written = await client.scheduleMany(tasks);
  assert.equal(written.length, tasks.length);
  assert.ok(written.every((w) => w === true));
  const tags = hg.shardTags("hot", 3);
  for (let i = 0; i < 2600; i += 7) {
    const t = tasks[i];
    if (i % 3 === 0) {
      const q = tags[hg.shardOf(t.id, 3)];
      assert.equal(Number(await redis.zscore(`hourglass:{${q}}:due`, t.id)), later + i, `hot ${i}`);
      assert.equal(await redis.hget(`hourglass:{${q}}:payload`, t.id), JSON.stringify({ n: i }));
    } else if (i % 3 === 1) {
      assert.equal(Number(await redis.zscore("hourglass:{plain}:due", String(i))), later + i);
      assert.deepEqual(await redis.hgetBuffer("hourglass:{plain}:payload", String(i)), Buffer.from([0, 255, i & 255]));
    } else {
      assert.ok(Number(await redis.zscore("hourglass:{plain}:due", `b-${i}`)) >= before + 600000);
      assert.equal(await redis.hexists("hourglass:{plain}:payload", `b-${i}`), 0);
    }
  }
  assert.equal((await client.stats("hot")).scheduledLater, 867);
  assert.equal((await client.stats("plain")).scheduledLater, 2600 - 867);
  // Modes answer per task, in the order given: if-absent keeps the first, only-later only moves later.
  const again = await client.scheduleMany([
    { taskType: "plain", id: "1", atMs: 5, mode: "if-absent" },
    { taskType: "plain", id: "new", atMs: 5, mode: "if-absent" },
    { taskType: "hot", id: "h-0", atMs: later - 1, mode: "only-later" },
    { taskType: "hot", id: "h-3", atMs: later + 10, mode: "only-later" },
  ]);
  assert.deepEqual(again, [false, true, false, true]);
  assert.deepEqual(await client.scheduleMany([]), []);
  // Any iterable will do.
  function* gen() {
    yield { taskType: "gen", id: "g-1" };
    yield { taskType: "gen", id: "g-2", delayMs: 1 };
  }
  assert.deepEqual(await client.scheduleMany(gen()), [true, true]);
});

test("one bad task refuses the whole call, naming its index, and nothing is written", async () => {
  const good = (i) => ({ taskType: "bulk", id: `t-${i}`, delayMs: 1000 });
  const cases = [
    [{ taskType: "bulk", id: "" }, hg.InvalidId, /^tasks\[1500\]: invalid task id: it is empty$/],
    [{ taskType: "Bulk", id: "x" }, hg.InvalidTaskType, /^tasks\[1500\]: invalid task type "Bulk"/],
    [{ taskType: "bulk", id: "x", delay: 5 }, hg.InvalidArgument, /^tasks\[1500\]: unknown option "delay" of scheduleMany: did you mean delayMs/],
    [{ taskType: "bulk", id: "x", at: 5 }, hg.InvalidArgument, /^tasks\[1500\]: at takes a Date .*atMs/],
    [{ taskType: "bulk", id: "x", mode: "later" }, hg.InvalidArgument, /^tasks\[1500\]: invalid mode "later"/],
    [{ taskType: "bulk", id: "x", payload: () => 1 }, hg.InvalidArgument, /^tasks\[1500\]: payload/],
    [{ taskType: "bulk", id: "x", traceparent: "00-..." }, hg.InvalidArgument, /^tasks\[1500\]: scheduleMany takes no traceparent/],
    ["bulk/x", hg.InvalidArgument, /^tasks\[1500\]: the options of scheduleMany must be an object/],
  ];
  for (const [bad, kind, message] of cases) {
    const tasks = Array.from({ length: 3000 }, (_, i) => (i === 1500 ? bad : good(i)));
    await assert.rejects(client.scheduleMany(tasks), (e) => {
      assert.ok(e instanceof hg.InvalidArgument && message.test(e.message), e.message);
      assert.ok(e.cause instanceof kind, `${e.cause}`);
      return true;
    });
  }
  await assert.rejects(client.scheduleMany({ taskType: "bulk", id: "x" }), /scheduleMany takes an array of tasks/);
  await assert.rejects(client.scheduleMany(null), hg.InvalidArgument);
  assert.deepEqual(await redis.keys("*"), []);
});

test("a data fault in Redis stops it and names the task", async () => {
  await redis.set("hourglass:{broken}:due", "oops");
  const tasks = Array.from({ length: 10 }, (_, i) => ({ taskType: i === 5 ? "broken" : "fine", id: `t-${i}` }));
  await assert.rejects(client.scheduleMany(tasks), (e) => {
    assert.ok(e instanceof hg.DataFault && /^tasks\[5\]: .*hourglass:\{broken\}:due holds a string/.test(e.message), e.message);
    return true;
  });
  assert.equal(await redis.exists("hourglass:{broken}:payload"), 0);
});

test("on a Cluster each pipeline stays in one slot", async () => {
  // A stand-in for an ioredis Cluster: the same connection, but `isCluster`, and every pipeline checked.
  const slotsPerPipeline = [];
  const fake = new Proxy(redis, {
    get(target, prop) {
      if (prop === "isCluster") return true;
      if (prop === "pipeline") {
        return () => {
          const pipe = target.pipeline();
          const exec = pipe.exec.bind(pipe);
          pipe.exec = () => {
            slotsPerPipeline.push(new Set(pipe._queue.flatMap((c) => c.getKeys().map((k) => keySlot(k)))));
            return exec();
          };
          return pipe;
        };
      }
      const v = Reflect.get(target, prop);
      return typeof v === "function" ? v.bind(target) : v;
    },
  });
  const sharded = new hg.Hourglass(fake, { shards: { hot: 3 } });
  const tasks = Array.from({ length: 1500 }, (_, i) => ({ taskType: i % 2 ? "hot" : "cold", id: `c-${i}`, atMs: later }));
  assert.ok((await sharded.scheduleMany(tasks)).every((w) => w));
  // Batches of 1000 and 500, each split over cold and the 3 shards of hot: 8 pipelines, 1 slot each.
  assert.equal(slotsPerPipeline.length, 8);
  assert.ok(slotsPerPipeline.every((s) => s.size === 1), slotsPerPipeline.map((s) => [...s]).join(" "));
  assert.equal((await client.stats("hot")).scheduledLater + (await client.stats("cold")).scheduledLater, 1500);
});

test("after SCRIPT FLUSH a later batch still sees an earlier one's write", async () => {
  await redis.script("FLUSH");
  // Three batches in flight at once, each refused with NOSCRIPT and sent again: in their order.
  const tasks = Array.from({ length: 2500 }, (_, i) => ({ taskType: "ordered", id: `t-${i}`, payload: String(i), delayMs: 600000 }));
  tasks[1700] = { taskType: "ordered", id: "t-0", delayMs: 1, mode: "if-absent", payload: "late" };
  tasks[2300] = { taskType: "ordered", id: "t-1", delayMs: 1, payload: "replaced" };
  const written = await client.scheduleMany(tasks);
  assert.deepEqual(written.flatMap((w, i) => (w ? [] : [i])), [1700]);
  assert.equal(await redis.hget("hourglass:{ordered}:payload", "t-0"), "0");
  assert.equal(await redis.hget("hourglass:{ordered}:payload", "t-1"), "replaced");
});

test("after SCRIPT FLUSH (NOSCRIPT) it loads the script and writes the same bytes as schedule", async () => {
  await redis.script("FLUSH");
  const ids = ["é-1", "日本-2", "😀", 42, Buffer.from([0, 255]), "{x}", "plain"];
  const written = await client.scheduleMany(ids.map((id) => ({ taskType: "hot", id, atMs: later, payload: { id: String(id) } })));
  assert.deepEqual(written, ids.map(() => true));
  const viaMany = await redis.keys("hourglass:*");
  const dump = async () => {
    const out = {};
    for (const k of (await redis.keys("hourglass:*")).sort()) {
      out[k] = (await redis.type(k)) === "zset" ? await redis.zrangeBuffer(k, 0, -1, "WITHSCORES") : await redis.hgetallBuffer(k);
    }
    return out;
  };
  const many = await dump();
  await redis.flushall();
  for (const id of ids) await client.schedule("hot", id, { atMs: later, payload: { id: String(id) } });
  assert.deepEqual(await dump(), many);
  assert.ok(viaMany.length >= 4, viaMany.join(" "));
});
