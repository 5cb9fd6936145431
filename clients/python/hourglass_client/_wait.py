"""``wait``: how a task ended, read from its type's events stream (docs/operations.md, "Completion events").

The order makes it race-free: the stream's last entry is noted *before* the task is looked at, and
a host appends an outcome in the same script that settles the task. So a task seen waiting or
running ends with an entry after the noted one; a task not there ended before (its entry is further
back) or never was; and a dead one is dead.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from . import _args
from ._core import Batch, Cmd, Steps, text, to_int
from .errors import NoEvents, UnknownTask, WaitTimeout
from .results import Ended, Outcome, TaskState, TaskView

if TYPE_CHECKING:
    from ._core import Core

#: Stream entries per read.
PAGE = 1000
#: Open groups whose callback ids are read per round trip (a callback whose id is not its group's).
GROUPS_PAGE = 200
_ENDINGS = {b"succeeded": Outcome.SUCCEEDED, b"dead": Outcome.DEAD, b"cancelled": Outcome.CANCELLED}
_WAITING = (TaskState.SCHEDULED, TaskState.DUE, TaskState.RUNNING)

Entry = Tuple[bytes, Dict[bytes, bytes]]


def wait_steps(core: Core, t: str, task_id: _args.Id, timeout_ms: Optional[int]) -> Steps[Ended]:
    tt, raw = _args.task_type(t), _args.task_id(task_id)
    deadline = None if timeout_ms is None else time.monotonic() + timeout_ms / 1000
    name = raw.decode("utf-8", "backslashreplace")
    # (1)-(4): note the stream's end, then look at the task; a task not there is looked for in the
    # stream, then among the groups whose callback it is (it is scheduled when its group completes).
    q, tried, group = core.shard_for(tt, raw), set(), None
    looked_again = False
    while True:
        tried.add(q)
        key, last, view = yield from _locate(core, tt, raw, q)
        if view.state != TaskState.UNKNOWN:
            if view.task_type not in tried:
                q = view.task_type  # found in another shard: its events are in that shard's stream
                continue
            break
        ended = yield from _scan_back(core, key, raw)
        if ended is not None:
            return ended
        group = yield from _pending_group(core, tt, raw)
        if group is None and not looked_again:
            # A group may have completed since the look above, scheduling its callback in the same
            # step: look once more (it is then waiting, running, dead, or its end is in the stream).
            looked_again = True
            continue
        if group is None:
            raise UnknownTask(
                f"task {tt}/{name} is unknown: not waiting, running or dead, no ending of it in {key}, "
                f"and no open group of {tt} has it as its callback"
            )
        if tt in tried:
            break
        q = tt  # a group's callback is scheduled in its group's slot, the type's own
    if view.state == TaskState.DEAD:
        return _dead(view)
    if view.state != TaskState.UNKNOWN:
        group = None  # there: wait for it as for any task

    # (5): read on from the noted entry until this task's ending, the deadline, or the task
    # gone without one (cancelled while it waited: a client's cancel adds no event).
    seen, attempt = view.state in _WAITING, view.attempts
    while True:
        block = core._block_ms
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise WaitTimeout(f"task {tt}/{name} did not end within {timeout_ms} ms")
            block = max(1, min(block, int(left * 1000) + 1))
        entries = _entries((yield Cmd("xread", ({key: last},), {"count": PAGE, "block": block})))
        for last, fields in entries:
            ended = _ending(fields, raw)
            if ended is not None:
                return ended
        if entries:
            continue
        # A whole block without its ending: is it still there to wait for?
        view, ended, last = yield from _look_again(core, tt, raw, key, last)
        if view.state in _WAITING:
            seen, attempt = True, view.attempts
            continue
        if ended is not None:
            return ended
        if group is not None:
            state, fired = yield from _group_state(core, tt, group)
            if state in ("open", "sealed"):
                continue
            # Done: the callback was scheduled (if it was) before this look, so it is there or ended.
            view, ended, last = yield from _look_again(core, tt, raw, key, last)
            if view.state in _WAITING:
                seen, attempt, group = True, view.attempts, None
                continue
            if ended is not None:
                return ended
            raise UnknownTask(
                f"group {tt}/{group} completed without running its callback {name} (fired: {fired or 'nothing'})"
            )
        if seen:
            return Ended(Outcome.CANCELLED, attempt, None, None)


def _locate(core: Core, tt: str, raw: bytes, q: str) -> Steps[Tuple[str, bytes, TaskView]]:
    """(1) the events stream of shard ``q``, (2) its last entry's id, (3) the task, in this order."""
    key = core.key(q, "events")
    if not (yield from core._stream_steps(key)):
        where = tt if q == tt else f"{tt} (shard {q})"
        raise NoEvents(
            f"type {where} has no events stream ({key}): set events = true for it in runner.toml; "
            "a host creates the stream when it starts"
        )
    newest = yield Cmd("xrevrange", (key, "+", "-"), {"count": 1})
    last = bytes(newest[0][0]) if newest else b"0-0"
    view = yield from core._show_steps(tt, raw, 0)
    return key, last, view


