// The Node client against a real redis-server (or valkey-server: whatever `redis-server` is on PATH),
// started by the test on a unix socket in a temp dir.
"use strict";

const { test, before, after, beforeEach } = require("node:test");
const assert = require("node:assert/strict");
const fs = require("node:fs");
const path = require("node:path");
const Redis = require("ioredis");
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
  client = new hg.Hourglass(redis);
});

test("schedule writes the contract keys and each mode keeps its promise", async () => {
  const due = Date.UTC(2030, 0, 1);
  assert.equal(await client.schedule("order.timeout", "o-1", { atMs: due, payload: '{"order":1}' }), true);
  assert.equal(Number(await redis.zscore("hourglass:{order.timeout}:due", "o-1")), due);
  assert.equal(await redis.hget("hourglass:{order.timeout}:payload", "o-1"), '{"order":1}');
  assert.equal(await client.schedule("order.timeout", "o-1", { atMs: due + 5, payload: "second", mode: "if-absent" }), false);
  assert.equal(await redis.hget("hourglass:{order.timeout}:payload", "o-1"), '{"order":1}');
  assert.equal(await client.schedule("order.timeout", "o-1", { atMs: due - 1, mode: "only-later" }), false);
  assert.equal(await client.schedule("order.timeout", "o-1", { atMs: due + 10, mode: "only-later" }), true);
  assert.equal(await client.schedule("order.timeout", "o-1", { at: new Date(due + 1), mode: "only-earlier" }), true);
  assert.equal(Number(await redis.zscore("hourglass:{order.timeout}:due", "o-1")), due + 1);
  const before = Date.now();
  await client.schedule("mail", Buffer.from([0, 255]), { delayMs: 300000, traceparent: `00-${"a".repeat(32)}-${"b".repeat(16)}-01` });
  assert.ok(Number(await redis.zscore("hourglass:{mail}:due", Buffer.from([0, 255]))) >= before + 300000);
  assert.ok((await redis.hget("hourglass:{mail}:trace", Buffer.from([0, 255]))).startsWith("00-aaaa"));
});

test("postpone, run now, show and cancel", async () => {
  await client.schedule("device.offline", "d-1", { delayMs: 30000, payload: "x".repeat(100) });
  const moved = await client.postpone("device.offline", "d-1", 60000);
  assert.equal(Number(await redis.zscore("hourglass:{device.offline}:due", "d-1")), moved);
  assert.equal(await client.postpone("device.offline", "nobody", 5), null);
  let view = await client.show("device.offline", "d-1", { payloadBytes: 10 });
  assert.equal(view.state, "scheduled");
  assert.equal(view.payloadSize, 100);
  assert.deepEqual(view.payload, Buffer.from("x".repeat(10)));
  assert.ok((await client.runNow("device.offline", "d-1")) <= Date.now() + 60000);
  assert.equal((await client.show("device.offline", "d-1")).state, "due");
  // Progress as a host stores it (a retried task keeps its last report).
  await redis.hset("hourglass:{device.offline}:progress", "d-1", '{"percent":40,"detail":{"rows":4},"attempt":1,"at_ms":5}');
  assert.deepEqual((await client.show("device.offline", "d-1")).progress, { percent: 40, detail: { rows: 4 }, attempt: 1, atMs: 5 });
  assert.deepEqual(await client.cancel("device.offline", "d-1"), { state: "scheduled", holder: "", groupTold: false });
  assert.equal(await redis.hexists("hourglass:{device.offline}:progress", "d-1"), 0, "a cancel drops the progress");
  assert.equal((await client.show("device.offline", "d-1")).state, "unknown");
  assert.equal((await client.cancel("device.offline", "d-1")).state, "unknown");
  await redis.zadd("hourglass:{device.offline}:dead", 1767600000000, "d-2");
  await redis.hset("hourglass:{device.offline}:errors", "d-2", "no answer");
  view = await client.show("device.offline", "d-2");
  assert.deepEqual([view.state, view.diedMs, view.lastError], ["dead", 1767600000000, "no answer"]);
});

