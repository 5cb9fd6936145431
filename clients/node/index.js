// Hourglass from Node: schedule, postpone, cancel and inspect delayed tasks, pause types and build
// workflow groups and graphs; each call is one of the host's own Lua scripts (scripts/, copied from the host).
"use strict";

const fs = require("fs");
const path = require("path");
const errors = require("./errors");
const checks = require("./args");
const { shardTags, shardOf } = require("./shards");
const { scheduleMany } = require("./bulk");
const { waitUntilFinished } = require("./wait");
const graphs = require("./graphs");

const { InvalidArgument, ReplicationTimeout, fromReply } = errors;
/** How long `replicas: N` waits for the replicas by default (ms). */
const REPLICAS_TIMEOUT_MS = 1000;
const { taskType, describe, rawId, checkOptions, textId, payloadOf, nowMs, msOf, dueMs, modeOf } = checks;

const GROUP_ID_MAX = 200;
// Children per script call, as the host sends them (its CHILDREN_PER_CALL).
const CHILDREN_PER_CALL = 128;
const SCRIPTS = ["schedule", "schedule_batch", "reschedule", "cancel", "show", "pause", "resume", "stats"].concat([
  "group_join",
  "group_child",
  "group_end",
  "graph_open",
  "graph_cancel",
]);

function load(name) {
  return fs.readFileSync(path.join(__dirname, "scripts", `${name}.lua`), "utf8");
}

const text = (v) => (Buffer.isBuffer(v) ? v.toString("utf8") : v === null || v === undefined ? v : String(v));
const num = (v) => (v === null || v === undefined ? null : Math.trunc(Number(text(v))));

/**
 * Schedules and inspects Hourglass tasks through the host's own scripts.
 *
 * `redis` is an ioredis `Redis` or `Cluster`; `prefix` is the hosts' `[redis] prefix`; `shards` maps
 * each sharded type to its `[types.T] shards` (the same N the hosts run with).
 */
