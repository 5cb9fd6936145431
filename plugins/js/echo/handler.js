// js.echo: an Hourglass task handler in JavaScript (built with componentize-js).
//
// - Echoes every task it acknowledges: schedules a follow-up of type
//   `<task type>.out` (or the type named by `config = { reply_to = "..." }`)
//   with the same id and the same payload bytes, due when this task was due.
//   Binary and non-UTF-8 payloads and ids come through untouched.
// - A JSON payload `{"fail_times": N}` fails its first N attempts (retried by
//   the type's backoff policy), like the Rust `flaky` example.
// - A JSON payload `{"permanent": "reason"}` dead-letters the task at once.
// - A JSON payload `{"crash": "message"}` throws an Error: the attempt fails
//   like a trap, with the message in the host's log.
// - A JSON payload `{"remember": "text"}` keeps the text in a module variable;
//   `{"recall": true}` dead-letters the task, naming the text, if an earlier
//   task left one there, and echoes as usual otherwise. With the default
//   `instance_reuse = 0` every task starts in a fresh instance, so a recall
//   never finds anything (tests/sandbox/polyglot.rs checks it, and that it
//   does under reuse).
// - A JSON payload `{"progress": N}` reports N % done (detail `{"echo": N}`)
//   before anything else, so `hourglass show` has it while the task lives
//   (with `fail_times`, it is kept across the retries).
// - A JSON payload `{"fanout": {"callback": C, "group": G, "type": T, "ids": [...]}}`
//   also opens workflow group G with callback task G of type C, adds one child
//   of type T per id (payload `{}`, due now) and seals it.
// - A JSON payload `{"graph": {"home": C, "id": G, "nodes": [...]}}` also
//   declares workflow graph G of home type C (the nodes as a graph file has
//   them), committed with this run's success.
//
// Build: `bash plugins/build-polyglot.sh` (installs to plugins/js.echo.wasm).
//
// WIT → JS: the world's imports are ES modules named after their interface;
// list<u8> is a Uint8Array, u64 a BigInt, option<string> a string or
// undefined. `handle` returns normally for `ok`; throwing a `failure` value
// ({ tag: "error" | "permanent" | "retry-after", val }) returns it as `err`.
// Any other exception traps, which the host also counts as a failed attempt.

import { log } from "hourglass:plugin/log@0.1.0";
import { schedule } from "hourglass:plugin/schedule@0.1.0";
import { get as config } from "hourglass:plugin/config@0.1.0";
import { open, add, seal, graph } from "hourglass:plugin/workflow@0.1.0";
import { report } from "hourglass:plugin/progress@0.1.0";

// The payload as a JSON object, or {} when it is anything else (binary, text, ...).
function controls(payload) {
  // Nothing to parse: a thrown SyntaxError would cost more than the rest of the task.
  if (payload.length === 0) return {};
  try {
    const value = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(payload));
    return value !== null && typeof value === "object" && !Array.isArray(value) ? value : {};
  } catch {
    return {};
  }
}

// Opens the group, adds its children and seals it: committed with this run's success.
function fanOut(f, dueMs) {
  const callback = String(f.callback ?? "");
  const group = String(f.group ?? "");
  try {
    open(callback, group, group, "", "all-ended");
    for (const id of Array.isArray(f.ids) ? f.ids : []) {
      add(callback, group, String(f.type ?? ""), String(id), new TextEncoder().encode("{}"), dueMs);
    }
    seal(callback, group);
  } catch (e) {
    // Not granted, a bad group id, a sealed group: retrying would not help.
    throw { tag: "permanent", val: `cannot fan out: ${e?.payload ?? e}` };
  }
}

// What a task asked to remember: module state, which a fresh instance starts without.
let remembered;

export function handle(task) {
  const c = controls(task.payload);

  if (Number.isInteger(c.progress)) {
    try {
      report(c.progress, JSON.stringify({ echo: c.progress }));
    } catch (e) {
      throw { tag: "permanent", val: `cannot report progress: ${e?.payload ?? e}` };
    }
  }

  if (c.recall === true && remembered !== undefined) {
    throw { tag: "permanent", val: `recalled ${JSON.stringify(remembered)} from an earlier task` };
  }
  if ("remember" in c) {
    remembered = String(c.remember);
  }

  if ("crash" in c) {
    throw new Error(String(c.crash));
  }

  if ("permanent" in c) {
    throw { tag: "permanent", val: String(c.permanent) };
  }

  const failTimes = Number.isInteger(c.fail_times) ? c.fail_times : 0;
  if (task.attempt <= failTimes) {
    throw {
      tag: "error",
      val: `failing on purpose (attempt ${task.attempt} of ${failTimes} planned failures)`,
    };
  }

  if (c.fanout !== null && typeof c.fanout === "object") {
    fanOut(c.fanout, task.dueMs);
  }
  if (c.graph !== null && typeof c.graph === "object") {
    try {
      graph(String(c.graph.home ?? ""), String(c.graph.id ?? ""), JSON.stringify({ nodes: c.graph.nodes ?? [] }));
    } catch (e) {
      // A cycle, an unknown parent, a type not granted: retrying would not help.
      throw { tag: "permanent", val: `cannot declare the graph: ${e?.payload ?? e}` };
    }
  }

  const replyTo = config("reply_to") ?? `${task.taskType}.out`;
  log("info", `echoing ${task.payload.length} bytes to ${replyTo} on attempt ${task.attempt}`);
  try {
    schedule(replyTo, task.id, task.payload, task.dueMs);
  } catch (e) {
    // The host refused the follow-up (bad type name, too large, ...): never retry.
    throw { tag: "permanent", val: `cannot schedule the echo: ${e?.payload ?? e}` };
  }
}