test("pause, resume and stats", async () => {
  for (let i = 0; i < 3; i++) await client.schedule("report", `r-${i}`, { delayMs: 600000 });
  await client.schedule("report", "now", { atMs: Date.now() - 5 });
  const stats = await client.stats("report");
  assert.deepEqual([stats.dueNow, stats.scheduledLater, stats.inFlight, stats.pausedMs], [1, 3, 0, null]);
  assert.equal(await client.pause("report"), null);
  assert.equal((await client.stats("report")).pausedMs, 0);
  assert.equal(await client.resume("report"), true);
  assert.equal(await client.resume("report"), false);
  assert.ok((await client.pause("report", { lengthMs: 60000 })) > Date.now() + 50000);
});

test("a group: open, add, seal, show; an empty group fires at once", async () => {
  assert.equal(await client.groupOpen("order.ship", "o-17", { payload: '{"order":"o-17"}' }), true);
  assert.equal(await client.groupOpen("order.ship", "o-17", { payload: '{"order":"o-17"}' }), false);
  const later = Date.now() + 600000;
  const added = await client.groupAdd("order.ship", "o-17", [
    { taskType: "order.reserve", id: "o-17", dueMs: later },
    { taskType: "order.charge", id: "o-17", payload: '{"amount":4200}', dueMs: later },
  ]);
  assert.deepEqual(added, { joined: 2, refused: [] });
  assert.equal((await client.show("order.charge", "o-17")).group, "order.ship/o-17");
  assert.deepEqual(await client.groupSeal("order.ship", "o-17"), { state: "sealed", fired: null });
  assert.deepEqual(await client.groupSeal("order.ship", "o-17"), { state: "already", fired: null });
  const view = await client.groupShow("order.ship", "o-17");
  assert.deepEqual([view.state, view.added, view.pending, view.callbackId], ["sealed", 2, 2, "o-17"]);
  await assert.rejects(client.groupAdd("order.ship", "o-17", [{ taskType: "order.mail", id: "late" }]), hg.GroupClosed);
  assert.equal(await redis.zcard("hourglass:{order.mail}:due"), 0);

  await client.groupOpen("done", "empty", { callbackId: "cb", payload: "p" });
  assert.deepEqual(await client.groupSeal("done", "empty"), { state: "completed", fired: "callback" });
  const summary = JSON.parse(await redis.hget("hourglass:{done}:payload", "cb"));
  assert.deepEqual([summary.group, summary.payload, summary.added], ["empty", "p", 0]);
  await assert.rejects(client.groupOpen("done", "empty", { callbackId: "cb" }), hg.GroupConflict);
  assert.equal(await client.groupShow("done", "never"), null);
});

test("refusals are typed and write nothing", async () => {
  await assert.rejects(client.groupAdd("ship", "nope", [{ taskType: "step", id: "a" }]), hg.NoSuchGroup);
  await assert.rejects(client.groupSeal("ship", "nope"), hg.NoSuchGroup);
  await client.groupOpen("ship", "g", { callbackId: "one" });
  await assert.rejects(client.groupOpen("ship", "g", { callbackId: "two" }), hg.GroupConflict);
  for (const bad of ["Bad", "", "a{b}", "x".repeat(65)]) await assert.rejects(client.schedule(bad, "id"), hg.InvalidTaskType);
  await assert.rejects(client.schedule("ok", ""), hg.InvalidId);
  await assert.rejects(client.groupOpen("ok", "a\nb"), hg.InvalidId);
  await assert.rejects(client.schedule("ok", "id", { mode: "sometimes" }), hg.InvalidArgument);
  await assert.rejects(client.postpone("ok", "id", -5), hg.InvalidArgument);
  assert.deepEqual(await redis.keys("hourglass:{ok}:*"), []);
  await redis.set("hourglass:{broken}:due", "oops");
  await assert.rejects(client.schedule("broken", "b-1", { payload: "body" }), (e) => {
    assert.ok(e instanceof hg.DataFault && e.message.includes("hourglass:{broken}:due holds a string, not a zset"), e.message);
    return true;
  });
  assert.equal(await redis.exists("hourglass:{broken}:payload"), 0);
  assert.match((await client.stats("broken")).fault, /holds a string/);
});

