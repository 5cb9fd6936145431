// waitUntilFinished reading a type's events stream, written here with XADD as a host writes it
// (docs/operations.md, "Completion events"); tests/host/workflows/clients.rs has a host run them.
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
  client = new hg.Hourglass(redis, { shards: { hot: 3 } });
});

/** Creates the (empty) stream, as a host does when it starts serving a type with events on. */
async function openEvents(q) {
  await redis.xadd(`hourglass:{${q}}:events`, "*", "x", "y");
  await redis.xtrim(`hourglass:{${q}}:events`, "MAXLEN", 0);
}

/** Appends an event as a host does. */
function event(q, id, outcome, attempt, extra = {}) {
  const fields = { id, outcome, attempt, due_ms: 1, started_ms: 2, finished_ms: 1000 + attempt, ...extra };
  return redis.xadd(`hourglass:{${q}}:events`, "*", ...Object.entries(fields).flat());
}

const soon = (ms, f) => new Promise((resolve, reject) => setTimeout(() => f().then(resolve, reject), ms));

test("a waiting task: skips other ids and non-terminal outcomes, returns its end", async () => {
  await openEvents("mail");
  await client.schedule("mail", "m-1", { delayMs: 60000 });
  const ended = client.waitUntilFinished("mail", "m-1", { timeoutMs: 10000 });
  await soon(100, async () => {
    await event("mail", "m-2", "succeeded", 1);
    await event("mail", "m-1", "retried", 1, { error: "busy", retry_at_ms: 5 });
    await event("mail", "m-1", "rescheduled", 1);
    await event("mail", "m-1", "succeeded", 2);
  });
  assert.deepEqual(await ended, { outcome: "succeeded", attempt: 2, error: null, finishedMs: 1002 });
});

test("an end before the call is not taken for this run's end", async () => {
  await openEvents("mail");
  // It succeeded once, and was scheduled again: the old end is history.
  await event("mail", "again", "succeeded", 1);
  await client.schedule("mail", "again", { delayMs: 60000 });
  const ended = client.waitUntilFinished("mail", "again");
  // The caller's connection stays free while it waits (XREAD BLOCK has a connection of its own).
  await soon(100, async () => assert.equal(await redis.ping(), "PONG"));
  await event("mail", "again", "dead", 3, { error: "no answer" });
  assert.deepEqual(await ended, { outcome: "dead", attempt: 3, error: "no answer", finishedMs: 1003 });
});

test("a dead task answers at once from its state", async () => {
  await openEvents("mail");
  await redis.zadd("hourglass:{mail}:dead", 1767600000000, "d-1");
  await redis.hset("hourglass:{mail}:errors", "d-1", "no answer");
  await redis.hset("hourglass:{mail}:attempts", "d-1", 5);
  const ended = await client.waitUntilFinished("mail", "d-1", { timeoutMs: 0 });
  assert.deepEqual(ended, { outcome: "dead", attempt: 5, error: "no answer", finishedMs: 1767600000000 });
});

test("a task gone already: its newest end, found scanning back page by page; else UnknownTask", async () => {
  await openEvents("mail");
  await event("mail", "gone", "dead", 1, { error: "old" });
  await event("mail", "gone", "cancelled", 1);
  await event("mail", "gone", "retried", 1);
  for (let i = 0; i < 1200; i++) await event("mail", `other-${i}`, "succeeded", 1);
  assert.deepEqual(await client.waitUntilFinished("mail", "gone"), { outcome: "cancelled", attempt: 1, error: null, finishedMs: 1001 });
  await assert.rejects(client.waitUntilFinished("mail", "never", { timeoutMs: 100 }), (e) => {
    assert.ok(e instanceof hg.UnknownTask && e.code === "HG_UNKNOWN_TASK", e.message);
    const why = 'task mail "never" is unknown: not waiting, running or dead, no end of it in hourglass:{mail}:events';
    assert.equal(e.message, `${why}, and no open group of mail has it as its callback`);
    return true;
  });
});

test("timeout, no stream, a stream of the wrong kind and bad options are told apart", async () => {
  await client.schedule("quiet", "q-1", { delayMs: 60000 });
  await assert.rejects(client.waitUntilFinished("quiet", "q-1"), (e) => {
    assert.ok(e instanceof hg.NoEvents && e.code === "HG_NO_EVENTS", e.message);
    assert.match(e.message, /^type quiet has no events stream \(hourglass:\{quiet\}:events\): set events = true for it in runner.toml/);
    return true;
  });
  await openEvents("quiet");
  const started = Date.now();
  await assert.rejects(client.waitUntilFinished("quiet", "q-1", { timeoutMs: 300 }), (e) => {
    assert.ok(e instanceof hg.WaitTimeout && e.code === "HG_WAIT_TIMEOUT", e.message);
    assert.match(e.message, /task quiet "q-1" did not end within 300 ms/);
    return true;
  });
  const took = Date.now() - started;
  assert.ok(took >= 290 && took < 3000, `${took} ms`);
  await redis.set("hourglass:{odd}:events", "x");
  await assert.rejects(client.waitUntilFinished("odd", "x"), (e) => e instanceof hg.DataFault && /holds a string, not a stream/.test(e.message));
  await assert.rejects(
    client.waitUntilFinished("quiet", "q-1", { timeout: 5 }),
    /unknown option "timeout" of waitUntilFinished: did you mean timeoutMs/,
  );
  await assert.rejects(client.waitUntilFinished("quiet", "q-1", { timeoutMs: "5" }), hg.InvalidArgument);
  await assert.rejects(client.waitUntilFinished("Quiet", "q-1"), hg.InvalidTaskType);
  // Every wait gave its blocking connection back.
  let clients;
  for (let tries = 0; tries < 40; tries++) {
    clients = (await redis.client("LIST")).trim().split("\n");
    if (clients.length === 1) break;
    await new Promise((r) => setTimeout(r, 50));
  }
  assert.equal(clients.length, 1, clients.join("\n"));
});

