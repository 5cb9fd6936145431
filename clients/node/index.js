// Hourglass from Node: schedule, postpone, cancel and inspect delayed tasks, pause types and build
// workflow groups; each call is one of the host's own Lua scripts (scripts/, copied from the host).
"use strict";

const fs = require("fs");
const path = require("path");
const errors = require("./errors");
const { shardTags, shardOf } = require("./shards");

const { InvalidTaskType, InvalidId, InvalidArgument, fromReply } = errors;

const TYPE = /^[a-z0-9][a-z0-9._-]{0,63}$/;
const MODES = ["upsert", "if-absent", "only-later", "only-earlier"];
const GROUP_ID_MAX = 200;
// Children per script call, as the host sends them (its CHILDREN_PER_CALL).
const CHILDREN_PER_CALL = 256;
const SCRIPTS = ["schedule", "reschedule", "cancel", "show", "pause", "resume", "stats"].concat([
  "group_join",
  "group_child",
  "group_end",
]);

function load(name) {
  return fs.readFileSync(path.join(__dirname, "scripts", `${name}.lua`), "utf8");
}

/** `name` when it is a valid task type name; else throws InvalidTaskType. */
function taskType(name) {
  if (typeof name !== "string" || !TYPE.test(name)) {
    throw new InvalidTaskType(`invalid task type ${JSON.stringify(name)}: allowed: [a-z0-9][a-z0-9._-]{0,63}`);
  }
  return name;
}

/** How a refused value reads in an error: its JSON where it has one, else its type. */
function describe(v) {
  try {
    const json = JSON.stringify(v);
    if (json !== undefined) return `${json} (${v === null ? "null" : typeof v})`;
  } catch {
    // a BigInt or a cycle: the type says enough
  }
  return typeof v;
}

// An integer is its decimal text, as the Python client, the CLI and redis-cli write it; anything
// else that is not text or bytes is refused rather than turned into "[object Object]".
function rawId(id, what = "task id") {
  let raw;
  if (Buffer.isBuffer(id)) raw = id;
  else if (id instanceof Uint8Array) raw = Buffer.from(id);
  else if (typeof id === "string") raw = Buffer.from(id);
  else if ((typeof id === "number" && Number.isSafeInteger(id)) || typeof id === "bigint") raw = Buffer.from(String(id));
  else throw new InvalidId(`invalid ${what} ${describe(id)}: give a string, a Buffer or an integer`);
  if (raw.length === 0) throw new InvalidId(`invalid ${what}: it is empty`);
  return raw;
}

/**
 * Throws InvalidArgument for an option `call` does not know, naming it (and `fooMs` for `foo`),
 * instead of ignoring it: BullMQ's `delay` would otherwise schedule a task due now.
 */
function checkOptions(options, known, call) {
  if (options === null || typeof options !== "object") {
    throw new InvalidArgument(`the options of ${call} must be an object (got ${describe(options)})`);
  }
  for (const name of Object.keys(options)) {
    if (known.includes(name)) continue;
    const ms = `${name}Ms`;
    const hint = known.includes(ms) ? `: did you mean ${ms} (milliseconds)?` : `; known: ${known.join(", ")}`;
    throw new InvalidArgument(`unknown option ${JSON.stringify(name)} of ${call}${hint}`);
  }
  return options;
}

function textId(id, what, most = GROUP_ID_MAX) {
  if (typeof id !== "string" || id.length === 0 || Buffer.byteLength(id) > most) {
    throw new InvalidId(`invalid ${what} ${JSON.stringify(id)}: it must be 1 to ${most} bytes of text`);
  }
  // eslint-disable-next-line no-control-regex
  if (/[\u0000-\u001f\u007f-\u009f]/.test(id)) {
    throw new InvalidId(`invalid ${what} ${JSON.stringify(id)}: it may not contain control characters`);
  }
  return id;
}

/** Bytes as they are, a string as UTF-8, and any other value as its JSON text (`{order: 42}`, `5`). */
function payloadOf(p) {
  if (p === undefined || p === null) return Buffer.alloc(0);
  if (Buffer.isBuffer(p)) return p;
  if (p instanceof Uint8Array) return Buffer.from(p);
  if (typeof p === "string") return Buffer.from(p);
  let json;
  try {
    json = JSON.stringify(p);
  } catch (e) {
    throw new InvalidArgument(`payload ${describe(p)} is not a Buffer, a string or JSON-able: ${e.message}`);
  }
  if (json === undefined || (typeof p === "number" && !Number.isFinite(p))) {
    throw new InvalidArgument(`payload ${describe(p)} is not a Buffer, a string or JSON-able`);
  }
  return Buffer.from(json);
}

