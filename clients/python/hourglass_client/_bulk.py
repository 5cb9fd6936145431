"""``schedule_many``: many tasks, each checked before anything is sent, then a round trip per batch, each
batch one ``schedule_batch`` script call per type (or shard) as the host sends them."""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

from . import _args
from ._core import Batch, Core, Script, Steps, check_replicas
from .errors import HourglassError, InvalidArgument, ReplicationTimeout
from .results import NewTask, NewTaskLike
from .shards import shard_of

#: Tasks per round trip.
BATCH = 1000
#: Most tasks, and bytes of ids and payloads, in one script call (the host's MAX_BATCH_TASKS and
#: MAX_BATCH_BYTES): a call holds Redis while it runs, about a millisecond at most.
MAX_BATCH_TASKS = 200
MAX_BATCH_BYTES = 256 * 1024
_FIELDS = ("task_type", "id", "payload", "at", "at_ms", "delay", "delay_ms", "mode")


def schedule_many_steps(
    core: Core,
    tasks: Iterable[NewTaskLike],
    replicas: Optional[int] = None,
    replicas_timeout_ms: Optional[int] = None,
) -> Steps[List[bool]]:
    if isinstance(tasks, (NewTask, Mapping, str, bytes)):
        raise InvalidArgument("schedule_many takes an iterable of tasks (NewTask or dict), not one task")
    wait = core._wait_cmd(replicas, replicas_timeout_ms)
    now = _args.now_ms()
    checked: List[Tuple[str, bytes, int, bytes, str]] = []
    shards: Dict[str, Tuple[str, ...]] = {}  # the shard tags of each type seen (checked once)
    for i, task in enumerate(tasks):
        try:
            checked.append(_step(core, task, now, shards))
        except HourglassError as e:
            raise InvalidArgument(f"schedule_many: task {i}: {e}") from e
    written: List[bool] = []
    for start in range(0, len(checked), BATCH):
        calls, firsts = _calls(core, checked, start, min(start + BATCH, len(checked)))
        # With replicas=N each round trip ends with WAIT, on the connection that sent its tasks.
        replies = yield Batch(list(calls) + ([wait] if wait is not None else []))
        if wait is not None:
            acked = replies.pop()
            if isinstance(acked, BaseException):
                raise acked
            try:
                check_replicas(acked, wait)
            except ReplicationTimeout as e:
                sent = min(start + BATCH, len(checked)) - 1
                raise ReplicationTimeout(
                    f"schedule_many: tasks 0 to {sent} were sent; {e}", acked=e.acked, wanted=e.wanted
                ) from None
        done: Dict[int, bool] = {}
        for indexes, reply in zip(firsts, replies):
            if isinstance(reply, BaseException):
                sent = min(start + BATCH, len(checked)) - 1
                why = (
                    f"schedule_many: task {indexes[0]}: {reply} (tasks 0 to {sent} were sent; the {len(indexes)} "
                    f"of this task's type in its batch, from task {indexes[0]}, were not written, the others were; "
                    f"none after {sent} was sent)"
                )
                raise (type(reply)(why) if isinstance(reply, HourglassError) else reply)
            for i, w in zip(indexes, reply):
                done[i] = w == 1
        written.extend(done[i] for i in range(start, min(start + BATCH, len(checked))))
    return written


def _calls(
    core: Core, checked: List[Tuple[str, bytes, int, bytes, str]], start: int, end: int
) -> Tuple[List[Script], List[List[int]]]:
    """Tasks ``start`` to ``end`` as ``schedule_batch`` calls, per type (or shard) in their order, cut at
    :data:`MAX_BATCH_TASKS` and :data:`MAX_BATCH_BYTES`; with each call, the indexes of its tasks."""
    by_queue: Dict[str, List[int]] = {}
    for i in range(start, end):
        by_queue.setdefault(checked[i][0], []).append(i)
    calls: List[Script] = []
    indexes: List[List[int]] = []
    for q, members in by_queue.items():
        args: List[Any] = []
        these: List[int] = []
        size = 0
        for i in members:
            _, raw, due, data, how = checked[i]
            if these and (len(these) == MAX_BATCH_TASKS or size + len(raw) + len(data) > MAX_BATCH_BYTES):
                calls.append(Script("schedule_batch", [core.key(q, "due"), core.key(q, "payload")], args))
                indexes.append(these)
                args, these, size = [], [], 0
            args += (raw, due, data, how)
            these.append(i)
            size += len(raw) + len(data)
        calls.append(Script("schedule_batch", [core.key(q, "due"), core.key(q, "payload")], args))
        indexes.append(these)
    return calls, indexes


def _step(core: Core, task: Any, now: int, shards: Dict[str, Tuple[str, ...]]) -> Tuple[str, bytes, int, bytes, str]:
    """A task, checked: its queue (type or shard), id, due time, payload and mode."""
    if isinstance(task, NewTask):
        t, task_id, body, at, at_ms = task.task_type, task.id, task.payload, task.at, task.at_ms
        delay, delay_ms, mode = task.delay, task.delay_ms, task.mode
    elif isinstance(task, Mapping):
        unknown = [k for k in task if k not in _FIELDS]
        if unknown:
            if "traceparent" in unknown:
                raise InvalidArgument("traceparent is not supported in bulk: schedule that task with schedule()")
            raise InvalidArgument(f"unknown field {unknown[0]!r}: a task has {', '.join(_FIELDS)}")
        if "task_type" not in task or "id" not in task:
            raise InvalidArgument("a task needs task_type and id")
        t, task_id, body = task["task_type"], task["id"], task.get("payload")
        at, at_ms, delay, delay_ms = task.get("at"), task.get("at_ms"), task.get("delay"), task.get("delay_ms")
        mode = task.get("mode", "upsert")
    else:
        raise InvalidArgument(f"a task is a NewTask or a dict, not {type(task).__name__}")
    tags = shards.get(t) if isinstance(t, str) else None
    if tags is None:
        tags = shards[t] = core._shards_of(_args.task_type(t))
    raw = _args.task_id(task_id)
    q = tags[shard_of(raw, len(tags))] if len(tags) > 1 else t
    if at is None and at_ms is None and delay is None and delay_ms is None:
        due = now
    else:
        due = _args.due_ms(at=at, at_ms=at_ms, delay=delay, delay_ms=delay_ms, now=now)
    return (q, raw, due, _args.payload(body), _args.mode(mode))
