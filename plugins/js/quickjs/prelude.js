// The QuickJS build's prelude: the Web APIs a handler on StarlingMonkey has and QuickJS-ng lacks, and a
// Math.random that is not the same in every task.
//
// plugins/build-polyglot.sh puts this module first in every QuickJS build (entry.js imports it before the
// handler), so the handler's own top-level code already sees these globals. Each is written against the
// standard (WHATWG Encoding, the console's methods, WebCrypto's getRandomValues) for the parts a handler
// uses; what is missing throws a clear error rather than doing something else.
//
// - TextEncoder / TextDecoder: UTF-8 only (what StarlingMonkey's support too), `fatal` and `ignoreBOM`.
// - console.log/info/debug/warn/error/trace: the host's log at the matching level (no console otherwise).
// - crypto.getRandomValues / crypto.randomUUID: wasi:random, fresh bytes from the host.
// - Math.random: the engine's generator is seeded when the build's snapshot is taken, so every fresh
//   instance would draw the same numbers; this one is seeded from wasi:random at its first use in each
//   task (entry.js marks each task's start).
// - fetch: not available (componentize-qjs 0.4.3 cannot build a component that imports wasi:http; the
//   StarlingMonkey build leaves that engine's own wasi:http out too); calling it throws an Error that says so.

import { log } from "hourglass:plugin/log@0.1.0";
import { getRandomBytes } from "wasi:random/random@0.2.12";

const REPLACEMENT = 0xfffd;

// The engine's own native functions, taken when the snapshot is made: a handler that replaces the globals
// changes its own task only, and the codec below keeps working in it.
const apply = Reflect.apply;
const fromCharCode = String.fromCharCode;
const toBase64 = Uint8Array.prototype.toBase64;
const fromBase64 = Uint8Array.fromBase64;
const atob = globalThis.atob;
const btoa = globalThis.btoa;
const escapeLatin1 = globalThis.escape;
const unescapeLatin1 = globalThis.unescape;
const decodeUri = decodeURIComponent;
const encodeUri = encodeURIComponent;
const min = Math.min;
// For the encoder's strings; bytes are checked with isAscii (QuickJS's regular expressions take about 35 ns
// a character).
const NON_ASCII = /[^\x00-\x7f]/;
// Most arguments one String.fromCharCode call is given (QuickJS caps a call's arguments at 65,535).
const CHUNK = 8192;

// Bytes as a string of one character per byte (code units 0-255), and back: both natively, through base64.
const latin1 = (bytes) => atob(apply(toBase64, bytes, []));
const bytesOf = (binary) => fromBase64(btoa(binary));

// Whether every byte is below 0x80: the least of them read as signed bytes, found natively (about 15 ns a
// byte, half a regular expression's cost).
function isAscii(bytes) {
  const signed = new Int8Array(bytes.buffer, bytes.byteOffset, bytes.length);
  for (let at = 0; at < signed.length; at += CHUNK) if (apply(min, null, signed.subarray(at, at + CHUNK)) < 0) return false;
  return true;
}

// Code units (numbers) to a string, natively, CHUNK at a time.
function fromUnits(units) {
  let s = "";
  for (let at = 0; at < units.length; at += CHUNK) s += apply(fromCharCode, null, units.slice(at, at + CHUNK));
  return s;
}