/** This machine's clock in ms since the epoch. */
function nowMs() {
  return Date.now();
}

function msOf(delay, what = "a delay") {
  const ms = Math.floor(Number(delay || 0));
  if (!Number.isFinite(ms) || ms < 0) throw new InvalidArgument(`${what} must be a number of ms >= 0 (got ${delay})`);
  return ms;
}

/** A due time: `at` (a Date, or ms since the epoch), else now plus `delayMs`. */
function dueMs(at, delayMs) {
  if (at !== undefined && at !== null && delayMs !== undefined && delayMs !== null) {
    throw new InvalidArgument("give a due time 'at' or a 'delayMs', not both");
  }
  if (at instanceof Date) return at.getTime();
  if (at !== undefined && at !== null) return msOf(at, "a due time");
  return nowMs() + msOf(delayMs);
}

const text = (v) => (Buffer.isBuffer(v) ? v.toString("utf8") : v === null || v === undefined ? v : String(v));
const num = (v) => (v === null || v === undefined ? null : Math.trunc(Number(text(v))));

/**
 * Schedules and inspects Hourglass tasks through the host's own scripts.
 *
 * `redis` is an ioredis `Redis` or `Cluster`; `prefix` is the hosts' `[redis] prefix`; `shards` maps
 * each sharded type to its `[types.T] shards` (the same N the hosts run with).
 */
class Hourglass {
  constructor(redis, options = {}) {
    const { prefix = "hourglass", shards = {} } = checkOptions(options, ["prefix", "shards"], "new Hourglass");
    // ioredis would put its keyPrefix before every key, where no host reads them (BullMQ refuses it too).
    const keyPrefix = redis && redis.options && (redis.options.keyPrefix || (redis.options.redisOptions || {}).keyPrefix);
    if (keyPrefix) {
      throw new InvalidArgument(
        `this ioredis client has keyPrefix ${JSON.stringify(keyPrefix)}, which would move every key away from the hosts: ` +
          "give Hourglass a client without keyPrefix (the hosts' [redis] prefix is the `prefix` option)",
      );
    }
    this.redis = redis;
    this.prefix = prefix;
    this.shards = new Map();
    for (const [name, n] of Object.entries(shards)) {
      if (!Number.isInteger(n) || n < 1 || n > 256) {
        throw new InvalidArgument(`shards of ${JSON.stringify(name)} must be 1 to 256 (got ${n})`);
      }
      if (n > 1) this.shards.set(taskType(name), shardTags(name, n));
    }
    const prelude = load("prelude");
    for (const name of SCRIPTS) {
      const command = `hourglass_${name}`;
      // Each client defines it once; the SHA is the host's (same prelude + body).
      if (typeof redis[command] !== "function") redis.defineCommand(command, { lua: prelude + load(name) });
    }
  }

  /** The name of key `suffix` of type (or shard) `queue`: `hourglass:{T}:due`. */
  key(queue, suffix) {
    return `${this.prefix}:{${queue}}:${suffix}`;
  }

  /** The shard (its hash tag) that holds `id` of type `t`; `t` itself when unsharded. */
  shardFor(t, id) {
    const tags = this.shards.get(taskType(t));
    return tags ? tags[shardOf(rawId(id), tags.length)] : t;
  }

  shardsOf(t) {
    return this.shards.get(t) || [t];
  }

  // Its own shard, the other shards, then the tags of the layout before shard tags spread
  // (T#1..T#N-1) that the hosts drain: as the host looks.
  lookupOrder(t, id) {
    const own = this.shardFor(t, id);
    const current = this.shardsOf(t);
    const old = [];
    for (let k = 1; k < current.length; k++) if (!current.includes(`${t}#${k}`)) old.push(`${t}#${k}`);
    return [own, ...current.filter((s) => s !== own), ...old];
  }

  async run(name, keys, args, buffers = false) {
    const command = `hourglass_${name}${buffers ? "Buffer" : ""}`;
    try {
      return await this.redis[command](keys.length, ...keys, ...args);
    } catch (e) {
      throw fromReply(e);
    }
  }

