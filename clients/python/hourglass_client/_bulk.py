"""``schedule_many``: many tasks, each checked before anything is sent, then sent in batches, each batch one
``schedule_batch`` script call per type (or shard) as the host sends them; on a plain Redis the batches
go one after another on one connection, several in flight (a :class:`~._core.Stream`)."""

from __future__ import annotations

from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Tuple

from . import _args
from ._core import Core, Script, Steps, Stream, check_replicas
from .errors import HourglassError, InvalidArgument, ReplicationTimeout
from .results import NewTask, NewTaskLike
from .shards import shard_of

#: Tasks per batch (one write).
BATCH = 1000
#: Most tasks, and bytes of ids and payloads, in one script call (the host's MAX_BATCH_TASKS and
#: MAX_BATCH_BYTES): a call holds Redis while it runs, about a millisecond at most.
MAX_BATCH_TASKS = 200
MAX_BATCH_BYTES = 256 * 1024
_FIELDS = ("task_type", "id", "payload", "at", "at_ms", "delay", "delay_ms", "mode")
#: A task, checked: its queue (type or shard), id, due time, payload and mode (bytes: packed as it is).
Checked = Tuple[str, bytes, int, bytes, bytes]


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
    checked: List[Checked] = []
    shards: Dict[str, Tuple[str, ...]] = {}  # the shard tags of each type seen (checked once)
    for i, task in enumerate(tasks):
        try:
            checked.append(_step(core, task, now, shards))
        except HourglassError as e:
            raise InvalidArgument(f"schedule_many: task {i}: {e}") from e
    if not checked:
        return []
    # Per batch packed, per call: the indexes of its tasks.
    task_indexes: List[List[List[int]]] = []

    def batches() -> Iterator[List[Script]]:
        for start in range(0, len(checked), BATCH):
            calls, indexes = _calls(core, checked, start, min(start + BATCH, len(checked)))
            task_indexes.append(indexes)
            yield calls

    # With replicas=N, one WAIT after the last batch, on their connection: it counts all their writes.
    replies, acked = yield Stream(batches(), wait)
    last_sent = min(len(replies) * BATCH, len(checked)) - 1
    calls = [(indexes, reply) for batch, out in zip(task_indexes, replies) for indexes, reply in zip(batch, out)]
    failed = [(indexes, reply) for indexes, reply in calls if isinstance(reply, BaseException)]
    if failed:
        raise _fault(failed, last_sent)
    if wait is not None:
        if isinstance(acked, BaseException):
            raise acked
        try:
            check_replicas(acked, wait)
        except ReplicationTimeout as e:
            raise ReplicationTimeout(
                f"schedule_many: tasks 0 to {last_sent} were sent, then one WAIT for them all, and {e}",
                acked=e.acked,
                wanted=e.wanted,
            ) from None
    written = [False] * len(checked)
    for indexes, reply in calls:
        for i, w in zip(indexes, reply):
            written[i] = w == 1
    return written


def _fault(failed: List[Tuple[List[int], BaseException]], last_sent: int) -> BaseException:
    """The error of the first call that failed, saying which tasks were sent and which not written: the
    batches in flight behind its batch were run too, and may have failed calls of their own."""
    (indexes, reply), later = failed[0], failed[1:]
    also = ""
    if later:
        tasks = sum(len(these) for these, _ in later)
        also = f", nor {tasks} more in {len(later)} later call(s) that failed too, the first from task {later[0][0][0]}"
    why = (
        f"schedule_many: task {indexes[0]}: {reply} (tasks 0 to {last_sent} were sent; the {len(indexes)} of "
        f"its script call (of this task's type in its batch, from task {indexes[0]}) were not written{also}, "
        f"the others were; none after {last_sent} was sent)"
    )
    return type(reply)(why) if isinstance(reply, HourglassError) else reply


def _calls(core: Core, checked: List[Checked], start: int, end: int) -> Tuple[List[Script], List[List[int]]]:
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


def _step(core: Core, task: Any, now: int, shards: Dict[str, Tuple[str, ...]]) -> Checked:
    """A task, checked (:data:`Checked`)."""
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
    return (q, raw, due, _args.payload(body), _args.mode(mode).encode())