def _scan_back(core: Core, key: str, raw: bytes) -> Steps[Optional[Ended]]:
    """The newest ending of ``raw`` in the stream, reading it back from its end a page at a time."""
    top = "+"
    while True:
        page = yield Cmd("xrevrange", (key, top, "-"), {"count": PAGE})
        for entry_id, fields in page:
            ended = _ending(_fields(fields), raw)
            if ended is not None:
                return ended
        if len(page) < PAGE:
            return None
        top = "(" + text(page[-1][0])


def _dead(view: TaskView) -> Ended:
    return Ended(Outcome.DEAD, view.attempts, view.last_error, view.died_ms)


def _look_again(
    core: Core, tt: str, raw: bytes, key: str, last: bytes
) -> Steps[Tuple[TaskView, Optional[Ended], bytes]]:
    """Where the task is now and, when it no longer waits, its ending: read on from ``last`` in
    the stream, else its dead letter. Also the stream position read up to."""
    view = yield from core._show_steps(tt, raw, 0)
    if view.state in _WAITING:
        return view, None, last
    ended, last = yield from _drain(core, key, last, raw)
    if ended is None and view.state == TaskState.DEAD:
        ended = _dead(view)
    return view, ended, last


def _drain(core: Core, key: str, last: bytes, raw: bytes) -> Steps[Tuple[Optional[Ended], bytes]]:
    """Reads what the stream holds after ``last``, without blocking: the ending of ``raw`` if it is there."""
    while True:
        entries = _entries((yield Cmd("xread", ({key: last},), {"count": PAGE})))
        for last, fields in entries:
            ended = _ending(fields, raw)
            if ended is not None:
                return ended, last
        if len(entries) < PAGE:
            return None, last


def _pending_group(core: Core, tt: str, raw: bytes) -> Steps[Optional[str]]:
    """The id of an open or sealed group of callback type ``tt`` whose callback id is ``raw``, or None."""
    try:
        callback = raw.decode()
    except UnicodeDecodeError:
        return None  # a callback id is text
    # Most groups are named after their callback: look there first.
    state, cb = yield Cmd("hmget", (core.key(tt, f"group:{callback}"), "state", "callback_id"))
    if cb is not None and text(cb) == callback and text(state) in ("open", "sealed"):
        return callback
    groups = core.key(tt, "groups")
    start = 0
    while True:
        ids = yield Cmd("zrange", (groups, start, start + GROUPS_PAGE - 1))
        if not ids:
            return None
        keys = [core.key(tt, f"group:{text(g)}") for g in ids]
        replies = yield Batch([Cmd("hmget", (k, "state", "callback_id")) for k in keys])
        for g, reply in zip(ids, replies):
            if isinstance(reply, Exception):
                raise reply
            state, cb = reply
            if cb is not None and text(cb) == callback and text(state) in ("open", "sealed"):
                return text(g)
        start += GROUPS_PAGE


def _group_state(core: Core, tt: str, group: str) -> Steps[Tuple[str, Optional[str]]]:
    state, fired = yield Cmd("hmget", (core.key(tt, f"group:{group}"), "state", "fired"))
    return (text(state) if state is not None else "gone"), (text(fired) if fired is not None else None)


def _entries(reply: Any) -> List[Entry]:
    """The entries of an XREAD reply of one stream, RESP2 (``[[key, entries]]``) or RESP3 (``{key: entries}``)."""
    if not reply:
        return []
    streams = list(reply.values()) if isinstance(reply, dict) else [s[1] for s in reply]
    return [(bytes(entry_id), _fields(fields)) for entries in streams for entry_id, fields in entries]


def _fields(fields: Any) -> Dict[bytes, bytes]:
    if isinstance(fields, dict):
        return fields
    return dict(zip(fields[::2], fields[1::2]))


def _ending(fields: Dict[bytes, bytes], raw: bytes) -> Optional[Ended]:
    """The ending this entry reports for task ``raw``; None for another task or a retry or reschedule."""
    if fields.get(b"id") != raw:
        return None
    outcome = _ENDINGS.get(fields.get(b"outcome", b""))
    if outcome is None:
        return None
    error = fields.get(b"error")
    return Ended(
        outcome=outcome,
        attempt=int(fields.get(b"attempt") or 0),
        error=text(error) if error is not None else None,
        finished_ms=to_int(fields.get(b"finished_ms")),
    )
