// Where a task of a sharded type lives: the shard tags of docs/scaling.md, as the host computes them.
"use strict";

const keySlot = require("cluster-key-slot");

const SLOTS = 16384;

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

module.exports = { shardTags, shardOf, slotRanges };
