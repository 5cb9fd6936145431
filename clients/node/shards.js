// Where a task of a sharded type lives: the shard tags of docs/scaling.md, as the host computes them.
"use strict";

const SLOTS = 16384;

// CRC16-XMODEM (polynomial 0x1021), the checksum of Redis Cluster's key slots.
const CRC16 = new Uint16Array(256);
for (let i = 0; i < 256; i++) {
  let c = i << 8;
  for (let bit = 0; bit < 8; bit++) c = ((c << 1) ^ (c & 0x8000 ? 0x1021 : 0)) & 0xffff;
  CRC16[i] = c;
}

function crc16(bytes, from, to) {
  let crc = 0;
  for (let i = from; i < to; i++) crc = ((crc << 8) & 0xffff) ^ CRC16[((crc >> 8) ^ bytes[i]) & 0xff];
  return crc;
}

/**
 * `CLUSTER KEYSLOT <key>` (a string, as the UTF-8 ioredis writes, or bytes), by the hash tag rule of
 * Redis' keyHashSlot: the bytes between the first `{` and the first `}` after it when there are
 * some, else the whole key. Not cluster-key-slot (1.1.2): after an empty tag it reads on to a later
 * `}` (it gives `a{}b}c` the slot of `b`, where Redis hashes the whole key), which put such ids in
 * another shard than the host, the Python client and the Rust store (tests/host/workflows/agree.rs).
 */
function keySlot(key) {
  const bytes = typeof key === "string" ? Buffer.from(key) : key;
  const open = bytes.indexOf(0x7b);
  if (open !== -1) {
    const close = bytes.indexOf(0x7d, open + 1);
    if (close > open + 1) return crc16(bytes, open + 1, close) & (SLOTS - 1);
  }
  return crc16(bytes, 0, bytes.length) & (SLOTS - 1);
}

/** The last slot of each of the `n` ranges `redis-cli --cluster create` gives `n` masters (C float arithmetic). */
function slotRanges(n) {
  const per = Math.fround(SLOTS / n);
  const ends = [];
  let first = 0;
  let cursor = 0;
  for (let i = 0; i < n; i++) {
    const x = Math.fround(Math.fround(cursor + per) - 1);
    // lround: halves away from zero (x is never negative here).
    let last = Math.floor(x + 0.5);
    if (i === n - 1 || last > SLOTS) last = SLOTS - 1;
    last = Math.max(first, last);
    ends.push(last);
    first = last + 1;
    cursor = Math.fround(cursor + per);
  }
  return ends;
}

const cache = new Map();

/**
 * The hash tags of the `n` shards of `taskType`, shard 0 (the type itself) first: shard i's tag is
 * `T#k` for the smallest k whose slot lies in the i-th slot range, so N shards sit on N masters of an
 * evenly split cluster.
 */
function shardTags(taskType, n) {
  if (n <= 1) return [taskType];
  const key = `${taskType}\n${n}`;
  if (cache.has(key)) return cache.get(key);
  const ends = slotRanges(n);
  const rangeOf = (slot) => ends.findIndex((e) => slot <= e);
  const home = rangeOf(keySlot(taskType));
  const tags = [taskType];
  for (let k = 1, missing = n - 1; missing > 0; k++) {
    const r = rangeOf(keySlot(`${taskType}#${k}`));
    if (r === home) continue;
    const i = r < home ? r + 1 : r;
    if (tags[i] === undefined) {
      tags[i] = `${taskType}#${k}`;
      missing--;
    }
  }
  Object.freeze(tags);
  cache.set(key, tags);
  return tags;
}

/** The shard index of `id` (string or Buffer) in a type of `n` shards: CLUSTER KEYSLOT <id> mod n. */
function shardOf(id, n) {
  return n <= 1 ? 0 : keySlot(id) % n;
}

module.exports = { shardTags, shardOf, slotRanges, keySlot };
