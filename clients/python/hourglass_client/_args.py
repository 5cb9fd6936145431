"""Arguments checked before anything is sent: type names, ids, payloads, and times (all in milliseconds)."""

from __future__ import annotations

import json
import math
import re
import time
from datetime import datetime, timedelta, timezone
from typing import Any, Dict, List, Literal, Optional, Tuple, Union

from .errors import InvalidArgument, InvalidId, InvalidTaskType

#: A task id: text (UTF-8), bytes as they are, or an int, written as its decimal text (``42`` is ``b"42"``).
Id = Union[str, bytes, bytearray, memoryview, int]
#: Bytes and text as they are; anything else JSON-able is written as its JSON text.
Payload = Union[str, bytes, bytearray, memoryview, int, float, bool, Dict[str, Any], List[Any], Tuple[Any, ...], None]
#: How :meth:`~hourglass_client.Hourglass.schedule` treats a task that is already scheduled.
Mode = Literal["upsert", "if-absent", "only-later", "only-earlier"]
#: When a group's callback fires: once all its children ended, or only if all succeeded.
When = Literal["all", "success"]

MODES: Tuple[str, ...] = ("upsert", "if-absent", "only-later", "only-earlier")
GROUP_ID_MAX = 200
_TYPE = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MS = timedelta(milliseconds=1)


def task_type(name: str) -> str:
    """``name`` when it is a valid task type name, else :class:`InvalidTaskType`."""
    if not isinstance(name, str) or not _TYPE.fullmatch(name):
        raise InvalidTaskType(f"invalid task type {name!r}: allowed: [a-z0-9][a-z0-9._-]{{0,63}}")
    return name


def task_id(value: Id, what: str = "task id") -> bytes:
    """The bytes of a task id. An int is its decimal text, as the Node client, the CLI and
    redis-cli write it (``bytes(42)`` would be 42 NUL bytes); anything else that is not
    text or bytes is refused."""
    if isinstance(value, str):
        raw = value.encode()
    elif isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
    elif isinstance(value, int) and not isinstance(value, bool):
        raw = str(value).encode()
    else:
        raise InvalidId(f"invalid {what} {value!r}: give a str, bytes or an int, not {type(value).__name__}")
    if not raw:
        raise InvalidId(f"invalid {what}: it is empty")
    return raw


def text_id(value: str, what: str, most: int = GROUP_ID_MAX) -> str:
    """A group id, callback id or child id: 1 to ``most`` bytes of text without control characters."""
    if not isinstance(value, str) or not value or len(value.encode()) > most:
        raise InvalidId(f"invalid {what} {value!r}: it must be 1 to {most} bytes of text")
    if any(ord(c) < 32 or 127 <= ord(c) < 160 for c in value):
        raise InvalidId(f"invalid {what} {value!r}: it may not contain control characters")
    return value


def payload(value: Payload) -> bytes:
    """Bytes as they are, text as UTF-8, and any other value as its JSON text (``{"order": 42}``, ``5``)."""
    if value is None:
        return b""
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    lost = _unfaithful(value, "payload", set())
    if lost:
        raise InvalidArgument(f"{lost}: JSON would not keep it; pass dicts with str keys, lists, str, numbers, bytes")
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
    except (TypeError, ValueError) as e:
        raise InvalidArgument(f"payload of type {type(value).__name__} is not bytes, str or JSON-able: {e}") from None


def _unfaithful(value: object, path: str, inside: "set[int]") -> Optional[str]:
    """Where ``value`` holds what ``json.dumps`` would change without an error, as ``<path> is <what>``:
    a tuple (read back as a list) or a dict key that is not a str (read back as text); None when JSON
    keeps it all. What ``json.dumps`` refuses (a set, an object, NaN, a cycle) is left to it."""
    if isinstance(value, tuple):
        return f"{path} is a tuple"
    if not isinstance(value, (list, dict)) or id(value) in inside:
        return None
    inside.add(id(value))
    try:
        if isinstance(value, list):
            for i, item in enumerate(value):
                lost = _unfaithful(item, f"{path}[{i}]", inside)
                if lost:
                    return lost
        else:
            for key, item in value.items():
                if not isinstance(key, str):
                    return f"{path} has a key {key!r} of type {type(key).__name__}, not str"
                lost = _unfaithful(item, f"{path}[{key!r}]", inside)
                if lost:
                    return lost
        return None
    finally:
        inside.discard(id(value))


def mode(value: str) -> str:
    if value not in MODES:
        raise InvalidArgument(f"invalid mode {value!r}: expected one of {', '.join(MODES)}")
    return value


def now_ms() -> int:
    """This machine's clock in ms since the epoch."""
    return time.time_ns() // 1_000_000


def _number_ms(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArgument(f"{name} takes a number of milliseconds, not {type(value).__name__} ({value!r})")
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidArgument(f"{name} must be a finite number of milliseconds (got {value!r})")
    ms = int(value)
    if ms < 0:
        raise InvalidArgument(f"{name} must not be negative (got {value!r})")
    return ms


def span_ms(name: str, span: Optional[timedelta], ms: Optional[float]) -> Optional[int]:
    """A length of time given as ``name`` (a timedelta) or ``name_ms`` (milliseconds), in ms; None when neither.

    A number given as ``name`` is refused: it once meant seconds, and reading it as
    milliseconds would be the worst kind of surprise.
    """
    if span is not None and ms is not None:
        raise InvalidArgument(f"give {name} or {name}_ms, not both")
    if ms is not None:
        return _number_ms(f"{name}_ms", ms)
    if span is None:
        return None
    if not isinstance(span, timedelta):
        raise InvalidArgument(f"{name} takes a timedelta; give a number of milliseconds as {name}_ms=")
    if span < timedelta(0):
        raise InvalidArgument(f"{name} must not be negative (got {span!r})")
    return span // _MS


def datetime_ms(at: datetime) -> int:
    """An aware datetime in ms since the epoch (exact: no float rounding)."""
    if not isinstance(at, datetime):
        raise InvalidArgument("at takes an aware datetime; give ms since the epoch as at_ms=")
    if at.tzinfo is None or at.tzinfo.utcoffset(at) is None:
        raise InvalidArgument(f"due time {at!r} has no time zone: use an aware datetime")
    return (at - _EPOCH) // _MS


def due_ms(
    *,
    at: Optional[datetime] = None,
    at_ms: Optional[float] = None,
    delay: Optional[timedelta] = None,
    delay_ms: Optional[float] = None,
    now: Optional[int] = None,
) -> int:
    """A due time in ms since the epoch: ``at`` (an aware datetime) or ``at_ms``, else ``now``
    (default: this machine's clock) plus ``delay`` (a timedelta) or ``delay_ms``; none of them: now."""
    if at is not None and at_ms is not None:
        raise InvalidArgument("give at or at_ms, not both")
    later = span_ms("delay", delay, delay_ms)
    if (at is not None or at_ms is not None) and later is not None:
        raise InvalidArgument("give a due time (at or at_ms) or a delay (delay or delay_ms), not both")
    if at is not None:
        return datetime_ms(at)
    if at_ms is not None:
        return _number_ms("at_ms", at_ms)
    return (now_ms() if now is None else now) + (later or 0)