test("ids and payloads are written as given or refused, and so are unknown options", async () => {
  // An integer id is its decimal text, as the Python client and the CLI write it; other values are JSON.
  await client.schedule("ok", 42, { payload: { order: 42, note: "é" } });
  await client.schedule("ok", -1, { payload: 5 });
  await client.schedule("ok", 7n, { payload: new Uint8Array([0, 255]) });
  const members = (await redis.zrangeBuffer("hourglass:{ok}:due", 0, -1)).map((b) => b.toString()).sort();
  assert.deepEqual(members, ["-1", "42", "7"]);
  assert.equal(await redis.hget("hourglass:{ok}:payload", "42"), '{"order":42,"note":"é"}');
  assert.equal(await redis.hget("hourglass:{ok}:payload", "-1"), "5");
  assert.deepEqual(await redis.hgetBuffer("hourglass:{ok}:payload", "7"), Buffer.from([0, 255]));
  assert.equal((await client.show("ok", 42)).payload.toString(), '{"order":42,"note":"é"}');
  // What has no faithful bytes is refused before anything is sent.
  for (const bad of [4.2, true, null, undefined, { id: 1 }, NaN]) await assert.rejects(client.schedule("bad", bad), hg.InvalidId);
  for (const bad of [Symbol("s"), () => 1, Infinity, 10n]) {
    await assert.rejects(client.schedule("bad", "id", { payload: bad }), hg.InvalidArgument);
  }
  // What JSON.stringify would flatten or drop without an error is refused too, naming where it is.
  class Order {
    constructor() {
      this.order = 42;
    }
  }
  const unfaithful = [
    [new Map([["order", 42]]), /payload is a Map/],
    [new Set([1]), /payload is a Set/],
    [[1, undefined], /payload\[1\] is undefined/],
    [{ order: 42, note: undefined }, /payload\.note is undefined/],
    [{ order: 42, total() {} }, /payload\.total is a function/],
    [new Order(), /payload is an Order/],
    [{ lines: [{ tags: new Set(["a"]) }] }, /payload\.lines\[0\]\.tags is a Set/],
    [{ n: NaN }, /payload\.n is NaN/],
    [{ [Symbol("s")]: 1 }, /payload has symbol keys/],
  ];
  for (const [bad, why] of unfaithful) {
    await assert.rejects(client.schedule("bad", "id", { payload: bad }), (e) => e instanceof hg.InvalidArgument && why.test(e.message));
    await assert.rejects(client.scheduleMany([{ taskType: "bad", id: "id", payload: bad }]), (e) => e instanceof hg.InvalidArgument && why.test(e.message));
  }
  // A value that chose its JSON form (toJSON: a Date) is written as that form.
  await client.schedule("ok", "dated", { payload: { at: new Date(0) } });
  assert.equal(await redis.hget("hourglass:{ok}:payload", "dated"), '{"at":"1970-01-01T00:00:00.000Z"}');
  // BullMQ's `delay` would have been due now: it is named, with the option it meant.
  await assert.rejects(client.schedule("bad", "id", { delay: 600000 }), (e) => {
    assert.ok(e instanceof hg.InvalidArgument && /unknown option "delay" of schedule: did you mean delayMs/.test(e.message), e.message);
    return true;
  });
  await assert.rejects(client.pause("bad", { length: 5 }), /did you mean lengthMs/);
  await assert.rejects(client.show("bad", "id", { bytes: 5 }), /unknown option "bytes" of show; known: payloadBytes/);
  await assert.rejects(client.groupOpen("bad", "g", { callback: "x" }), /unknown option "callback" of groupOpen/);
  await client.groupOpen("bad2", "g");
  await assert.rejects(client.groupAdd("bad2", "g", [{ taskType: "step", id: "a", delay: 5 }]), /"delay" of groupAdd \(a child\); known: taskType, id, payload, dueMs/);
  assert.deepEqual(await redis.keys("hourglass:{bad}:*"), []);
  assert.deepEqual(await redis.keys("hourglass:{step}:*"), []);
});

