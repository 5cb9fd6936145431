"""What the calls return: states as ``str`` enums (``view.state == "running"`` still holds, and
``print(view.state)`` prints ``running``), and results as dataclasses. Every time is in ms."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import Enum
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from ._args import Id, Mode, Payload, When


class _StrEnum(str, Enum):
    """A ``str`` whose value is the word Redis and the CLI use; prints as that word."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class TaskState(_StrEnum):
    """Where a task is (:attr:`TaskView.state`)."""

    SCHEDULED = "scheduled"
    DUE = "due"
    RUNNING = "running"
    DEAD = "dead"
    UNKNOWN = "unknown"


class CancelState(_StrEnum):
    """What :meth:`~hourglass_client.Hourglass.cancel` found: a waiting task (removed), a running one
    (its host was asked to stop it), or none."""

    SCHEDULED = "scheduled"
    RUNNING = "running"
    UNKNOWN = "unknown"


class GroupState(_StrEnum):
    """A workflow group: ``open`` (children can be added), ``sealed`` (waits for its children), ``done``."""

    OPEN = "open"
    SEALED = "sealed"
    DONE = "done"


class Fired(_StrEnum):
    """What completing a group did: scheduled its ``callback``, ``skipped`` it (``when="success"`` and a
    child failed), or ``kept`` a callback task that was there (``replace=False``)."""

    CALLBACK = "callback"
    SKIPPED = "skipped"
    KEPT = "kept"


class SealState(_StrEnum):
    """What :meth:`~hourglass_client.Hourglass.group_seal` did."""

    #: Sealed: it completes once its last pending child ends.
    SEALED = "sealed"
    #: Nothing was pending: sealed and completed at once (see :attr:`Sealed.fired`).
    COMPLETED = "completed"
    #: It was sealed or done before: nothing changed.
    ALREADY = "already"


class Outcome(_StrEnum):
    """How a task ended (:attr:`Ended.outcome`)."""

    SUCCEEDED = "succeeded"
    DEAD = "dead"
    CANCELLED = "cancelled"


@dataclass
class Cancelled:
    """What :meth:`~hourglass_client.Hourglass.cancel` did."""

    #: ``scheduled`` (removed), ``running`` (its host was asked to stop it) or ``unknown`` (neither).
    state: CancelState
    #: Of a running task, the host id that holds it.
    holder: str = ""
    #: A workflow group's child: its group is told it was cancelled (a host delivers the report).
    group_told: bool = False


@dataclass
class Lease:
    """The lease of a running task."""

    host: str
    attempt: int
    token: int
    until_ms: int


@dataclass
class Progress:
    """How far a task's handler got, as it last reported (kept across retries, gone when it ends)."""

    #: 0 to 100.
    percent: int
    #: The handler's detail, parsed from its JSON; None when it gave none.
    detail: Any
    #: The attempt that reported it.
    attempt: int
    #: When it was reported, ms.
    at_ms: int


@dataclass
class TaskView:
    """Where one task is and what Redis knows about it, read in one snapshot (``hourglass show``)."""

    #: Its type; of a sharded type, the shard it is in (``hot#3``).
    task_type: str
    id: bytes
    state: TaskState
    #: Redis's clock when read, ms.
    now_ms: int
    due_ms: Optional[int] = None
    running: Optional[Lease] = None
    died_ms: Optional[int] = None
    attempts: int = 0
    last_error: Optional[str] = None
    #: The payload's size in bytes, and its first bytes (up to the ``payload_bytes`` asked for).
    payload_size: int = 0
    payload: Optional[bytes] = None
    #: ``<callback type>/<group id>`` of a workflow group's child, until it ends.
    group: Optional[str] = None
    #: ``<home type>/<graph id>`` of a workflow graph's node, until it ends.
    graph: Optional[str] = None
    #: Of a sharded type, the index of its shard.
    shard: Optional[int] = None
    #: What its handler last reported (the ``progress`` import), until it ends.
    progress: Optional[Progress] = None


@dataclass
class Stats:
    """Queue sizes and counters of a type, summed over its shards (``hourglass stats``)."""

    due_now: int = 0
    scheduled_later: int = 0
    in_flight: int = 0
    dead: int = 0
    succeeded: int = 0
    failed: int = 0
    retried: int = 0
    dead_total: int = 0
    cancelled: int = 0
    oldest_due_age_ms: int = 0
    groups_open: int = 0
    groups_completed: int = 0
    groups_failed: int = 0
    #: Workflow graphs of this home type not done yet; declared, done, and done with a node that did not succeed.
    graphs_running: int = 0
    graphs_opened: int = 0
    graphs_completed: int = 0
    graphs_failed: int = 0
    #: What is wrong with the type's keys, with the fix; None when they are sound.
    fault: Optional[str] = None
    #: None when not paused; 0 when paused until resumed; else ms until the pause ends.
    paused_ms: Optional[int] = None


@dataclass
class Child:
    """A child to add to a workflow group: a task of any type."""

    task_type: str
    id: str
    payload: Payload = None
    #: Due time in ms since the epoch (default: now).
    due_ms: Optional[int] = None


