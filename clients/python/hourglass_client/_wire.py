"""A batch of script calls on one connection of a plain (not cluster) Redis: packed here, sent in one
write, and each reply read back in order. It is what redis-py's pipeline does, with the part of each
``EVALSHA`` that repeats (the SHA, the key count and the keys of one type or shard) packed once: about
half of redis-py's time per call in a bulk schedule goes to packing its ten arguments one by one.

A stream (:class:`~._core.Stream`) is many such batches on one connection held throughout, up to
:data:`IN_FLIGHT` of them sent before the oldest one's replies are read, so the next batch is packed
while Redis runs this one; one connection keeps them in order (a later task sees an earlier one's
write). Its sends and reads are written once (:func:`_flow`), and run blocking or on asyncio."""

from __future__ import annotations

from collections import deque
from typing import Any, Deque, Dict, Generator, Iterator, List, Optional, Set, Tuple

import redis

from ._core import Cmd, Script

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


#: Batches of a stream sent before the oldest one's replies are read (as Node's bulk.js).
IN_FLIGHT = 4
#: What :func:`_flow` yields to have the next reply read (sent back: the reply, or its ResponseError).
READ = None
#: A call sent in a stream, with its place (its batch, its index there); None for a SCRIPT LOAD.
Sent = Optional[Tuple[Tuple[int, int], Script]]
Flow = Generator[Optional[bytes], Any, Tuple[List[List[Any]], Any]]


def _flow(batches: Iterator[List[Script]], scripts: Dict[str, Any], encoder: Any, heads: Heads, then: Optional[Cmd]) -> Flow:
    """A stream's writes and reads, without the I/O: it yields the bytes to write, or :data:`READ`;
    it returns the stream's reply (each batch's replies, ``then``'s reply or None)."""
    replies: List[List[Any]] = []
    in_flight: Deque[List[Sent]] = deque()  # each write's calls, the oldest write first
    missing: List[Tuple[Tuple[int, int], Script]] = []  # NOSCRIPT: to send again, in the order first sent
    resent: Set[Tuple[int, int]] = set()
    failed = False
    while True:
        # No batch after an error reply, nor while calls wait to be sent again.
        while not failed and not missing and len(in_flight) < IN_FLIGHT:
            calls = next(batches, None)
            if calls is None:
                break
            in_flight.append([((len(replies), j), call) for j, call in enumerate(calls)])
            replies.append([None] * len(calls))
            yield pack(calls, scripts, encoder, heads)
        if not in_flight:
            if failed or not missing:
                break
            # Every write before is answered: load the scripts on this connection (a pool of one must
            # not wait for a second), then send the calls again in the order they were first sent,
            # before any later batch. What remains: another client may load the script while our
            # batches are in flight, and a later one then runs before an earlier one is sent again.
            # (On a server without the script, every batch in flight meets NOSCRIPT: sent twice, once.)
            names = list(dict.fromkeys(call.name for _, call in missing))
            again: List[Sent] = [None] * len(names)
            again += missing
            in_flight.append(again)
            resent.update(place for place, _ in missing)
            loads = b"".join(_command(encoder, "SCRIPT", "LOAD", scripts[n].script) for n in names)
            yield loads + pack([call for _, call in missing], scripts, encoder, heads)
            missing = []
            continue
        for sent in in_flight.popleft():
            reply = yield READ
            if sent is None:
                continue  # a SCRIPT LOAD: a call that still finds no script says so itself
            place = sent[0]
            if isinstance(reply, redis.exceptions.NoScriptError) and place not in resent:
                missing.append(sent)
            elif isinstance(reply, redis.ResponseError):
                failed = True
            replies[place[0]][place[1]] = reply
    if then is None or failed:
        return replies, None
    # WAIT counts every earlier write of its connection: one, after the last batch, counts them all.
    assert then.method == "execute_command"
    yield _command(encoder, *then.args)
    return replies, (yield READ)


def _command(encoder: Any, *parts: Any) -> bytes:
    """The RESP of one command."""
    data = [encoder.encode(p) for p in parts]
    return b"*%d\r\n" % len(data) + b"".join(b"$%d\r\n%s\r\n" % (len(d), d) for d in data)


def stream(
    client: redis.Redis, batches: Iterator[List[Script]], scripts: Dict[str, Any], heads: Heads, then: Optional[Cmd]
) -> Tuple[List[List[Any]], Any]:
    """Runs a stream on one pooled connection, held until its end; its reply (an error reply as its exception)."""
    pool = client.connection_pool
    conn = pool.get_connection("EVALSHA")
    try:
        flow = _flow(batches, scripts, conn.encoder, heads, then)
        reply: Any = None
        while True:
            try:
                write = flow.send(reply)
            except StopIteration as done:
                result: Tuple[List[List[Any]], Any] = done.value
                return result
            if write is READ:
                try:
                    reply = conn.read_response()
                except redis.ResponseError as e:  # the whole error reply was read: the next one follows
                    reply = e
            else:
                conn.send_packed_command([write])
                reply = None
    except BaseException:
        conn.disconnect()  # replies may be left unread: this connection is not reused as it is
        raise
    finally:
        pool.release(conn)


async def stream_async(
    client: Any, batches: Iterator[List[Script]], scripts: Dict[str, Any], heads: Heads, then: Optional[Cmd]
) -> Tuple[List[List[Any]], Any]:
    """:func:`stream` on a ``redis.asyncio.Redis``."""
    pool = client.connection_pool
    conn = await pool.get_connection("EVALSHA")
    try:
        flow = _flow(batches, scripts, conn.encoder, heads, then)
        reply: Any = None
        while True:
            try:
                write = flow.send(reply)
            except StopIteration as done:
                result: Tuple[List[List[Any]], Any] = done.value
                return result
            if write is READ:
                try:
                    reply = await conn.read_response()
                except redis.ResponseError as e:
                    reply = e
            else:
                await conn.send_packed_command([write])
                reply = None
    except BaseException:
        await conn.disconnect()
        raise
    finally:
        await pool.release(conn)