test("a sharded type: the task's own shard's stream", async () => {
  const tags = hg.shardTags("hot", 3);
  // An id outside shard 0, whose stream is not the type's own.
  const id = ["s-1", "s-2", "s-3", "s-4", "s-5"].find((i) => hg.shardOf(i, 3) !== 0);
  const q = tags[hg.shardOf(id, 3)];
  await client.schedule("hot", id, { delayMs: 60000 });
  await openEvents("hot");
  await assert.rejects(client.waitUntilFinished("hot", id), (e) => e instanceof hg.NoEvents && e.message.includes(`hourglass:{${q}}:events`));
  for (const tag of tags) await openEvents(tag);
  const ended = client.waitUntilFinished("hot", id, { timeoutMs: 10000 });
  await soon(100, async () => {
    for (const other of tags.filter((t) => t !== q)) await event(other, id, "cancelled", 1);
    await event(q, id, "succeeded", 1);
  });
  assert.deepEqual(await ended, { outcome: "succeeded", attempt: 1, error: null, finishedMs: 1001 });
});

test("a group's callback is a task: wait for (callback type, callback id)", async () => {
  await openEvents("order.ship");
  await client.groupOpen("order.ship", "o-9", { callbackId: "ship-o-9" });
  assert.deepEqual(await client.groupSeal("order.ship", "o-9"), { state: "completed", fired: "callback" });
  assert.equal((await client.show("order.ship", "ship-o-9")).state, "due");
  const ended = client.waitUntilFinished("order.ship", "ship-o-9", { timeoutMs: 10000 });
  await soon(100, () => event("order.ship", "ship-o-9", "succeeded", 1));
  assert.deepEqual(await ended, { outcome: "succeeded", attempt: 1, error: null, finishedMs: 1001 });
});

test("a task a client cancels while it waits: cancelled (a client's cancel adds no event)", async () => {
  await openEvents("mail");
  await client.schedule("mail", "c-1", { delayMs: 60000 });
  const started = Date.now();
  const ended = client.waitUntilFinished("mail", "c-1", { timeoutMs: 20000 });
  await soon(100, () => client.cancel("mail", "c-1"));
  assert.deepEqual(await ended, { outcome: "cancelled", attempt: 0, error: null, finishedMs: null });
  assert.ok(Date.now() - started < 5000);
});

test("a callback not scheduled yet: waits while its group is open or sealed, then for the callback", async () => {
  await openEvents("order.ship");
  // A group named after its callback, and one whose callback id is another (found among the open groups).
  for (const [g, cb] of [["o-1", "o-1"], ["o-2", "ship-o-2"]]) {
    await client.groupOpen("order.ship", g, { callbackId: cb });
    await client.groupAdd("order.ship", g, [{ taskType: "order.charge", id: g, dueMs: Date.now() + 600000 }]);
    assert.deepEqual(await client.groupSeal("order.ship", g), { state: "sealed", fired: null });
    const ended = client.waitUntilFinished("order.ship", cb, { timeoutMs: 20000 });
    // What a host does: the group completes and schedules its callback, later the callback runs.
    await soon(300, async () => {
      await redis.multi().hset(`hourglass:{order.ship}:group:${g}`, "state", "done", "fired", "callback")
        .zadd("hourglass:{order.ship}:due", Date.now(), cb).exec();
    });
    await soon(1500, () => event("order.ship", cb, "succeeded", 1));
    assert.deepEqual(await ended, { outcome: "succeeded", attempt: 1, error: null, finishedMs: 1001 });
  }
  // A group done without running its callback (a chain whose child died: skipped).
  await client.groupOpen("order.ship", "o-3", { when: "success" });
  await client.groupAdd("order.ship", "o-3", [{ taskType: "order.charge", id: "o-3", dueMs: Date.now() + 600000 }]);
  const skipped = client.waitUntilFinished("order.ship", "o-3", { timeoutMs: 20000 });
  await soon(300, () => redis.hset("hourglass:{order.ship}:group:o-3", "state", "done", "fired", "skipped"));
  await assert.rejects(skipped, (e) => {
    assert.ok(e instanceof hg.UnknownTask, e.message);
    assert.equal(e.message, 'group order.ship/o-3 completed without running its callback "o-3" (fired: skipped)');
    return true;
  });
});