// The WHATWG Encoding standard's UTF-8 decoder, byte by byte: an invalid sequence (its maximal subpart) is
// one U+FFFD, or a TypeError when `fatal`. Only input that is not valid UTF-8 comes here.
function decodeBytewise(bytes, from, fatal) {
  const units = [];
  const bad = () => {
    if (fatal) throw new TypeError("TextDecoder: the input is not valid UTF-8");
    units.push(REPLACEMENT);
  };
  let cp = 0;
  let needed = 0;
  let seen = 0;
  let lower = 0x80;
  let upper = 0xbf;
  for (let i = from; i < bytes.length; i++) {
    const byte = bytes[i];
    if (needed === 0) {
      if (byte < 0x80) units.push(byte);
      else if (byte >= 0xc2 && byte <= 0xdf) {
        needed = 1;
        cp = byte & 0x1f;
      } else if (byte >= 0xe0 && byte <= 0xef) {
        // No overlong forms, no surrogates.
        if (byte === 0xe0) lower = 0xa0;
        if (byte === 0xed) upper = 0x9f;
        needed = 2;
        cp = byte & 0x0f;
      } else if (byte >= 0xf0 && byte <= 0xf4) {
        // No overlong forms, nothing past U+10FFFF.
        if (byte === 0xf0) lower = 0x90;
        if (byte === 0xf4) upper = 0x8f;
        needed = 3;
        cp = byte & 0x07;
      } else bad();
      continue;
    }
    if (byte < lower || byte > upper) {
      // The sequence ends before this byte, which starts afresh.
      cp = needed = seen = 0;
      lower = 0x80;
      upper = 0xbf;
      bad();
      i--;
      continue;
    }
    lower = 0x80;
    upper = 0xbf;
    cp = (cp << 6) | (byte & 0x3f);
    if (++seen !== needed) continue;
    if (cp > 0xffff) units.push(0xd800 + ((cp - 0x10000) >> 10), 0xdc00 + ((cp - 0x10000) & 0x3ff));
    else units.push(cp);
    cp = needed = seen = 0;
  }
  if (needed !== 0) bad();
  return fromUnits(units);
}

// UTF-8 of a string with lone surrogates, which WHATWG encodes as U+FFFD.
function encodeBytewise(s) {
  const out = [];
  for (let i = 0; i < s.length; i++) {
    let c = s.charCodeAt(i);
    if (c >= 0xd800 && c <= 0xdbff && i + 1 < s.length) {
      const d = s.charCodeAt(i + 1);
      if (d >= 0xdc00 && d <= 0xdfff) {
        c = 0x10000 + ((c - 0xd800) << 10) + (d - 0xdc00);
        i++;
      }
    }
    if (c >= 0xd800 && c <= 0xdfff) c = REPLACEMENT;
    if (c < 0x80) out.push(c);
    else if (c < 0x800) out.push(0xc0 | (c >> 6), 0x80 | (c & 0x3f));
    else if (c < 0x10000) out.push(0xe0 | (c >> 12), 0x80 | ((c >> 6) & 0x3f), 0x80 | (c & 0x3f));
    else out.push(0xf0 | (c >> 18), 0x80 | ((c >> 12) & 0x3f), 0x80 | ((c >> 6) & 0x3f), 0x80 | (c & 0x3f));
  }
  return new Uint8Array(out);
}

// Both are UTF-8 only, as StarlingMonkey's are. The common cases run in the engine's native code (a loop in
// JavaScript costs about 0.2 µs a byte here): ASCII as it is, other valid UTF-8 through escape +
// decodeURIComponent (which refuses every invalid sequence: then the bytewise decoder runs), and a string
// without lone surrogates through encodeURIComponent + unescape.
class TextEncoder {
  get encoding() {
    return "utf-8";
  }

  encode(input = "") {
    const s = String(input);
    let binary = s;
    if (NON_ASCII.test(s)) {
      try {
        binary = unescapeLatin1(encodeUri(s));
      } catch {
        return encodeBytewise(s);
      }
    }
    return bytesOf(binary);
  }

  encodeInto(input, dest) {
    const bytes = this.encode(input);
    const n = Math.min(bytes.length, dest.length);
    dest.set(bytes.subarray(0, n));
    return { read: String(input).length, written: n };
  }
}

class TextDecoder {
  constructor(label = "utf-8", options = {}) {
    const name = String(label).trim().toLowerCase();
    if (name !== "utf-8" && name !== "utf8" && name !== "unicode-1-1-utf-8") {
      throw new RangeError(`TextDecoder: the encoding ${JSON.stringify(label)} is not supported on QuickJS (UTF-8 only)`);
    }
    this.fatal = Boolean(options.fatal);
    this.ignoreBOM = Boolean(options.ignoreBOM);
  }

