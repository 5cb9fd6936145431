// js.chaos: a test-only JavaScript handler whose payload picks a (mis)behaviour, built on both engines
// (js.chaos on QuickJS, js-sm.chaos on StarlingMonkey), so the sandbox is tested against an interpreter the
// way tests/sandbox/ tests it against the Rust `chaos` plugin. The payload is `verb[:arg]`:
//
// - `ok` (or nothing), `error:<text>`, `permanent:<text>`, `retry-after:<ms>`, `throw:<text>` (an Error: a trap);
// - containment: `loop`, `membomb`, `stackoverflow`, `log-flood:<bytes>` (lines of 1 KiB),
//   `followups-big:<n>` (n follow-ups of 1 MiB to `noop`), `schedule:<type>:<id>`;
// - isolation probes: `stash:<secret>` leaves the secret wherever a script can keep state (module
//   variables, a closure, globalThis, the prototypes of Object, Array and String, JSON, Math.random, a
//   big ArrayBuffer), and `peek` fails naming what it finds of any of them; `pollute` swaps built-ins
//   for an attacker's (Object.prototype setters, JSON.parse, Array.prototype.map, TextDecoder) and
//   `peek` sees those too; `hash-seed` fails with a Math.random() draw and crypto values;
// - interpreter attacks: `eval:<code>` runs the code (indirect eval: global scope) and fails with what
//   it returned or threw; `import:<specifier>` tries a dynamic import (files, `std`, `os`, `node:fs`);
// - `log`, `stdout` (console.log), `config:<key>`;
// - `utf8:<bytes>` decodes the bytes after the colon with TextDecoder (fatal, replacing, and keeping a
//   byte order mark) and encodes what it read back with TextEncoder, the same as a string with lone
//   surrogates: each result is a follow-up to `noop` (id `fatal`, `lossy`, `kept`, `surrogates`, and
//   `fatal-error` with the error's name when the fatal decoder threw), which tests/sandbox/javascript.rs
//   compares with Rust's UTF-8, on both engines.
//
// The host's warm-up call (attempt 0, empty payload) runs the command in config `warm-up`, as the Rust
// chaos plugin does, so the warm-up rules are tested on both engines too.

import { log } from "hourglass:plugin/log@0.1.0";
import { schedule } from "hourglass:plugin/schedule@0.1.0";
import { get as config } from "hourglass:plugin/config@0.1.0";

const fail = (val) => ({ tag: "error", val: String(val) });
const permanent = (val) => ({ tag: "permanent", val: String(val) });
// Taken at build time: `pollute` swaps the global one, and the commands after it must still be read.
const Decoder = globalThis.TextDecoder;
const text = (bytes) => new Decoder().decode(bytes);

// Where a stash leaves its secret: module state, a closure, and a big buffer.
let moduleSecret;
const closure = (() => {
  let kept;
  return { set: (v) => (kept = v), get: () => kept };
})();
let buffer;
// What the built-ins were at build time, to tell a polluted one.
const pristine = {
  jsonParse: JSON.parse,
  jsonStringify: JSON.stringify,
  arrayMap: Array.prototype.map,
  random: Math.random,
  textDecoder: globalThis.TextDecoder,
};

function stash(secret) {
  moduleSecret = secret;
  closure.set(secret);
  globalThis.__stash = secret;
  Object.prototype.__stash = secret;
  Array.prototype.__stash = secret;
  String.prototype.__stash = secret;
  JSON.__stash = secret;
  const bytes = new TextEncoder().encode(`SECRET-OF-TASK-${secret}`);
  buffer = new Uint8Array(8 << 20);
  for (let at = 0; at + bytes.length <= buffer.length; at += 4096) buffer.set(bytes, at);
}

function pollute() {
  Object.defineProperty(Object.prototype, "isAdmin", { value: true, writable: true, configurable: true });
  JSON.parse = () => ({ pwned: true });
  JSON.stringify = () => '"pwned"';
  Array.prototype.map = function () {
    return ["pwned"];
  };
  Math.random = () => 0.5;
  globalThis.TextDecoder = class {
    decode() {
      return "pwned";
    }
  };
}

