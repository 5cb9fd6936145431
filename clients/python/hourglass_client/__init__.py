"""Hourglass from Python: schedule, postpone, cancel and inspect delayed tasks, pause types and build
workflow groups, each step one of the host's own Lua scripts (see README.md)."""

from .client import (
    Added,
    AsyncHourglass,
    Cancelled,
    Child,
    GroupView,
    Hourglass,
    Lease,
    Stats,
    TaskView,
    due_ms,
    now_ms,
    task_type,
)
from .errors import (
    DataFault,
    GroupClosed,
    GroupConflict,
    GroupRefused,
    HourglassError,
    InvalidArgument,
    InvalidId,
    InvalidTaskType,
    NoSuchGroup,
)
from .shards import shard_of, shard_tags

__version__ = "0.1.0"

__all__ = [
    "Added",
    "AsyncHourglass",
    "Cancelled",
    "Child",
    "DataFault",
    "GroupClosed",
    "GroupConflict",
    "GroupRefused",
    "GroupView",
    "Hourglass",
    "HourglassError",
    "InvalidArgument",
    "InvalidId",
    "InvalidTaskType",
    "Lease",
    "NoSuchGroup",
    "Stats",
    "TaskView",
    "due_ms",
    "now_ms",
    "shard_of",
    "shard_tags",
    "task_type",
]