test("time is milliseconds, named so; a Date is `at`; a number where a Date belongs is refused", async () => {
  const due = Date.UTC(2031, 5, 1);
  assert.equal(await client.schedule("units", "a", { at: new Date(due) }), true);
  assert.equal(await client.schedule("units", "b", { atMs: due }), true);
  assert.equal(Number(await redis.zscore("hourglass:{units}:due", "a")), due);
  assert.equal(Number(await redis.zscore("hourglass:{units}:due", "b")), due);
  assert.equal(hg.dueMs({ delayMs: 5 }, 1000), 1005);
  assert.equal(hg.dueMs({}, 1000), 1000);
  const refusals = [
    [{ at: due }, /at takes a Date \(got \d+ \(number\)\); give a number of milliseconds since the epoch as atMs/],
    [{ at: new Date(due), atMs: due }, /give one due time, not both at and atMs/],
    [{ atMs: due, delayMs: 5 }, /not both atMs and delayMs/],
    [{ delayMs: "600000" }, /delayMs must be a number of milliseconds >= 0 \(got "600000" \(string\)\)/],
    [{ atMs: -1 }, /atMs must be a number of milliseconds >= 0/],
    [{ at: new Date("nope") }, /at is an invalid Date/],
    [{ delayMs: 5, traceparent: 7 }, /traceparent must be a string/],
  ];
  for (const [options, message] of refusals) {
    await assert.rejects(client.schedule("units", "c", options), (e) => {
      assert.ok(e instanceof hg.InvalidArgument && e.code === "HG_INVALID_ARGUMENT" && message.test(e.message), e.message);
      return true;
    });
  }
  await assert.rejects(client.postpone("units", "a", "5"), /delayMs must be a number of milliseconds/);
  await assert.rejects(client.pause("units", { lengthMs: -1 }), /lengthMs must be a number of milliseconds/);
  await client.groupOpen("units.cb", "g", { payload: { order: 1 } });
  await assert.rejects(client.groupAdd("units.cb", "g", [{ taskType: "units", id: "k", dueMs: new Date() }]), /dueMs of a child must be a number/);
  await assert.rejects(client.groupOpen("units.cb", "h", { payload: Buffer.from("x") }), /callback payload of groupOpen is text/);
  assert.deepEqual((await redis.zrange("hourglass:{units}:due", 0, -1)).sort(), ["a", "b"]);
  await client.groupSeal("units.cb", "g");
  assert.equal(JSON.parse(await redis.hget("hourglass:{units.cb}:payload", "g")).payload, '{"order":1}');
});

test("every error has a stable code beside its name", async () => {
  const codes = {
    HourglassError: "HG_ERROR",
    InvalidTaskType: "HG_INVALID_TASK_TYPE",
    InvalidId: "HG_INVALID_ID",
    InvalidArgument: "HG_INVALID_ARGUMENT",
    DataFault: "HG_DATA_FAULT",
    GroupRefused: "HG_GROUP_REFUSED",
    NoSuchGroup: "HG_NO_SUCH_GROUP",
    GroupClosed: "HG_GROUP_CLOSED",
    GroupConflict: "HG_GROUP_CONFLICT",
    NoEvents: "HG_NO_EVENTS",
    WaitTimeout: "HG_WAIT_TIMEOUT",
    UnknownTask: "HG_UNKNOWN_TASK",
  };
  for (const [name, code] of Object.entries(codes)) {
    const e = new hg[name]("why");
    assert.deepEqual([e.name, e.code, e.message, e instanceof hg.HourglassError, e instanceof Error], [name, code, "why", true, true]);
  }
  await assert.rejects(client.groupSeal("ship", "never"), { name: "NoSuchGroup", code: "HG_NO_SUCH_GROUP" });
  await assert.rejects(client.schedule("Bad", "x"), { code: "HG_INVALID_TASK_TYPE" });
  await assert.rejects(client.schedule("ok", {}), { code: "HG_INVALID_ID" });
  await redis.set("hourglass:{broken}:due", "oops");
  await assert.rejects(client.schedule("broken", "x"), { code: "HG_DATA_FAULT" });
});

