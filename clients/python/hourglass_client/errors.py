"""The errors a client raises: a refusal is typed, so an application can match on it."""

from __future__ import annotations


class HourglassError(Exception):
    """Every error this client raises on purpose.

    ``code`` is a stable name for the kind of error, the same as the Node client's ``code``.
    """

    code: str = "HG_ERROR"


class InvalidTaskType(HourglassError, ValueError):
    """A task type name the host would refuse: ``[a-z0-9][a-z0-9._-]{0,63}``."""

    code = "HG_INVALID_TASK_TYPE"


class InvalidId(HourglassError, ValueError):
    """A task id, group id or callback id that cannot be used (empty, too long, control characters)."""

    code = "HG_INVALID_ID"


class InvalidArgument(HourglassError, ValueError):
    """Another argument out of its range: a mode, a ``when``, a negative delay, a shard count."""

    code = "HG_INVALID_ARGUMENT"


class DataFault(HourglassError):
    """A key of the type holds data of the wrong kind (``HGFAULT``); the message names the key and the fix.

    Nothing was written: every script checks before its first write.
    """

    code = "HG_DATA_FAULT"


class GroupRefused(HourglassError):
    """A workflow group step the group's state refuses (``HGGROUP``); nothing was written."""

    code = "HG_GROUP_REFUSED"


class NoSuchGroup(GroupRefused):
    """The group was never opened, or was done more than 7 days ago."""

    code = "HG_NO_SUCH_GROUP"


class GroupClosed(GroupRefused):
    """The group is sealed or done: no children can be added."""

    code = "HG_GROUP_CLOSED"


class GroupConflict(GroupRefused):
    """Opening a group that is open with another callback, or that already completed."""

    code = "HG_GROUP_CONFLICT"


class GraphRefused(HourglassError):
    """A workflow graph refused whole (``HGGRAPH``, or an id check before it): a cycle, an unknown
    parent, a name or task used twice, a task in use, a graph id used before. Nothing was written."""

    code = "HG_GRAPH_REFUSED"


class NoEvents(HourglassError):
    """:meth:`~hourglass_client.Hourglass.wait` on a type that has no events stream (``events = true`` is not set for it)."""

    code = "HG_NO_EVENTS"


class WaitTimeout(HourglassError, TimeoutError):
    """:meth:`~hourglass_client.Hourglass.wait` reached its timeout before the task ended."""

    code = "HG_WAIT_TIMEOUT"


class UnknownTask(HourglassError, LookupError):
    """:meth:`~hourglass_client.Hourglass.wait` on a task that is not there and has no ending in the events stream."""

    code = "HG_UNKNOWN_TASK"


class ReplicationTimeout(HourglassError, TimeoutError):
    """``replicas=N``: the write is on the master, but fewer than N replicas acknowledged it in time
    (Redis ``WAIT``). It may be lost if the master fails now; scheduling it again is harmless."""

    code = "HG_REPLICATION_TIMEOUT"

    def __init__(self, message: str, *, acked: int = 0, wanted: int = 0) -> None:
        super().__init__(message)
        self.acked = acked
        self.wanted = wanted


def from_reply(err: Exception) -> Exception:
    """The typed error for a script's error reply, or ``err`` itself when it is none of ours."""
    text = str(err)
    # redis-py keeps the reply's first word as part of the message.
    for code, make in (("HGFAULT ", DataFault), ("HGGROUP ", _group_refusal), ("HGGRAPH ", GraphRefused)):
        at = text.find(code)
        if at >= 0:
            return make(text[at + len(code):].strip())
    return err


def _group_refusal(text: str) -> GroupRefused:
    if text.startswith("no group"):
        return NoSuchGroup(text)
    if "no children can be added" in text:
        return GroupClosed(text)
    return GroupConflict(text)