  /**
   * Schedules task `id` of type `t` at `at` (a Date or ms) or after `delayMs` (default: now).
   * `mode`: "upsert" (the last schedule wins), "if-absent" (dedupe), "only-later" (debounce) or
   * "only-earlier"; the payload is written only with the due time. `traceparent` (W3C) makes the
   * run's span continue the caller's trace. Resolves to whether the due time was written.
   */
  async schedule(t, id, options = {}) {
    const known = ["at", "delayMs", "payload", "mode", "traceparent"];
    const { at, delayMs, payload, mode = "upsert", traceparent } = checkOptions(options, known, "schedule");
    if (!MODES.includes(mode)) throw new InvalidArgument(`invalid mode ${JSON.stringify(mode)}: expected one of ${MODES.join(", ")}`);
    const raw = rawId(id);
    const body = payloadOf(payload);
    const due = dueMs(at, delayMs);
    const q = this.shardFor(t, raw);
    if (traceparent !== undefined && mode === "upsert") await this.redis.hset(this.key(q, "trace"), raw, traceparent);
    const written = await this.run("schedule", [this.key(q, "due"), this.key(q, "payload")], [raw, due, body, body.length ? "1" : "0", mode]);
    if (traceparent !== undefined && mode !== "upsert" && written === 1) {
      await this.redis.hset(this.key(q, "trace"), raw, traceparent);
    }
    return written === 1;
  }

  /** Moves a scheduled task `delayMs` later than the later of its due time and now: its new due time, or null when it is not scheduled. */
  async postpone(t, id, delayMs) {
    return this.reschedule(t, id, ["postpone", msOf(delayMs)]);
  }

  /** Makes a scheduled task due now: its new due time, or null when it is not scheduled. */
  async runNow(t, id) {
    return this.reschedule(t, id, ["now"]);
  }

  async reschedule(t, id, how) {
    const raw = rawId(id);
    for (const q of this.lookupOrder(taskType(t), raw)) {
      const due = await this.run("reschedule", [this.key(q, "due")], [raw, ...how]);
      if (due) return num(due);
    }
    return null;
  }

  /**
   * Cancels a task: removed when scheduled; when running, its host is asked to stop it (settled as
   * cancelled, never retried). Resolves to { state: "scheduled" | "running" | "unknown", holder, groupTold }.
   */
  async cancel(t, id) {
    const raw = rawId(id);
    for (const q of this.lookupOrder(taskType(t), raw)) {
      const keys = ["due", "payload", "tokens", "claimed", "cancels", "member", "outbox", "seq", "held"].map((s) => this.key(q, s));
      const [state, detail] = (await this.run("cancel", keys, [raw, q, `${this.prefix}:cancel`])).map(text);
      if (state === "scheduled") {
        await this.redis.hdel(this.key(q, "trace"), raw);
        return { state, holder: "", groupTold: detail === "1" };
      }
      if (state === "running") return { state, holder: detail, groupTold: false };
    }
    return { state: "unknown", holder: "", groupTold: false };
  }

  /** Where task `id` is and what Redis holds about it (state "unknown" when nowhere); `payloadBytes` of its payload. */
  async show(t, id, options = {}) {
    const { payloadBytes = 65536 } = checkOptions(options, ["payloadBytes"], "show");
    const raw = rawId(id);
    const order = this.lookupOrder(taskType(t), raw);
    let view;
    for (const q of order) {
      view = await this.showIn(q, raw, payloadBytes);
      if (view.state !== "unknown") break;
    }
    if (view.state === "unknown") view.taskType = order[0];
    const tags = this.shards.get(t);
    if (tags && tags.includes(view.taskType)) view.shard = tags.indexOf(view.taskType);
    return view;
  }

  async showIn(q, raw, most) {
    const suffixes = ["due", "leases", "tokens", "attempts", "errors", "dead", "payload", "claims", "claimed", "member", "held"];
    const r = await this.run("show", suffixes.map((s) => this.key(q, s)), [raw, Math.max(0, Math.floor(most))], true);
    const [now, due, leaseUntil, entry, attempts, error, died, size, head, group] = r;
    let running = null;
    if (leaseUntil !== null && entry !== null) {
      const [numbers, ...host] = text(entry).split("@");
      const [token, attempt] = numbers.split(":");
      running = { host: host.join("@"), attempt: Number(attempt), token: Number(token), untilMs: num(leaseUntil) };
    } else if (leaseUntil !== null) {
      running = { host: "", attempt: (num(attempts) || 0) + 1, token: 0, untilMs: num(leaseUntil) };
    }
    const dueAt = num(due);
    const diedAt = num(died);
    let state = "unknown";
    if (running) state = "running";
    else if (dueAt !== null) state = dueAt <= num(now) ? "due" : "scheduled";
    else if (diedAt !== null) state = "dead";
    let groupName = null;
    if (group !== null) {
      const [callbackType, groupId] = text(group).split("\n");
      groupName = `${callbackType}/${groupId}`;
    }
    return {
      taskType: q,
      id: raw,
      state,
      nowMs: num(now),
      dueMs: dueAt,
      running,
      diedMs: diedAt,
      attempts: num(attempts) || 0,
      lastError: error === null ? null : text(error),
      payloadSize: num(size) || 0,
      payload: head,
      group: groupName,
      shard: null,
    };
  }

