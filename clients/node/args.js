// Every argument is checked here before anything is sent: a value the client cannot write faithfully
// is refused with a one-line error that names it, never turned into something else.
"use strict";

const { InvalidTaskType, InvalidId, InvalidArgument } = require("./errors");

const TYPE = /^[a-z0-9][a-z0-9._-]{0,63}$/;
const MODES = ["upsert", "if-absent", "only-later", "only-earlier"];

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
    if (json !== undefined) return `${json} (${v === null ? "null" : v instanceof Date ? "Date" : typeof v})`;
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
  if (options === null || typeof options !== "object" || Array.isArray(options)) {
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

function textId(id, what, most) {
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
  const lost = unfaithful(p, "payload", new Set());
  if (lost) throw new InvalidArgument(`${lost}: JSON would not keep it; pass plain data, a string or a Buffer`);
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

/**
 * Where `v` holds what `JSON.stringify` would drop or flatten without an error (a Map or a Set
 * becomes `{}`, `undefined` and functions vanish or become null, NaN becomes null, a class
 * instance loses its class), as `<path> is <what>`; null when JSON keeps all of it. A value with
 * its own `toJSON` (a Date) chose its JSON form and is kept as that. Cycles and BigInts are left
 * to `JSON.stringify`, which throws on them.
 */
function unfaithful(v, path, seen) {
  switch (typeof v) {
    case "string":
    case "boolean":
    case "bigint":
      return null;
    case "number":
      return Number.isFinite(v) ? null : `${path} is ${v}`;
    case "undefined":
      return `${path} is undefined`;
    case "function":
      return `${path} is a function`;
    case "symbol":
      return `${path} is a symbol`;
  }
  if (v === null || typeof v.toJSON === "function" || seen.has(v)) return null;
  seen.add(v);
  try {
    if (Array.isArray(v)) {
      for (let i = 0; i < v.length; i++) {
        const lost = unfaithful(v[i], `${path}[${i}]`, seen);
        if (lost) return lost;
      }
      return null;
    }
    const proto = Object.getPrototypeOf(v);
    if (proto !== Object.prototype && proto !== null) {
      const name = (v.constructor && v.constructor.name) || "object";
      return `${path} is ${/^[AEIOU]/i.test(name) ? "an" : "a"} ${name}`;
    }
    if (Object.getOwnPropertySymbols(v).length > 0) return `${path} has symbol keys`;
    for (const key of Object.keys(v)) {
      const lost = unfaithful(v[key], `${path}.${key}`, seen);
      if (lost) return lost;
    }
    return null;
  } finally {
    seen.delete(v);
  }
}

/** This machine's clock in ms since the epoch. */
function nowMs() {
  return Date.now();
}

const absent = (v) => v === undefined || v === null;

/** A number of milliseconds >= 0 (a fraction is cut off); anything else is refused, naming `what`. */
function msOf(v, what) {
  if (typeof v !== "number" || !Number.isFinite(v) || v < 0) {
    throw new InvalidArgument(`${what} must be a number of milliseconds >= 0 (got ${describe(v)})`);
  }
  return Math.floor(v);
}

/**
 * A due time from `at` (a Date), `atMs` (ms since the epoch) or `delayMs` (from `now`), at most
 * one of them; none: `now`.
 */
function dueMs(options = {}, now = nowMs()) {
  const { at, atMs, delayMs } = options;
  const given = ["at", "atMs", "delayMs"].filter((name) => !absent(options[name]));
  if (given.length > 1) throw new InvalidArgument(`give one due time, not both ${given.join(" and ")}`);
  if (!absent(at)) {
    if (!(at instanceof Date)) {
      throw new InvalidArgument(`at takes a Date (got ${describe(at)}); give a number of milliseconds since the epoch as atMs`);
    }
    const ms = at.getTime();
    if (!Number.isFinite(ms) || ms < 0) throw new InvalidArgument(`at is an invalid Date or before 1970 (${at})`);
    return ms;
  }
  if (!absent(atMs)) return msOf(atMs, "atMs");
  return now + (absent(delayMs) ? 0 : msOf(delayMs, "delayMs"));
}

function modeOf(mode = "upsert") {
  if (!MODES.includes(mode)) throw new InvalidArgument(`invalid mode ${JSON.stringify(mode)}: expected one of ${MODES.join(", ")}`);
  return mode;
}

module.exports = { taskType, describe, rawId, checkOptions, textId, payloadOf, nowMs, msOf, dueMs, modeOf, absent };
