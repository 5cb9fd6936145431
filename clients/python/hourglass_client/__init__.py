"""Hourglass from Python: schedule (one by one or in bulk), wait for, postpone, cancel and inspect delayed
tasks, pause types and build workflow groups, each step one of the host's own Lua scripts (see README.md).
Every time is in milliseconds (``*_ms``), or a ``datetime`` / ``timedelta`` under the name without ``_ms``."""

from ._args import Id, Mode, Payload, When, due_ms, now_ms, task_type
from .client import AsyncHourglass, Hourglass
from .errors import (
    DataFault,
    GroupClosed,
    GroupConflict,
    GroupRefused,
    HourglassError,
    InvalidArgument,
    InvalidId,
    InvalidTaskType,
    NoEvents,
    NoSuchGroup,
    UnknownTask,
    WaitTimeout,
)
from .results import (
    Added,
    Cancelled,
    CancelState,
    Child,
    Ended,
    Fired,
    GroupState,
    GroupView,
    Lease,
    NewTask,
    NewTaskLike,
    Outcome,
    Progress,
    Sealed,
    SealState,
    Stats,
    TaskState,
    TaskView,
)
from .shards import shard_of, shard_tags

#: The one place the version is written (pyproject.toml reads it from here).
__version__ = "0.2.0"

__all__ = [
    "Added",
    "AsyncHourglass",
    "CancelState",
    "Cancelled",
    "Child",
    "DataFault",
    "Ended",
    "Fired",
    "GroupClosed",
    "GroupConflict",
    "GroupRefused",
    "GroupState",
    "GroupView",
    "Hourglass",
    "HourglassError",
    "Id",
    "InvalidArgument",
    "InvalidId",
    "InvalidTaskType",
    "Lease",
    "Mode",
    "NewTask",
    "NewTaskLike",
    "NoEvents",
    "NoSuchGroup",
    "Outcome",
    "Payload",
    "Progress",
    "SealState",
    "Sealed",
    "Stats",
    "TaskState",
    "TaskView",
    "UnknownTask",
    "WaitTimeout",
    "When",
    "due_ms",
    "now_ms",
    "shard_of",
    "shard_tags",
    "task_type",
]
