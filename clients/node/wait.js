// waitUntilFinished: how a task ended, read from its type's events stream (`events = true`).
//
// Race-free order: note the stream's last entry, then look at the task; a host appends an outcome
// in the same script that settles the task. So a task seen waiting or running ends with an entry
// after the noted one; a task not there ended before (its entry is further back) or never was (or
// is a group's callback, scheduled when its group completes); a dead one is dead.
"use strict";

const { DataFault, NoEvents, UnknownTask, WaitTimeout } = require("./errors");
const { taskType, rawId, checkOptions, msOf } = require("./args");

const TERMINAL = new Set(["succeeded", "dead", "cancelled"]);
const WAITING = new Set(["scheduled", "due", "running"]);
/** Stream entries per read. */
const PAGE = 1000;
/** The longest XREAD BLOCK: after a block with no end, the task is looked at again. */
const BLOCK_MS = 1000;
/** Open groups whose callback ids are read per round trip (a callback whose id is not its group's). */
const GROUPS_PAGE = 200;

/** The Ended an entry reports for `raw`; null for another task, or a retry or reschedule. */
function endOf(flat, raw) {
  const f = {};
  for (let i = 0; i + 1 < flat.length; i += 2) f[flat[i].toString()] = flat[i + 1];
  if (!f.id || !f.id.equals(raw) || !f.outcome) return null;
  const outcome = f.outcome.toString();
  if (!TERMINAL.has(outcome)) return null;
  const n = (v) => (v === undefined ? null : Number(v.toString()));
  return { outcome, attempt: n(f.attempt) || 0, error: f.error === undefined ? null : f.error.toString(), finishedMs: n(f.finished_ms) };
}

const deadOf = (view) => ({ outcome: "dead", attempt: view.attempts, error: view.lastError, finishedMs: view.diedMs });

/** Entries of an XREAD reply, as [id, fields]. */
const entriesOf = (reply) => (reply || []).flatMap(([, entries]) => entries);

class Waiter {
  constructor(hg, t, raw, timeoutMs) {
    this.hg = hg;
    this.redis = hg.redis;
    this.t = t;
    this.raw = raw;
    this.timeoutMs = timeoutMs;
    this.deadline = timeoutMs === null ? null : Date.now() + timeoutMs;
    this.what = `task ${t} ${JSON.stringify(raw.toString())}`;
  }

  /** (1) the events stream of shard `q`, (2) its last entry, (3) the task, in this order. */
  async locate(q) {
    const key = this.hg.key(q, "events");
    const kind = await this.redis.type(key);
    if (kind === "none") {
      const where = q === this.t ? this.t : `${this.t} (shard ${q})`;
      throw new NoEvents(
        `type ${where} has no events stream (${key}): set events = true for it in runner.toml; a host creates the stream when it starts`,
      );
    }
    if (kind !== "stream") throw new DataFault(`${key} holds a ${kind}, not a stream: it is not an events stream`);
    const newest = await this.redis.xrevrange(key, "+", "-", "COUNT", 1);
    const last = newest.length ? newest[0][0] : "0-0";
    const view = await this.hg.show(this.t, this.raw, { payloadBytes: 0 });
    return { key, last, view };
  }

  /** The newest end of the task in the stream, read back a page at a time; null when none. */
  async scanBack(key) {
    let top = "+";
    for (;;) {
      const page = await this.redis.xrevrangeBuffer(key, top, "-", "COUNT", PAGE);
      for (const [, flat] of page) {
        const ended = endOf(flat, this.raw);
        if (ended) return ended;
      }
      if (page.length < PAGE) return null;
      top = `(${page[page.length - 1][0].toString()}`;
    }
  }

  /** What the stream holds after `last`, without blocking: { ended, last }. */
  async drain(key, last) {
    for (;;) {
      const entries = entriesOf(await this.redis.xreadBuffer("COUNT", PAGE, "STREAMS", key, last));
      for (const [id, flat] of entries) {
        last = id.toString();
        const ended = endOf(flat, this.raw);
        if (ended) return { ended, last };
      }
      if (entries.length < PAGE) return { ended: null, last };
    }
  }

  /** The id of an open or sealed group of callback type t whose callback id is the task's; else null. */
  async pendingGroup() {
    const callback = this.raw.toString();
    if (!Buffer.from(callback).equals(this.raw)) return null; // a callback id is text
    const open = (state, cb) => cb === callback && (state === "open" || state === "sealed");
    // Most groups are named after their callback: look there first.
    const [state, cb] = await this.redis.hmget(this.hg.key(this.t, `group:${callback}`), "state", "callback_id");
    if (open(state, cb)) return callback;
    const groups = this.hg.key(this.t, "groups");
    for (let start = 0; ; start += GROUPS_PAGE) {
      const ids = await this.redis.zrange(groups, start, start + GROUPS_PAGE - 1);
      if (ids.length === 0) return null;
      const pipe = this.redis.pipeline();
      for (const g of ids) pipe.hmget(this.hg.key(this.t, `group:${g}`), "state", "callback_id");
      const replies = await pipe.exec();
      for (let i = 0; i < ids.length; i++) {
        const [err, reply] = replies[i];
        if (err) throw err;
        if (open(reply[0], reply[1])) return ids[i];
      }
    }
  }