test("a client with an ioredis keyPrefix is refused at construction", () => {
  const prefixed = new Redis({ path: redis.options.path, keyPrefix: "app:", lazyConnect: true });
  assert.throws(() => new hg.Hourglass(prefixed), /keyPrefix "app:"/);
  prefixed.disconnect();
  assert.throws(() => new hg.Hourglass(redis, { prefx: "x" }), /unknown option "prefx" of new Hourglass/);
  for (const bad of [5, "", "a{b}", "a b"]) assert.throws(() => new hg.Hourglass(redis, { prefix: bad }), /invalid prefix/);
  assert.equal(new hg.Hourglass(redis, { prefix: "hg.test" }).key("t", "due"), "hg.test:{t}:due");
});

test("a sharded type routes each id to its shard, as the Python client does", async () => {
  const sharded = new hg.Hourglass(redis, { shards: { hot: 3 } });
  const tags = hg.shardTags("hot", 3);
  // The same tags docs/scaling.md and the host give (tests/host/workflows/clients.rs checks the routing against the host).
  assert.deepEqual(hg.shardTags("order.timeout", 3), ["order.timeout", "order.timeout#3", "order.timeout#2"]);
  for (let i = 0; i < 30; i++) await sharded.schedule("hot", `t-${i}`, { delayMs: 600000 });
  for (let i = 0; i < 30; i++) {
    const shard = hg.shardOf(`t-${i}`, 3);
    assert.notEqual(await redis.zscore(`hourglass:{${tags[shard]}}:due`, `t-${i}`), null);
    const view = await sharded.show("hot", `t-${i}`);
    assert.deepEqual([view.taskType, view.shard], [tags[shard], shard]);
  }
  assert.equal((await sharded.stats("hot")).scheduledLater, 30);
  const wrong = tags[(hg.shardOf("stray", 3) + 1) % 3];
  await redis.zadd(`hourglass:{${wrong}}:due`, 1, "stray");
  assert.equal((await sharded.cancel("hot", "stray")).state, "scheduled");
  assert.throws(() => new hg.Hourglass(redis, { shards: { hot: 0 } }), hg.InvalidArgument);
});

test("ids route by CLUSTER KEYSLOT's hash tag rule, an empty tag before a later } too", () => {
  // Slots a real `CLUSTER KEYSLOT` gave (Redis 7.0): `{}` is no tag, so the whole id is hashed even
  // with a `}` after it (cluster-key-slot 1.1.2 hashed the bytes before that `}`: another shard).
  const slots = [["123456789", 12739], ["a{b}c", 3300], ["{{a}}", 10276], ["}{a}", 15495], ["x{", 3596], ["ab{}", 8692],
    ["{}", 15257], ["a{}b}c", 2041], ["{}}", 14790], ["x{}{y}", 14166], ["{}x}", 10489], ["x}{}y}", 12266],
    ["é{}🦀}", 231], ["🦀{é}x", 10180]];
  for (const [id, slot] of slots) {
    assert.equal(hg.shardOf(id, 16384), slot, id);
    assert.equal(hg.shardOf(Buffer.from(id), 16384), slot, id);
  }
  assert.equal(hg.shardOf(Buffer.from("0000ff94f5560ec079ee4c9e3a7b7d7db5", "hex"), 16384), 11716);
});

test("the shipped scripts are the host's", () => {
  const host = path.join(__dirname, "..", "..", "..", "host", "store", "src", "scripts");
  for (const name of fs.readdirSync(path.join(__dirname, "..", "scripts"))) {
    const mine = fs.readFileSync(path.join(__dirname, "..", "scripts", name));
    assert.ok(mine.equals(fs.readFileSync(path.join(host, name))), `${name}: run 'bash clients/sync-scripts.sh'`);
  }
});