// What a peek finds of an earlier task's stash or pollution.
function remnants() {
  const found = [];
  if (moduleSecret !== undefined) found.push(`module variable ${moduleSecret}`);
  if (closure.get() !== undefined) found.push(`closure ${closure.get()}`);
  if ("__stash" in globalThis) found.push(`globalThis.__stash ${globalThis.__stash}`);
  if ({}.__stash !== undefined) found.push(`Object.prototype ${{}.__stash}`);
  if ([].__stash !== undefined) found.push(`Array.prototype ${[].__stash}`);
  if ("".__stash !== undefined) found.push(`String.prototype ${"".__stash}`);
  if (JSON.__stash !== undefined) found.push(`JSON ${JSON.__stash}`);
  if (buffer !== undefined) found.push(`a buffer of ${buffer.length} bytes`);
  if ({}.isAdmin !== undefined) found.push("Object.prototype.isAdmin");
  if (JSON.parse !== pristine.jsonParse || JSON.stringify !== pristine.jsonStringify) found.push("JSON swapped");
  if (Array.prototype.map !== pristine.arrayMap) found.push("Array.prototype.map swapped");
  if (Math.random !== pristine.random) found.push("Math.random swapped");
  if (globalThis.TextDecoder !== pristine.textDecoder) found.push("TextDecoder swapped");
  return found;
}

function recurse(depth) {
  // Not a tail call: each frame stays.
  return recurse(depth + 1) + depth;
}

export function handle(task) {
  const warmUp = task.attempt === 0 ? config("warm-up") : undefined;
  const command = warmUp ?? text(task.payload);
  const colon = command.indexOf(":");
  const verb = colon < 0 ? command : command.slice(0, colon);
  const arg = colon < 0 ? "" : command.slice(colon + 1);
  switch (verb) {
    case "":
    case "ok":
      return;
    case "error":
      throw fail(arg);
    case "permanent":
      throw permanent(arg);
    case "retry-after":
      // A plain number: both engines take one for a u64 (StarlingMonkey also takes a BigInt).
      throw { tag: "retry-after", val: Number(arg) };
    case "throw":
      throw new Error(arg);
    case "loop": {
      let n = 0;
      for (;;) n = (n + 1) | 0;
    }
    case "membomb": {
      const hoard = [];
      for (;;) hoard.push(new Uint8Array(1 << 20).fill(1));
    }
    case "stackoverflow":
      return recurse(1);
    case "log":
      log("info", "chaos log at info");
      return;
    case "stdout":
      console.log("hello from stdout");
      return;
    case "log-flood": {
      const line = "L".repeat(1023);
      for (let i = 0; i < Number(arg) / 1024; i++) log("info", line);
      return;
    }
    case "followups-big": {
      const body = new Uint8Array(1 << 20).fill(7);
      for (let i = 0; i < Number(arg); i++) {
        schedule("noop", new TextEncoder().encode(`big-${i}`), body, task.dueMs);
      }
      return;
    }
    case "schedule": {
      const [type, id] = arg.split(":");
      schedule(type, new TextEncoder().encode(id), new Uint8Array(0), task.dueMs);
      return;
    }
    case "config":
      throw fail(`config ${arg}=${JSON.stringify(config(arg) ?? null)}`);
    case "utf8": {
      const bytes = task.payload.subarray("utf8:".length);
      const out = (id, payload) => schedule("noop", new TextEncoder().encode(id), payload, task.dueMs);
      try {
        out("fatal", new TextEncoder().encode(new Decoder("utf-8", { fatal: true }).decode(bytes)));
      } catch (e) {
        out("fatal-error", new TextEncoder().encode(e.name));
      }
      out("lossy", new TextEncoder().encode(new Decoder().decode(bytes)));
      out("kept", new TextEncoder().encode(new Decoder("utf-8", { ignoreBOM: true }).decode(bytes)));
      out("surrogates", new TextEncoder().encode("a\ud800b\udc00c\ud83d\ude00\ud83d"));
      return;
    }
    case "stash":
      stash(arg);
      return;
    case "pollute":
      pollute();
      return;
    case "peek": {
      const found = remnants();
      if (found.length > 0) throw permanent(`REMNANT ${found.join("; ")}`);
      return;
    }
    case "hash-seed": {
      const values = crypto.getRandomValues(new Uint32Array(2));
      throw fail(`hash-seed ${Math.random()} ${values[0]} ${values[1]}`);
    }
    case "eval": {
      let result;
      try {
        result = `returned ${String((0, eval)(arg))}`;
      } catch (e) {
        result = `threw ${e}`;
      }
      throw fail(`eval ${result}`);
    }
    case "import": {
      // A dynamic import settles in a job after this call returns: the script
      // runs none then, so what it reports is whether the import could even start.
      let started;
      try {
        const p = import(arg);
        p.then(
          (m) => log("error", `import ${arg} resolved: ${Object.keys(m)}`),
          () => {},
        );
        started = "started";
      } catch (e) {
        started = `threw ${e}`;
      }
      throw fail(`import ${started}`);
    }
    default:
      throw permanent(`unknown chaos command ${JSON.stringify(verb)}`);
  }
}
