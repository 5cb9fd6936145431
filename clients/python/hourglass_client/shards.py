"""Where a task of a sharded type lives: the shard tags of docs/scaling.md, as the host computes them."""

from __future__ import annotations

import struct
from functools import lru_cache

from redis.crc import key_slot

SLOTS = 16384


def _f32(x: float) -> float:
    """``x`` rounded to a C ``float``: redis-cli splits the slots in float arithmetic."""
    return float(struct.unpack("f", struct.pack("f", x))[0])


def slot_ranges(n: int) -> list[int]:
    """The last slot of each of the ``n`` ranges ``redis-cli --cluster create`` gives ``n`` masters."""
    per, cursor, first, ends = _f32(SLOTS / n), 0.0, 0, []
    for i in range(n):
        x = _f32(_f32(cursor + per) - 1)
        # lround: halves away from zero (x is never negative here).
        last = int(x + 0.5)
        if i == n - 1 or last > SLOTS:
            last = SLOTS - 1
        last = max(first, last)
        ends.append(last)
        first, cursor = last + 1, _f32(cursor + per)
    return ends


@lru_cache(maxsize=None)
def shard_tags(task_type: str, n: int) -> tuple[str, ...]:
    """The hash tags of the ``n`` shards of ``task_type``, shard 0 (the type itself) first.

    Shard ``i``'s tag is ``T#k`` for the smallest ``k`` whose slot lies in the
    ``i``-th slot range (shard 0's range is the type's own; the others take
    the remaining ranges in ascending order), so N shards sit on N masters of
    an evenly split cluster.
    """
    if n <= 1:
        return (task_type,)
    ends = slot_ranges(n)

    def range_of(slot: int) -> int:
        return next(r for r, end in enumerate(ends) if slot <= end)

    home = range_of(key_slot(task_type.encode()))
    tags: list[str | None] = [task_type] + [None] * (n - 1)
    missing, k = n - 1, 0
    while missing:
        k += 1
        r = range_of(key_slot(f"{task_type}#{k}".encode()))
        if r == home:
            continue
        i = r + 1 if r < home else r
        if tags[i] is None:
            tags[i] = f"{task_type}#{k}"
            missing -= 1
    return tuple(t for t in tags if t is not None)


def shard_of(task_id: bytes, n: int) -> int:
    """The shard index of ``task_id`` in a type of ``n`` shards: ``CLUSTER KEYSLOT <id>`` mod ``n``."""
    return 0 if n <= 1 else key_slot(task_id) % n