  /** Pauses type `t` (every shard) on every host, for `lengthMs` or until resumed: when it ends (ms), or null for "until resumed". */
  async pause(t, options = {}) {
    const { lengthMs } = checkOptions(options, ["lengthMs"], "pause");
    const ms = msOf(lengthMs);
    let ends = 0;
    for (const q of this.shardsOf(taskType(t))) ends = num(await this.run("pause", [this.key(q, "paused"), this.key(q, "due")], [ms]));
    return ends || null;
  }

  /** Lets hosts claim a paused type again (every shard); false when it was not paused. */
  async resume(t) {
    let resumed = false;
    for (const q of this.shardsOf(taskType(t))) {
      resumed = (await this.run("resume", [this.key(q, "paused"), this.key(q, "due")], [])) === 1 || resumed;
    }
    return resumed;
  }

  /** Queue sizes and counters of type `t`, summed over its shards. */
  async stats(t) {
    const suffixes = ["due", "leases", "dead", "stats", "payload", "tokens", "attempts", "errors", "seq", "outbox"].concat([
      "events", "recur", "throttle", "paused", "cancels", "claims", "claimed", "groups", "member",
    ]);
    const total = {
      dueNow: 0, scheduledLater: 0, inFlight: 0, dead: 0, succeeded: 0, failed: 0, retried: 0, deadTotal: 0,
      cancelled: 0, oldestDueAgeMs: 0, groupsOpen: 0, groupsCompleted: 0, groupsFailed: 0, fault: null, pausedMs: null,
    };
    for (const q of this.shardsOf(taskType(t))) {
      const r = await this.run("stats", suffixes.map((s) => this.key(q, s)), []);
      const n = r.map((v) => (typeof v === "number" ? v : num(v) || 0));
      total.dueNow += n[0];
      total.scheduledLater += Math.max(0, n[1] - n[0]);
      total.inFlight += n[2];
      total.dead += n[3];
      total.succeeded += n[4];
      total.failed += n[5];
      total.retried += n[6];
      total.deadTotal += n[7];
      if (r[8] !== null && total.fault === null) total.fault = q === t ? text(r[8]) : `shard ${q}: ${text(r[8])}`;
      if (r[9] !== null && total.pausedMs === null) total.pausedMs = num(r[9]);
      total.cancelled += n[10];
      total.oldestDueAgeMs = Math.max(total.oldestDueAgeMs, n[11]);
      total.groupsOpen += n[12];
      total.groupsCompleted += n[13];
      total.groupsFailed += n[14];
    }
    return total;
  }

  groupKeys(callbackType, group) {
    const c = taskType(callbackType);
    const g = textId(group, "group id");
    return { c, g, keys: [this.key(c, `group:${g}`), this.key(c, `group-pending:${g}`)] };
  }

  /**
   * Opens a group whose callback (`callbackType`/`callbackId`, default the group id) is scheduled once
   * the group is sealed and every child has ended. `when`: "all" or "success" (a chain); `replace:
   * false` keeps a callback task with that id that is waiting or dead. Resolves to whether this call
   * created it (opening again with the same callback changes nothing).
   */
  async groupOpen(callbackType, group, options = {}) {
    const known = ["callbackId", "payload", "when", "replace"];
    const { callbackId, payload = "", when = "all", replace = true } = checkOptions(options, known, "groupOpen");
    const { c, g, keys } = this.groupKeys(callbackType, group);
    const cb = textId(callbackId === undefined ? g : callbackId, "callback id", 1 << 20);
    if (when !== "all" && when !== "success") throw new InvalidArgument(`invalid group trigger ${JSON.stringify(when)}: expected "all" or "success"`);
    const r = await this.run(
      "group_join",
      [...keys, this.key(c, "groups"), this.key(c, "stats"), this.key(c, "delivered:-")],
      [g, "0", "1", cb, String(payload), when, replace ? "replace" : "create"],
    );
    return r[0] === 1;
  }