// A stored progress report ({"percent","detail","attempt","at_ms"}) as { percent, detail, attempt, atMs };
// null when absent or not such a value (a hand-written one is not shown as progress).
function progressOf(stored) {
  if (stored === null || stored === undefined) return null;
  try {
    const v = JSON.parse(text(stored));
    if (!Number.isInteger(v.percent) || !Number.isInteger(v.attempt)) return null;
    return { percent: v.percent, detail: v.detail ?? null, attempt: v.attempt, atMs: Number(v.at_ms) };
  } catch {
    return null;
  }
}

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
    // The host's rule for its [redis] prefix (KeyPrefix): braces would break the hash tag.
    if (typeof prefix !== "string" || prefix.length === 0 || prefix.length > 64 || /[\s{}*?[\]\\]/.test(prefix)) {
      throw new InvalidArgument(`invalid prefix ${describe(prefix)}: 1 to 64 characters, no whitespace, braces or * ? [ ] \\`);
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
   * Schedules task `id` of type `t` at `at` (a Date), at `atMs` (ms since the epoch) or after
   * `delayMs` (default: now). `mode`: "upsert" (the last schedule wins), "if-absent" (dedupe),
   * "only-later" (debounce) or "only-earlier"; the payload is written only with the due time.
   * `traceparent` (W3C) makes the run's span continue the caller's trace. Resolves to whether the
   * due time was written. `replicas: N`: a durable schedule, that survives the master's loss: Redis
   * WAIT N follows the write (`replicasTimeoutMs`, default 1000), and ReplicationTimeout says when
   * fewer replicas acknowledged it in time.
   */
  async schedule(t, id, options = {}) {
    const known = ["at", "atMs", "delayMs", "payload", "mode", "traceparent", "replicas", "replicasTimeoutMs"];
    const { payload, mode: wanted, traceparent, replicas, replicasTimeoutMs } = checkOptions(options, known, "schedule");
    const wait = this.waitArgs(replicas, replicasTimeoutMs);
    const mode = modeOf(wanted);
    const raw = rawId(id);
    const body = payloadOf(payload);
    const due = dueMs(options);
    if (traceparent !== undefined && typeof traceparent !== "string") {
      throw new InvalidArgument(`traceparent must be a string (got ${describe(traceparent)})`);
    }
    const q = this.shardFor(t, raw);
    if (traceparent !== undefined && mode === "upsert") await this.redis.hset(this.key(q, "trace"), raw, traceparent);
    const written = await this.run("schedule", [this.key(q, "due"), this.key(q, "payload")], [raw, due, body, body.length ? "1" : "0", mode]);
    if (traceparent !== undefined && mode !== "upsert" && written === 1) {
      await this.redis.hset(this.key(q, "trace"), raw, traceparent);
    }
    await this.replicated(wait, "");
    return written === 1;
  }

  /**
   * The [replicas, timeoutMs] of WAIT that `replicas: N` asks for (null without it). Refused on a
   * Cluster client, whose WAIT may reach another node than the task's slot's master.
   */
  waitArgs(replicas, timeoutMs) {
    if (replicas === undefined || replicas === null) {
      if (timeoutMs !== undefined && timeoutMs !== null) throw new InvalidArgument("replicasTimeoutMs needs replicas");
      return null;
    }
    if (!Number.isInteger(replicas) || replicas < 1 || replicas > 64) {
      throw new InvalidArgument(`replicas must be 1 to 64 (got ${describe(replicas)})`);
    }
    const ms = timeoutMs === undefined || timeoutMs === null ? REPLICAS_TIMEOUT_MS : timeoutMs;
    if (!Number.isInteger(ms) || ms < 1) throw new InvalidArgument(`replicasTimeoutMs must be a positive number of ms (got ${describe(ms)})`);
    if (this.redis.isCluster) {
      throw new InvalidArgument("replicas is not supported on a Redis Cluster client: send WAIT on a connection to the task's slot's master");
    }
    return [replicas, ms];
  }

  /**
   * WAIT for `wait` ([replicas, ms]) after this client's writes: one ioredis connection carries
   * them all in order, so WAIT counts them. Throws ReplicationTimeout when fewer replicas acknowledged.
   */
  async replicated(wait, what) {
    if (wait === null) return;
    const [wanted, ms] = wait;
    const acked = Number(await this.redis.wait(wanted, ms));
    if (acked < wanted) {
      throw new ReplicationTimeout(
        `${what}written on the master, but ${acked} of ${wanted} replicas acknowledged it within ${ms} ms (WAIT): it may be lost if the master fails now`,
        { acked, wanted },
      );
    }
  }

  /**
   * Schedules many tasks ({ taskType, id, payload?, at? | atMs? | delayMs?, mode? }) in batches of
   * 1000, each to its shard and written as schedule would: one schedule_batch script call per shard
   * (type) and 200 tasks, atomic; every task is checked before anything is sent. Resolves to whether
   * each due time was written, in the order given. No traceparent here: use schedule for that.
   * Options: `replicas` and `replicasTimeoutMs`, as for schedule (one WAIT after every batch was sent).
   */
  async scheduleMany(tasks, options = {}) {
    const { replicas, replicasTimeoutMs } = checkOptions(options, ["replicas", "replicasTimeoutMs"], "scheduleMany");
    const wait = this.waitArgs(replicas, replicasTimeoutMs);
    const written = await scheduleMany(this, tasks);
    await this.replicated(wait, `scheduleMany: all ${written.length} tasks were sent and `);
    return written;
  }

  /**
   * How task `id` of type `t` ended (the type's events stream, `events = true`): resolves to
   * { outcome: "succeeded" | "dead" | "cancelled", attempt, error, finishedMs } once it ends, or
   * at once when it has ended (cancelled by a client while it waited: finishedMs null). Throws
   * NoEvents, UnknownTask, or WaitTimeout after `timeoutMs` (default: wait for ever). A group's
   * callback is a task too: wait for (callbackType, callbackId), also before its group completes.
   */
  async waitUntilFinished(t, id, options = {}) {
    return waitUntilFinished(this, t, id, options);
  }

  /** Moves a scheduled task `delayMs` later than the later of its due time and now: its new due time (ms), or null when it is not scheduled. */
  async postpone(t, id, delayMs) {
    return this.reschedule(t, id, ["postpone", msOf(delayMs, "delayMs")]);
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
      const keys = ["due", "payload", "tokens", "claimed", "cancels", "member", "outbox", "seq", "held", "progress"].map((s) => this.key(q, s));
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
    const suffixes = ["due", "leases", "tokens", "attempts", "errors", "dead", "payload", "claims", "claimed", "member", "held", "progress"];
    const r = await this.run("show", suffixes.map((s) => this.key(q, s)), [raw, Math.max(0, Math.floor(most))], true);
    const [now, due, leaseUntil, entry, attempts, error, died, size, head, group, reported] = r;
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
    let graphName = null;
    if (group !== null) {
      // A graph's node is marked "\x1f<home>\n<graph>\n<node>", a group's child "<callback type>\n<group>\n<n>".
      const [home, id] = text(group).split("\n");
      if (home.startsWith("\x1f")) graphName = `${home.slice(1)}/${id}`;
      else groupName = `${home}/${id}`;
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
      graph: graphName,
      shard: null,
      progress: progressOf(reported),
    };
  }

  /** Pauses type `t` (every shard) on every host, for `lengthMs` or until resumed: when it ends (ms), or null for "until resumed". */
  async pause(t, options = {}) {
    const { lengthMs } = checkOptions(options, ["lengthMs"], "pause");
    const ms = lengthMs === undefined || lengthMs === null ? 0 : msOf(lengthMs, "lengthMs");
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
      "events", "recur", "throttle", "paused", "cancels", "claims", "claimed", "groups", "member", "graphs",
    ]);
    const total = {
      dueNow: 0, scheduledLater: 0, inFlight: 0, dead: 0, succeeded: 0, failed: 0, retried: 0, deadTotal: 0,
      cancelled: 0, oldestDueAgeMs: 0, groupsOpen: 0, groupsCompleted: 0, groupsFailed: 0,
      graphsRunning: 0, graphsOpened: 0, graphsCompleted: 0, graphsFailed: 0, fault: null, pausedMs: null,
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
      total.graphsRunning += n[15];
      total.graphsOpened += n[16];
      total.graphsCompleted += n[17];
      total.graphsFailed += n[18];
    }
    return total;
  }

  groupKeys(callbackType, group) {
    const c = taskType(callbackType);
    const g = textId(group, "group id", GROUP_ID_MAX);
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
    // The callback's payload goes into the group's summary JSON, as text.
    if (Buffer.isBuffer(payload) || payload instanceof Uint8Array) {
      throw new InvalidArgument("the callback payload of groupOpen is text (it goes into the summary JSON): give a string or a JSON-able value");
    }
    const cbPayload = typeof payload === "string" ? payload : payloadOf(payload).toString();
    const cb = textId(callbackId === undefined ? g : callbackId, "callback id", 1 << 20);
    if (when !== "all" && when !== "success") throw new InvalidArgument(`invalid group trigger ${JSON.stringify(when)}: expected "all" or "success"`);
    const r = await this.run(
      "group_join",
      [...keys, this.key(c, "groups"), this.key(c, "stats"), this.key(c, "delivered:-")],
      [g, "0", "1", cb, cbPayload, when, replace ? "replace" : "create"],
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
      dueMs: k.dueMs === undefined || k.dueMs === null ? undefined : msOf(k.dueMs, "dueMs of a child"),
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
   * Seals a group: no more children; it completes once none is pending. Resolves to
   * { state: "sealed", fired: null }, { state: "completed", fired: "callback" | "skipped" | "kept" }
   * (nothing was pending: it completed now) or { state: "already", fired: null } (sealed or done before).
   */
  async groupSeal(callbackType, group) {
    const { c, g, keys } = this.groupKeys(callbackType, group);
    const all = keys.concat([this.key(c, `group-failed:${g}`), this.key(c, "groups"), this.key(c, "stats")]);
    all.push(this.key(c, "due"), this.key(c, "payload"), this.key(c, "dead"), this.key(c, "delivered:-"));
    const [what, fired] = (await this.run("group_end", all, [g, "0"])).map(text);
    if (what !== "sealed") return { state: "already", fired: null };
    return fired ? { state: "completed", fired } : { state: "sealed", fired: null };
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

  /**
   * Declares workflow graph `graph` in `homeType` (a host must serve it) and schedules its roots: each
   * node ({ name, taskType, id?, payload?, when?, parents? }) runs once its parents have ended as its
   * `when` says ("all", default, or "success": else it is skipped). Refused whole, nothing written
   * (GraphRefused, naming the culprit), for a cycle, an unknown parent, a name or task used twice, a
   * task already waiting, dead or another workflow's, or a graph id used before. Resolves to
   * { nodes, edges, roots }.
   */
  async graphSubmit(homeType, graph, nodes) {
    return graphs.graphSubmit(this, homeType, graph, nodes);
  }

  /** The graph as it is now (each node's state, parents and skip reason), or null (never declared, or done more than 7 days ago). */
  async graphShow(homeType, graph) {
    return graphs.graphShow(this, homeType, graph);
  }

  /**
   * Cancels a graph: every node still waiting is skipped at once ("graph cancelled"), and each node
   * scheduled is cancelled as cancel() does (removed, or stopped by its host); the graph is done once
   * those ends come back. Resolves to { wasDone, skipped, removed, stopping, ended }, or null when
   * there is no such graph.
   */
  async graphCancel(homeType, graph) {
    return graphs.graphCancel(this, homeType, graph);
  }
}

const { version } = require("./package.json");

module.exports = { Hourglass, shardTags, shardOf, taskType, dueMs, nowMs, version, ...errors };