@dataclass
class Added:
    """What :meth:`~hourglass_client.Hourglass.group_add` did."""

    #: Children new to the group (a child added again while pending counts once).
    joined: int = 0
    #: (type, id) of children not scheduled: another group's child; counted as cancelled here.
    refused: List[Tuple[str, str]] = field(default_factory=list)


@dataclass
class Sealed:
    """What :meth:`~hourglass_client.Hourglass.group_seal` did."""

    state: SealState
    #: When it completed at once (``state`` is ``completed``): what completing did.
    fired: Optional[Fired] = None


@dataclass
class GroupView:
    """A workflow group as it is now (``hourglass group show``)."""

    callback_type: str
    group: str
    state: GroupState
    callback_id: str
    #: ``all`` or ``success``.
    when: str
    added: int
    pending: int
    succeeded: int
    dead: int
    cancelled: int
    opened_ms: int
    completed_ms: Optional[int] = None
    #: What completing did, once done.
    fired: Optional[Fired] = None


class GraphState(_StrEnum):
    """Where a workflow graph is (:attr:`GraphView.state`)."""

    RUNNING = "running"
    DONE = "done"


class NodeState(_StrEnum):
    """Where a graph's node is (:attr:`NodeView.state`)."""

    #: Waits for parents.
    WAITING = "waiting"
    #: Its task was scheduled (it may be running); not ended yet.
    SCHEDULED = "scheduled"
    SUCCEEDED = "succeeded"
    DEAD = "dead"
    CANCELLED = "cancelled"
    #: Never ran: it needs all its parents to succeed and one did not (see :attr:`NodeView.reason`).
    SKIPPED = "skipped"


@dataclass
class Node:
    """A node of a workflow graph to declare (:meth:`~hourglass_client.Hourglass.graph_submit`): a task
    that runs once its parents (names of other nodes) have ended as ``when`` says."""

    #: Its name in the graph, which its children's ``parents`` use: 1 to 200 bytes of text.
    name: str
    task_type: str
    #: The task id (text); default ``<graph id>/<name>``.
    id: Optional[str] = None
    #: Text (UTF-8) as it is; anything else JSON-able is written as its JSON text.
    payload: Payload = None
    #: ``all``: run once every parent ended, however; ``success``: only if all succeeded, else skipped.
    when: When = "all"
    parents: Sequence[str] = ()


@dataclass
class Declared:
    """What :meth:`~hourglass_client.Hourglass.graph_submit` declared."""

    nodes: int
    edges: int
    #: Nodes without parents, scheduled at once.
    roots: int


@dataclass
class GraphCancelled:
    """What :meth:`~hourglass_client.Hourglass.graph_cancel` did."""

    #: The graph was done already: nothing changed.
    was_done: bool = False
    #: Waiting nodes skipped, with the reason "graph cancelled".
    skipped: int = 0
    #: Scheduled nodes whose tasks were removed before they ran.
    removed: int = 0
    #: Scheduled nodes running: their hosts were asked to stop them.
    stopping: int = 0
    #: Scheduled nodes that had ended already (they count as they ended).
    ended: int = 0


@dataclass
class NodeView:
    """A graph's node as it is now."""

    name: str
    task_type: str
    id: str
    #: ``all`` or ``success``.
    when: str
    state: NodeState
    parents: List[str]
    #: Parents it still waits for (while waiting).
    waiting_for: int = 0
    #: Why it was skipped: ``parent <name> dead|cancelled|skipped``.
    reason: Optional[str] = None


@dataclass
class GraphView:
    """A workflow graph as it is now (``hourglass graph show``)."""

    home_type: str
    graph: str
    state: GraphState
    edges: int
    #: Nodes by state (every :class:`NodeState` word).
    counts: Dict[str, int]
    opened_ms: Optional[int]
    completed_ms: Optional[int]
    #: Every node, in the order declared.
    nodes: List[NodeView]
    #: When it was cancelled, if it was.
    cancelled_ms: Optional[int] = None


@dataclass
class Ended:
    """How a task ended (:meth:`~hourglass_client.Hourglass.wait`), from its type's events stream."""

    outcome: Outcome
    #: The attempt that ended (1 = the first); 0 when nothing ran (cancelled while it waited).
    attempt: int
    #: The error text of a dead task's last attempt.
    error: Optional[str] = None
    #: When its handler finished, ms since the epoch; None when that is not known.
    finished_ms: Optional[int] = None


@dataclass
class NewTask:
    """One task for :meth:`~hourglass_client.Hourglass.schedule_many`: the arguments of
    :meth:`~hourglass_client.Hourglass.schedule`, but no ``traceparent`` (not supported in bulk)."""

    task_type: str
    id: Id
    payload: Payload = None
    at: Optional[datetime] = None
    at_ms: Optional[int] = None
    delay: Optional[timedelta] = None
    delay_ms: Optional[int] = None
    mode: Mode = "upsert"


#: What :meth:`~hourglass_client.Hourglass.schedule_many` takes: a :class:`NewTask`, or a mapping
#: with the same keys (``{"task_type": "mail", "id": "m-1", "delay_ms": 60_000}``).
NewTaskLike = Union[NewTask, Mapping[str, Any]]