  async groupState(group) {
    const [state, fired] = await this.redis.hmget(this.hg.key(this.t, `group:${group}`), "state", "fired");
    return { state: state === null ? "gone" : state, fired };
  }

  async run() {
    // (1)-(4): note the stream's end, then look at the task; a task not there is looked for in the
    // stream, then among the groups whose callback it is.
    let q = this.hg.shardFor(this.t, this.raw);
    const tried = new Set();
    let group = null;
    let lookedAgain = false;
    let key, last, view;
    for (;;) {
      tried.add(q);
      ({ key, last, view } = await this.locate(q));
      if (view.state !== "unknown") {
        if (!tried.has(view.taskType)) {
          q = view.taskType; // found in another shard: its events are in that shard's stream
          continue;
        }
        break;
      }
      const ended = await this.scanBack(key);
      if (ended) return ended;
      group = await this.pendingGroup();
      if (group === null && !lookedAgain) {
        // A group may have completed since the look above, scheduling its callback in the same
        // step: look once more (it is then waiting, running, dead, or its end is in the stream).
        lookedAgain = true;
        continue;
      }
      if (group === null) {
        throw new UnknownTask(
          `${this.what} is unknown: not waiting, running or dead, no end of it in ${key}, and no open group of ${this.t} has it as its callback`,
        );
      }
      if (tried.has(this.t)) break;
      q = this.t; // a group's callback is scheduled in its group's slot, the type's own
    }
    if (view.state === "dead") return deadOf(view);
    if (view.state !== "unknown") group = null; // there: wait for it as for any task
    return this.follow(key, last, view, group);
  }

  /**
   * Where the task is now and, when it no longer waits, its end: read on from `last` in the
   * stream, else its dead letter. Also the stream position read up to.
   */
  async lookAgain(key, last) {
    const view = await this.hg.show(this.t, this.raw, { payloadBytes: 0 });
    if (WAITING.has(view.state)) return { view, ended: null, last };
    let ended;
    ({ ended, last } = await this.drain(key, last));
    if (!ended && view.state === "dead") ended = deadOf(view);
    return { view, ended, last };
  }

  /** (5) reads on from `last` until the task's end, the deadline, or the task gone without one. */
  async follow(key, last, view, group) {
    // XREAD BLOCK holds its connection: never the caller's.
    const conn = this.redis.duplicate();
    conn.on("error", () => {});
    let seen = WAITING.has(view.state);
    let attempt = view.attempts;
    try {
      for (;;) {
        let block = BLOCK_MS;
        if (this.deadline !== null) {
          const left = this.deadline - Date.now();
          if (left <= 0) throw new WaitTimeout(`${this.what} did not end within ${this.timeoutMs} ms`);
          block = Math.max(1, Math.min(BLOCK_MS, Math.ceil(left)));
        }
        const entries = entriesOf(await conn.xreadBuffer("COUNT", PAGE, "BLOCK", block, "STREAMS", key, last));
        for (const [id, flat] of entries) {
          last = id.toString();
          const ended = endOf(flat, this.raw);
          if (ended) return ended;
        }
        if (entries.length) continue;
        // A whole block without its end: is it still there to wait for?
        let ended;
        ({ view, ended, last } = await this.lookAgain(key, last));
        if (WAITING.has(view.state)) {
          seen = true;
          attempt = view.attempts;
          continue;
        }
        if (ended) return ended;
        if (group !== null) {
          const { state, fired } = await this.groupState(group);
          if (state === "open" || state === "sealed") continue;
          // Done: the callback was scheduled (if it was) before this look, so it is there or ended.
          ({ view, ended, last } = await this.lookAgain(key, last));
          if (WAITING.has(view.state)) {
            seen = true;
            attempt = view.attempts;
            group = null;
            continue;
          }
          if (ended) return ended;
          const name = JSON.stringify(this.raw.toString());
          throw new UnknownTask(`group ${this.t}/${group} completed without running its callback ${name} (fired: ${fired || "nothing"})`);
        }
        // Gone without an end: a client cancelled it while it waited (that adds no event).
        if (seen) return { outcome: "cancelled", attempt, error: null, finishedMs: null };
      }
    } finally {
      conn.disconnect();
    }
  }
}

async function waitUntilFinished(hg, t, id, options) {
  const { timeoutMs } = checkOptions(options, ["timeoutMs"], "waitUntilFinished");
  const ms = timeoutMs === undefined || timeoutMs === null ? null : msOf(timeoutMs, "timeoutMs");
  return new Waiter(hg, taskType(t), rawId(id), ms).run();
}

module.exports = { waitUntilFinished };
