"""``schedule_many``: many tasks, each checked before anything is sent, then pipelined a batch per round trip."""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple, Union

from . import _args
from ._core import Batch, Cmd, Core, Script, Steps, check_replicas
from .errors import HourglassError, InvalidArgument, ReplicationTimeout
from .results import NewTask, NewTaskLike
from .shards import shard_of

#: Tasks per pipeline (one round trip each).
BATCH = 1000
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
    steps: List[Union[Script, Cmd]] = []
    shards: Dict[str, Tuple[str, ...]] = {}  # the shard tags of each type seen (checked once)
    for i, task in enumerate(tasks):
        try:
            steps.append(_step(core, task, now, shards))
        except HourglassError as e:
            raise InvalidArgument(f"schedule_many: task {i}: {e}") from e
    written: List[bool] = []
    for start in range(0, len(steps), BATCH):
        batch = steps[start : start + BATCH]
        # With replicas=N each round trip ends with WAIT, on the connection that sent its tasks.
        replies = yield Batch(list(batch) + ([wait] if wait is not None else []))
        if wait is not None:
            acked = replies.pop()
            if isinstance(acked, BaseException):
                raise acked
            try:
                check_replicas(acked, wait)
            except ReplicationTimeout as e:
                sent = start + len(batch) - 1
                raise ReplicationTimeout(
                    f"schedule_many: tasks 0 to {sent} were sent; {e}", acked=e.acked, wanted=e.wanted
                ) from None
        for j, reply in enumerate(replies):
            if isinstance(reply, BaseException):
                sent = start + len(batch) - 1
                why = (
                    f"schedule_many: task {start + j}: {reply} (tasks 0 to {sent} were sent, and each of them "
                    f"that did not fail is written; none after {sent} was sent)"
                )
                raise (type(reply)(why) if isinstance(reply, HourglassError) else reply)
            written.append(reply == 1)
    return written


def _step(core: Core, task: Any, now: int, shards: Dict[str, Tuple[str, ...]]) -> Script:
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
    data = _args.payload(body)
    return Script(
        "schedule",
        [core.key(q, "due"), core.key(q, "payload")],
        [raw, due, data, "1" if data else "0", _args.mode(mode)],
    )
