"""The errors a client raises: a refusal is typed, so an application can match on it."""

from __future__ import annotations


class HourglassError(Exception):
    """Every error this client raises on purpose."""


class InvalidTaskType(HourglassError, ValueError):
    """A task type name the host would refuse: ``[a-z0-9][a-z0-9._-]{0,63}``."""


class InvalidId(HourglassError, ValueError):
    """A task id, group id or callback id that cannot be used (empty, too long, control characters)."""


class InvalidArgument(HourglassError, ValueError):
    """Another argument out of its range: a mode, a ``when``, a negative delay, a shard count."""


class DataFault(HourglassError):
    """A key of the type holds data of the wrong kind (``HGFAULT``); the message names the key and the fix.

    Nothing was written: every script checks before its first write.
    """


class GroupRefused(HourglassError):
    """A workflow group step the group's state refuses (``HGGROUP``); nothing was written."""


class NoSuchGroup(GroupRefused):
    """The group was never opened, or was done more than 7 days ago."""


class GroupClosed(GroupRefused):
    """The group is sealed or done: no children can be added."""


class GroupConflict(GroupRefused):
    """Opening a group that is open with another callback, or that already completed."""


def from_reply(err: Exception) -> Exception:
    """The typed error for a script's error reply, or ``err`` itself when it is none of ours."""
    text = str(err)
    # redis-py keeps the reply's first word as part of the message.
    for code, make in (("HGFAULT ", DataFault), ("HGGROUP ", _group_refusal)):
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
