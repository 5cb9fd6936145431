"""A batch of script calls on one connection of a plain (not cluster) Redis: packed here, sent in one
write, and each reply read back in order. It is what redis-py's pipeline does, with the part of each
``EVALSHA`` that repeats (the SHA, the key count and the keys of one type or shard) packed once: about
half of redis-py's time per call in a bulk schedule goes to packing its ten arguments one by one."""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import redis

from ._core import Script

#: (script, keys) → (the number of parts of its command, its first parts packed).
Heads = Dict[Tuple[str, Tuple[str, ...]], Tuple[int, bytes]]
_MOST_HEADS = 4096


def pack(calls: List[Script], scripts: Dict[str, Any], encoder: Any, heads: Heads) -> bytes:
    """The RESP of ``EVALSHA <sha> <numkeys> <keys...> <args...>`` for each call, in order."""
    out: List[bytes] = []
    for call in calls:
        head_key = (call.name, tuple(call.keys))
        head = heads.get(head_key)
        if head is None:
            if len(heads) >= _MOST_HEADS:
                heads.clear()
            parts = [b"EVALSHA", scripts[call.name].sha.encode(), b"%d" % len(call.keys)]
            parts += [encoder.encode(k) for k in call.keys]
            head = heads[head_key] = (len(parts), b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts))
        out.append(b"*%d\r\n%s" % (head[0] + len(call.args), head[1]))
        for arg in call.args:
            if isinstance(arg, bytes):
                data = arg
            elif isinstance(arg, str):
                data = encoder.encode(arg)
            elif isinstance(arg, int) and not isinstance(arg, bool):
                data = b"%d" % arg
            else:
                raise TypeError(f"cannot send a {type(arg).__name__} as a script argument")
            out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


def run(client: redis.Redis, calls: List[Script], scripts: Dict[str, Any], heads: Heads) -> List[Any]:
    """Sends the calls on one pooled connection; their replies in order, an error reply as its exception."""
    pool = client.connection_pool
    conn = pool.get_connection("EVALSHA")
    try:
        conn.send_packed_command([pack(calls, scripts, conn.encoder, heads)])
        replies: List[Any] = []
        for _ in calls:
            try:
                replies.append(conn.read_response())
            except redis.ResponseError as e:  # the whole error reply was read: the next one follows
                replies.append(e)
        return replies
    except BaseException:
        conn.disconnect()  # replies may be left unread: this connection is not reused as it is
        raise
    finally:
        pool.release(conn)


async def run_async(client: Any, calls: List[Script], scripts: Dict[str, Any], heads: Heads) -> List[Any]:
    """:func:`run` on a ``redis.asyncio.Redis``."""
    pool = client.connection_pool
    conn = await pool.get_connection("EVALSHA")
    try:
        await conn.send_packed_command([pack(calls, scripts, conn.encoder, heads)])
        replies: List[Any] = []
        for _ in calls:
            try:
                replies.append(await conn.read_response())
            except redis.ResponseError as e:
                replies.append(e)
        return replies
    except BaseException:
        await conn.disconnect()
        raise
    finally:
        await pool.release(conn)