  /**
   * Adds children ({ taskType, id, payload?, dueMs? }) to open group `group` and schedules them (a
   * waiting task with the same id is re-scheduled). Throws GroupClosed when the group is sealed or
   * done, NoSuchGroup when it was never opened. Resolves to { joined, refused: [[type, id], ...] }.
   */
  async groupAdd(callbackType, group, children) {
    const { c, g, keys } = this.groupKeys(callbackType, group);
    const childKeys = ["taskType", "id", "payload", "dueMs"];
    const kids = children.map((k) => ({
      ...checkOptions(k, childKeys, "groupAdd (a child)"),
      taskType: taskType(k.taskType),
      id: textId(k.id, "child id", 1 << 20),
    }));
    const added = { joined: 0, refused: [] };
    for (let start = 0; start < kids.length; start += CHILDREN_PER_CALL) {
      const batch = kids.slice(start, start + CHILDREN_PER_CALL);
      const r = await this.run(
        "group_join",
        [...keys, this.key(c, "groups"), this.key(c, "stats"), this.key(c, "delivered:-")],
        [g, "0", "0", "", "", "", "", ...batch.map((k) => `${k.taskType}\n${k.id}`)],
      );
      added.joined += Math.max(0, r[1]);
      // Each child still pending, with its join number, is scheduled in its own slot.
      const bySlot = new Map();
      batch.forEach((k, i) => {
        const number = r[2 + i];
        if (number === null) return; // added before, and ended since
        const q = this.shardFor(k.taskType, k.id);
        if (!bySlot.has(q)) bySlot.set(q, []);
        bySlot.get(q).push([k, number]);
      });
      for (const [q, steps] of bySlot) {
        const childKeys = ["due", "payload", "member", "dead", "outbox", "seq"].map((s) => this.key(q, s));
        const args = [q];
        for (const [k, number] of steps) {
          const body = payloadOf(k.payload);
          childKeys.push(this.key(q, "delivered:-"));
          args.push(k.id, k.dueMs === undefined ? nowMs() : k.dueMs, body, body.length ? "1" : "0", `${c}\n${g}\n${number}`, "replace", "0");
        }
        const results = await this.run("group_child", childKeys, args);
        results.forEach((result, i) => {
          if (result === 2) added.refused.push([q.split("#")[0], steps[i][0].id]);
        });
      }
    }
    return added;
  }

  /**
   * Seals a group: no more children; it completes once none is pending. Resolves to "sealed",
   * "completed:<fired>" (nothing pending: completed now; fired is callback | skipped | kept) or
   * "already" (sealed or done before).
   */
  async groupSeal(callbackType, group) {
    const { c, g, keys } = this.groupKeys(callbackType, group);
    const all = keys.concat([this.key(c, `group-failed:${g}`), this.key(c, "groups"), this.key(c, "stats")]);
    all.push(this.key(c, "due"), this.key(c, "payload"), this.key(c, "dead"), this.key(c, "delivered:-"));
    const [what, fired] = (await this.run("group_end", all, [g, "0"])).map(text);
    if (what !== "sealed") return "already";
    return fired ? `completed:${fired}` : "sealed";
  }

  /** The group as it is now, or null (never opened, or done more than 7 days ago). */
  async groupShow(callbackType, group) {
    const { c, g, keys } = this.groupKeys(callbackType, group);
    const f = await this.redis.hgetall(keys[0]);
    if (Object.keys(f).length === 0) return null;
    const pending = await this.redis.hlen(keys[1]);
    const n = (name) => num(f[name]) || 0;
    return {
      callbackType: c,
      group: g,
      state: f.state || "",
      callbackId: f.callback_id || "",
      when: f.when || "",
      added: n("added"),
      pending,
      succeeded: n("succeeded"),
      dead: n("dead"),
      cancelled: n("cancelled"),
      openedMs: n("opened_ms"),
      completedMs: f.completed_ms === undefined ? null : num(f.completed_ms),
      fired: f.fired === undefined ? null : f.fired,
    };
  }
}

module.exports = { Hourglass, shardTags, shardOf, taskType, dueMs, nowMs, ...errors };