  get encoding() {
    return "utf-8";
  }

  decode(input = new Uint8Array(0)) {
    const b =
      input instanceof Uint8Array
        ? input
        : ArrayBuffer.isView(input)
          ? new Uint8Array(input.buffer, input.byteOffset, input.byteLength)
          : new Uint8Array(input);
    const from = !this.ignoreBOM && b[0] === 0xef && b[1] === 0xbb && b[2] === 0xbf ? 3 : 0;
    const body = from === 0 ? b : b.subarray(from);
    if (isAscii(body)) return latin1(body);
    try {
      return decodeUri(escapeLatin1(latin1(body)));
    } catch {
      return decodeBytewise(b, from, this.fatal);
    }
  }
}

// The console StarlingMonkey has writes to stdout, which the host logs; here it goes to the log directly.
const text = (args) =>
  args
    .map((a) => {
      if (typeof a === "string") return a;
      if (a instanceof Error) return a.stack ? `${a}\n${a.stack}` : String(a);
      try {
        return typeof a === "object" && a !== null ? JSON.stringify(a) : String(a);
      } catch {
        return String(a);
      }
    })
    .join(" ");
const console = {
  log: (...args) => log("info", text(args)),
  info: (...args) => log("info", text(args)),
  debug: (...args) => log("debug", text(args)),
  trace: (...args) => log("trace", text(args)),
  warn: (...args) => log("warn", text(args)),
  error: (...args) => log("error", text(args)),
};

// Math.random as xorshift128+ on 32-bit halves, seeded from wasi:random at its first use in a task.
let state = null;
export function taskStarts() {
  state = null;
}
function random() {
  if (state === null) {
    const seed = getRandomBytes(16);
    state = new Uint32Array(4);
    for (let k = 0; k < 4; k++) {
      state[k] = seed[4 * k] | (seed[4 * k + 1] << 8) | (seed[4 * k + 2] << 16) | (seed[4 * k + 3] << 24);
    }
    if ((state[0] | state[1] | state[2] | state[3]) === 0) state[0] = 1;
  }
  // xorshift128 (Marsaglia), two draws make the 53 bits of a double.
  const draw = () => {
    let t = state[3];
    const s = state[0];
    state[3] = state[2];
    state[2] = state[1];
    state[1] = s;
    t ^= t << 11;
    t ^= t >>> 8;
    state[0] = t ^ s ^ (s >>> 19);
    return state[0] >>> 0;
  };
  return ((draw() >>> 5) * 67108864 + (draw() >>> 6)) / 9007199254740992;
}

const crypto = {
  getRandomValues(array) {
    if (!ArrayBuffer.isView(array) || array instanceof Float32Array || array instanceof Float64Array) {
      throw new TypeError("crypto.getRandomValues takes an integer typed array");
    }
    if (array.byteLength > 65536) throw new RangeError("crypto.getRandomValues: at most 65536 bytes");
    const bytes = getRandomBytes(array.byteLength);
    new Uint8Array(array.buffer, array.byteOffset, array.byteLength).set(bytes);
    return array;
  },
  randomUUID() {
    const b = getRandomBytes(16);
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    const h = Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
    return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
  },
};

function fetch() {
  throw new Error(
    "fetch is not available to JavaScript handlers: componentize-qjs cannot build a component that imports " +
      "wasi:http (plugin-sdk/README.md, \"JavaScript\"); write a handler that calls a URL in Rust",
  );
}

const define = (name, value) =>
  Object.defineProperty(globalThis, name, { value, writable: true, configurable: true, enumerable: false });
if (typeof globalThis.TextEncoder === "undefined") define("TextEncoder", TextEncoder);
if (typeof globalThis.TextDecoder === "undefined") define("TextDecoder", TextDecoder);
if (typeof globalThis.console === "undefined") define("console", console);
if (typeof globalThis.crypto === "undefined") define("crypto", crypto);
if (typeof globalThis.fetch === "undefined") define("fetch", fetch);
Math.random = random;
