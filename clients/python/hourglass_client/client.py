"""The client: each call is one of the host's own Lua scripts, run in the task's slot."""

from __future__ import annotations

import functools
import json
import re
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from importlib import resources
from typing import Iterable, NamedTuple, Optional, Union

import redis

from .errors import DataFault, InvalidArgument, InvalidId, InvalidTaskType, from_reply
from .shards import shard_of, shard_tags

Id = Union[str, bytes, int]
#: Bytes and text as they are; anything else JSON-able is written as its JSON text.
Payload = Union[str, bytes, int, float, bool, dict, list, None]
When = Union[int, float, datetime, None]
Delay = Union[int, float, timedelta, None]

_TYPE = re.compile(r"[a-z0-9][a-z0-9._-]{0,63}")
_MODES = ("upsert", "if-absent", "only-later", "only-earlier")
_GROUP_ID_MAX = 200
#: Children per script call, as the host sends them (its CHILDREN_PER_CALL).
_CHILDREN_PER_CALL = 256


def _load(name: str) -> str:
    return resources.files(__package__).joinpath("scripts", f"{name}.lua").read_text(encoding="utf-8")


def task_type(name: str) -> str:
    """``name`` when it is a valid task type name, else :class:`InvalidTaskType`."""
    if not isinstance(name, str) or not _TYPE.fullmatch(name):
        raise InvalidTaskType(f"invalid task type {name!r}: allowed: [a-z0-9][a-z0-9._-]{{0,63}}")
    return name


def _id(value: Id, what: str = "task id") -> bytes:
    # An int is its decimal text, as the Node client, the CLI and redis-cli write it
    # (bytes(42) would be 42 NUL bytes); anything else that is not text or bytes is refused.
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


def _text_id(value: str, what: str, most: int = _GROUP_ID_MAX) -> str:
    if not isinstance(value, str) or not value or len(value.encode()) > most:
        raise InvalidId(f"invalid {what} {value!r}: it must be 1 to {most} bytes of text")
    if any(ord(c) < 32 or 127 <= ord(c) < 160 for c in value):
        raise InvalidId(f"invalid {what} {value!r}: it may not contain control characters")
    return value


def _payload(value: Payload) -> bytes:
    """Bytes as they are, text as UTF-8, and any other value as its JSON text (``{"order": 42}``, ``5``)."""
    if value is None:
        return b""
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
    except (TypeError, ValueError) as e:
        raise InvalidArgument(f"payload of type {type(value).__name__} is not bytes, str or JSON-able: {e}") from None


def now_ms() -> int:
    """This machine's clock in ms since the epoch."""
    return time.time_ns() // 1_000_000


def due_ms(at: When = None, delay: Delay = None) -> int:
    """A due time: ``at`` (a datetime, or ms since the epoch), else now plus ``delay`` (a timedelta or seconds)."""
    if at is not None and delay is not None:
        raise InvalidArgument("give a due time 'at' or a 'delay', not both")
    if isinstance(at, datetime):
        if at.tzinfo is None:
            raise InvalidArgument(f"due time {at!r} has no time zone: use an aware datetime")
        return int(at.timestamp() * 1000)
    if at is not None:
        return int(at)
    return now_ms() + _ms(delay or 0)


def _ms(delay: Delay) -> int:
    ms = int(delay.total_seconds() * 1000) if isinstance(delay, timedelta) else int(float(delay or 0) * 1000)
    if ms < 0:
        raise InvalidArgument(f"a delay must not be negative (got {delay!r})")
    return ms


@dataclass
class Cancelled:
    """What :meth:`Hourglass.cancel` did."""

    #: ``scheduled`` (removed), ``running`` (its host was asked to stop it) or ``unknown`` (neither).
    state: str
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
class TaskView:
    """Where one task is and what Redis knows about it, read in one snapshot (``hourglass show``)."""

    #: Its type; of a sharded type, the shard it is in (``hot#3``).
    task_type: str
    id: bytes
    #: ``scheduled``, ``due``, ``running``, ``dead`` or ``unknown``.
    state: str
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
    #: Of a sharded type, the index of its shard.
    shard: Optional[int] = None


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
    """What :meth:`Hourglass.group_add` did."""

    #: Children new to the group (a child added again while pending counts once).
    joined: int = 0
    #: (type, id) of children not scheduled: another group's child; counted as cancelled here.
    refused: list = field(default_factory=list)


@dataclass
class GroupView:
    """A workflow group as it is now (``hourglass group show``)."""

    callback_type: str
    group: str
    #: ``open``, ``sealed`` or ``done``.
    state: str
    callback_id: str
    when: str
    added: int
    pending: int
    succeeded: int
    dead: int
    cancelled: int
    opened_ms: int
    completed_ms: Optional[int] = None
    #: What completing did: ``callback``, ``skipped`` or ``kept``.
    fired: Optional[str] = None


class _Script(NamedTuple):
    """A step that runs one of the scripts (by name) with its keys and arguments."""

    name: str
    keys: list
    args: list


class _Cmd(NamedTuple):
    """A step that sends one plain command (a redis-py method name and its arguments)."""

    method: str
    args: tuple


def _decodes_responses(client) -> bool:
    """Whether a redis-py client (plain or cluster, blocking or asyncio) turns replies into str."""
    pool = getattr(client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None)
    if kwargs is None and hasattr(client, "get_connection_kwargs"):
        kwargs = client.get_connection_kwargs()
    return bool((kwargs or {}).get("decode_responses"))


class _Core:
    """What both clients share: the key names, the routing, and each call as a
    generator that yields the Redis steps it needs and gets their replies, so
    one body serves the blocking client and the asyncio one."""

    def __init__(self, client: "redis.Redis", *, prefix: str = "hourglass", shards: Optional[dict] = None):
        if _decodes_responses(client):
            raise InvalidArgument(
                "this redis client decodes replies to str (decode_responses=True), but task ids and payloads "
                "are bytes: give Hourglass a client made without decode_responses (it can share the pool's URL)"
            )
        self.redis = client
        self.prefix = prefix
        self._shards: dict = {}
        for name, n in (shards or {}).items():
            if not isinstance(n, int) or not 1 <= n <= 256:
                raise InvalidArgument(f"shards of {name!r} must be 1 to 256 (got {n!r})")
            if n > 1:
                self._shards[task_type(name)] = shard_tags(name, n)
        prelude = _load("prelude")
        names = ("schedule", "reschedule", "cancel", "show", "pause", "resume", "stats")
        names += ("group_join", "group_child", "group_end")
        self._scripts = {n: client.register_script(prelude + _load(n)) for n in names}

    # -- keys and shards -------------------------------------------------

    def key(self, queue: str, suffix: str) -> str:
        """The name of key ``suffix`` of type (or shard) ``queue``: ``hourglass:{T}:due``."""
        return f"{self.prefix}:{{{queue}}}:{suffix}"

    def shard_for(self, t: str, task_id: Id) -> str:
        """The shard (its hash tag) that holds ``task_id`` of type ``t``; ``t`` itself when unsharded."""
        tags = self._shards.get(task_type(t))
        return tags[shard_of(_id(task_id), len(tags))] if tags else t

    def _shards_of(self, t: str) -> tuple:
        return self._shards.get(t, (t,))

    def _lookup_order(self, t: str, task_id: bytes) -> list:
        # Its own shard, the other shards, then the tags of the layout before
        # shard tags spread (T#1..T#N-1) that the hosts drain: as the host looks.
        own = self.shard_for(t, task_id)
        current = self._shards_of(t)
        return [own] + [s for s in current if s != own] + [
            f"{t}#{k}" for k in range(1, len(current)) if f"{t}#{k}" not in current
        ]

    # -- tasks ------------------------------------------------------------

    def schedule(
        self,
        t: str,
        task_id: Id,
        *,
        at: When = None,
        delay: Delay = None,
        payload: Payload = None,
        mode: str = "upsert",
        traceparent: Optional[str] = None,
    ) -> bool:
        """Schedules task ``task_id`` of type ``t`` at ``at`` (or after ``delay``; default now).

        ``mode``: ``upsert`` (the last schedule wins), ``if-absent`` (dedupe:
        keep the first), ``only-later`` (debounce: only postpone) or
        ``only-earlier``. The payload is written only with the due time.
        ``traceparent`` (W3C) makes the run's span continue the caller's trace.
        Returns whether the due time was written.
        """
        if mode not in _MODES:
            raise InvalidArgument(f"invalid mode {mode!r}: expected one of {', '.join(_MODES)}")
        raw, body, due = _id(task_id), _payload(payload), due_ms(at, delay)
        q = self.shard_for(t, raw)
        if traceparent is not None and mode == "upsert":
            yield _Cmd("hset", (self.key(q, "trace"), raw, traceparent))
        written = (yield _Script(
            "schedule",
            [self.key(q, "due"), self.key(q, "payload")],
            [raw, due, body, "1" if body else "0", mode],
        ))
        if traceparent is not None and mode != "upsert" and written == 1:
            yield _Cmd("hset", (self.key(q, "trace"), raw, traceparent))
        return written == 1

    def postpone(self, t: str, task_id: Id, delay: Delay) -> Optional[int]:
        """Moves a scheduled task ``delay`` later than the later of its due time and now.

        Returns its new due time (ms), or None when it is not scheduled
        (running, dead or gone: nothing is written).
        """
        return (yield from self._reschedule(t, task_id, ["postpone", _ms(delay)]))

    def run_now(self, t: str, task_id: Id) -> Optional[int]:
        """Makes a scheduled task due now; None when it is not scheduled."""
        return (yield from self._reschedule(t, task_id, ["now"]))

    def _reschedule(self, t: str, task_id: Id, how: list) -> Optional[int]:
        raw = _id(task_id)
        for q in self._lookup_order(task_type(t), raw):
            due = (yield _Script("reschedule", [self.key(q, "due")], [raw, *how]))
            if due:
                return int(due)
        return None

    def cancel(self, t: str, task_id: Id) -> Cancelled:
        """Cancels a task: removed when scheduled; when running, its host is asked to stop it
        (it is settled as cancelled, never retried). A group's child tells its group."""
        raw = _id(task_id)
        for q in self._lookup_order(task_type(t), raw):
            keys = [self.key(q, s) for s in ("due", "payload", "tokens", "claimed", "cancels", "member")]
            keys += [self.key(q, s) for s in ("outbox", "seq", "held")]
            reply = (yield _Script("cancel", keys, [raw, q, f"{self.prefix}:cancel"]))
            state = _text(reply[0])
            if state == "scheduled":
                yield _Cmd("hdel", (self.key(q, "trace"), raw))
                return Cancelled("scheduled", group_told=_text(reply[1]) == "1")
            if state == "running":
                return Cancelled("running", holder=_text(reply[1]))
        return Cancelled("unknown")

    def show(self, t: str, task_id: Id, *, payload_bytes: int = 65536) -> TaskView:
        """Where task ``task_id`` is and what Redis holds about it (state ``unknown`` when nowhere)."""
        raw = _id(task_id)
        order = self._lookup_order(task_type(t), raw)
        view = None
        for q in order:
            view = yield from self._show_in(q, raw, payload_bytes)
            if view.state != "unknown":
                break
        if view.state == "unknown":
            view.task_type = order[0]
        tags = self._shards.get(t)
        if tags and view.task_type in tags:
            view.shard = tags.index(view.task_type)
        return view

    def _show_in(self, q: str, raw: bytes, most: int) -> TaskView:
        suffixes = ("due", "leases", "tokens", "attempts", "errors", "dead", "payload", "claims", "claimed")
        keys = [self.key(q, s) for s in suffixes + ("member", "held")]
        r = (yield _Script("show", keys, [raw, max(0, int(most))]))
        now, due, lease_until, entry, attempts, error, died, size, head, group = r
        running = None
        if lease_until is not None and entry is not None:
            numbers, _, host = _text(entry).partition("@")
            token, _, attempt = numbers.partition(":")
            running = Lease(host, int(attempt), int(token), _int(lease_until))
        elif lease_until is not None:
            running = Lease("", int(attempts or 0) + 1, 0, _int(lease_until))
        due, died = _int(due), _int(died)
        if running:
            state = "running"
        elif due is not None:
            state = "due" if due <= int(now) else "scheduled"
        else:
            state = "dead" if died is not None else "unknown"
        if group is not None:
            callback_type, _, rest = _text(group).partition("\n")
            group = f"{callback_type}/{rest.partition(chr(10))[0]}"
        return TaskView(
            task_type=q,
            id=raw,
            state=state,
            now_ms=int(now),
            due_ms=due,
            running=running,
            died_ms=died,
            attempts=int(attempts or 0),
            last_error=_text(error) if error is not None else None,
            payload_size=int(size or 0),
            payload=head if head is not None else None,
            group=group,
        )

    # -- types ------------------------------------------------------------

    def pause(self, t: str, *, length: Delay = None) -> Optional[int]:
        """Pauses type ``t`` (every shard) on every host, for ``length`` or until resumed.

        Returns when the pause ends (ms, Redis's clock), or None for "until resumed".
        """
        ms = _ms(length)
        ends = None
        for q in self._shards_of(task_type(t)):
            ends = int((yield _Script("pause", [self.key(q, "paused"), self.key(q, "due")], [ms])))
        return ends or None

    def resume(self, t: str) -> bool:
        """Lets hosts claim a paused type again (every shard); False when it was not paused."""
        resumed = False
        for q in self._shards_of(task_type(t)):
            resumed |= int((yield _Script("resume", [self.key(q, "paused"), self.key(q, "due")], []))) == 1
        return resumed

    def stats(self, t: str) -> Stats:
        """Queue sizes and counters of type ``t``, summed over its shards."""
        total = Stats()
        suffixes = ("due", "leases", "dead", "stats", "payload", "tokens", "attempts", "errors", "seq", "outbox")
        suffixes += ("events", "recur", "throttle", "paused", "cancels", "claims", "claimed", "groups", "member")
        for q in self._shards_of(task_type(t)):
            r = (yield _Script("stats", [self.key(q, s) for s in suffixes], []))
            n = [int(v) if v is not None else 0 for v in r[:8]]
            total.due_now += n[0]
            total.scheduled_later += max(0, n[1] - n[0])
            for name, v in zip(("in_flight", "dead", "succeeded", "failed", "retried", "dead_total"), n[2:]):
                setattr(total, name, getattr(total, name) + v)
            if r[8] is not None and total.fault is None:
                total.fault = _text(r[8]) if q == t else f"shard {q}: {_text(r[8])}"
            if r[9] is not None and total.paused_ms is None:
                total.paused_ms = int(r[9])
            total.cancelled += int(r[10] or 0)
            total.oldest_due_age_ms = max(total.oldest_due_age_ms, int(r[11] or 0))
            total.groups_open += int(r[12] or 0)
            total.groups_completed += int(r[13] or 0)
            total.groups_failed += int(r[14] or 0)
        return total

    # -- workflow groups --------------------------------------------------

    def _group_keys(self, callback_type: str, group: str) -> tuple:
        c, g = task_type(callback_type), _text_id(group, "group id")
        return c, g, [self.key(c, f"group:{g}"), self.key(c, f"group-pending:{g}")]

    def group_open(
        self,
        callback_type: str,
        group: str,
        *,
        callback_id: Optional[str] = None,
        payload: str = "",
        when: str = "all",
        replace: bool = True,
    ) -> bool:
        """Opens a group whose callback (``callback_type``/``callback_id``, default the group id)
        is scheduled once the group is sealed and every child has ended.

        ``when``: ``all`` (however the children ended) or ``success`` (only if
        all succeeded: a chain). ``replace=False`` keeps a callback task with
        that id that is waiting or dead. Opening it again with the same
        callback changes nothing; returns whether this call created it.
        """
        c, g, keys = self._group_keys(callback_type, group)
        cb = _text_id(callback_id if callback_id is not None else g, "callback id", 1 << 20)
        if when not in ("all", "success"):
            raise InvalidArgument(f"invalid group trigger {when!r}: expected 'all' or 'success'")
        r = (yield _Script(
            "group_join",
            keys + [self.key(c, "groups"), self.key(c, "stats"), self.key(c, "delivered:-")],
            [g, "0", "1", cb, payload, when, "replace" if replace else "create"],
        ))
        return int(r[0]) == 1

    def group_add(self, callback_type: str, group: str, children: Iterable[Child]) -> Added:
        """Adds children to open group ``group`` and schedules them (a waiting task with the
        same id is re-scheduled, as :meth:`schedule` does). Raises :class:`GroupClosed` when
        the group is sealed or done, :class:`NoSuchGroup` when it was never opened.
        """
        c, g, keys = self._group_keys(callback_type, group)
        kids = [(task_type(k.task_type), _text_id(k.id, "child id", 1 << 20), k) for k in children]
        added = Added()
        for start in range(0, len(kids), _CHILDREN_PER_CALL):
            batch = kids[start : start + _CHILDREN_PER_CALL]
            members = [f"{kt}\n{kid}" for kt, kid, _ in batch]
            r = (yield _Script(
                "group_join",
                keys + [self.key(c, "groups"), self.key(c, "stats"), self.key(c, "delivered:-")],
                [g, "0", "0", "", "", "", "", *members],
            ))
            added.joined += max(0, int(r[1]))
            # Each child still pending, with its join number, is scheduled in its own slot.
            by_slot: dict = {}
            for (kt, kid, k), number in zip(batch, r[2:]):
                if number is None:
                    continue  # added before, and ended since
                by_slot.setdefault(self.shard_for(kt, kid), []).append((kid, k, int(number)))
            for q, steps in by_slot.items():
                keys_c = [self.key(q, s) for s in ("due", "payload", "member", "dead", "outbox", "seq")]
                args = [q]
                for kid, k, number in steps:
                    body = _payload(k.payload)
                    keys_c.append(self.key(q, "delivered:-"))
                    args += [kid, k.due_ms if k.due_ms is not None else now_ms(), body, "1" if body else "0"]
                    args += [f"{c}\n{g}\n{number}", "replace", "0"]
                for (kid, _, _), result in zip(steps, (yield _Script("group_child", keys_c, args))):
                    if int(result) == 2:
                        added.refused.append((q.partition("#")[0], kid))
        return added

    def group_seal(self, callback_type: str, group: str) -> str:
        """Seals a group: no more children; it completes once none is pending.

        Returns ``sealed`` (it waits for children), ``completed:<fired>`` (nothing
        was pending: completed now; fired is ``callback``, ``skipped`` or
        ``kept``) or ``already`` (sealed or done before).
        """
        c, g, keys = self._group_keys(callback_type, group)
        keys += [self.key(c, f"group-failed:{g}"), self.key(c, "groups"), self.key(c, "stats")]
        keys += [self.key(c, "due"), self.key(c, "payload"), self.key(c, "dead"), self.key(c, "delivered:-")]
        reply = yield _Script("group_end", keys, [g, "0"])
        what, fired = (_text(v) for v in reply)
        if what != "sealed":
            return "already"
        return f"completed:{fired}" if fired else "sealed"

    def group_show(self, callback_type: str, group: str) -> Optional[GroupView]:
        """The group as it is now, or None (never opened, or done more than 7 days ago)."""
        c, g, keys = self._group_keys(callback_type, group)
        fields = yield _Cmd("hgetall", (keys[0],))
        pending = yield _Cmd("hlen", (keys[1],))
        if not fields:
            return None
        f = {_text(k): _text(v) for k, v in fields.items()}
        num = lambda name: int(f.get(name) or 0)  # noqa: E731
        return GroupView(
            callback_type=c,
            group=g,
            state=f.get("state", ""),
            callback_id=f.get("callback_id", ""),
            when=f.get("when", ""),
            added=num("added"),
            pending=int(pending),
            succeeded=num("succeeded"),
            dead=num("dead"),
            cancelled=num("cancelled"),
            opened_ms=num("opened_ms"),
            completed_ms=int(f["completed_ms"]) if "completed_ms" in f else None,
            fired=f.get("fired"),
        )


_CALLS = ("schedule", "postpone", "run_now", "cancel", "show", "pause", "resume", "stats")
_CALLS += ("group_open", "group_add", "group_seal", "group_show")


def _blocking(call):
    @functools.wraps(call)
    def method(self, *args, **kwargs):
        steps = call(self, *args, **kwargs)
        reply = None
        try:
            while True:
                reply = self._step(steps.send(reply))
        except StopIteration as done:
            return done.value

    return method


def _awaiting(call):
    @functools.wraps(call)
    async def method(self, *args, **kwargs):
        steps = call(self, *args, **kwargs)
        reply = None
        try:
            while True:
                reply = await self._step(steps.send(reply))
        except StopIteration as done:
            return done.value

    return method


class Hourglass(_Core):
    """Schedules and inspects Hourglass tasks through the host's own scripts.

    ``client`` is a ``redis.Redis`` or ``redis.RedisCluster``; ``prefix`` is the
    hosts' ``[redis] prefix``; ``shards`` maps each sharded type to its
    ``[types.T] shards`` (the same N the hosts run with).
    """

    def _step(self, step):
        try:
            if isinstance(step, _Script):
                return self._scripts[step.name](keys=step.keys, args=step.args)
            return getattr(self.redis, step.method)(*step.args)
        except redis.ResponseError as e:
            raise from_reply(e) from None


class AsyncHourglass(_Core):
    """:class:`Hourglass` for asyncio: the same calls, awaited, on a
    ``redis.asyncio.Redis`` or ``redis.asyncio.RedisCluster``."""

    async def _step(self, step):
        try:
            if isinstance(step, _Script):
                return await self._scripts[step.name](keys=step.keys, args=step.args)
            return await getattr(self.redis, step.method)(*step.args)
        except redis.ResponseError as e:
            raise from_reply(e) from None


for _name in _CALLS:
    setattr(Hourglass, _name, _blocking(getattr(_Core, _name)))
    setattr(AsyncHourglass, _name, _awaiting(getattr(_Core, _name)))


def _text(v) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def _int(v) -> Optional[int]:
    """A score or number from a reply (``b"1767600000000"``), as an int; None stays None."""
    if v is None:
        return None
    return int(float(v))


__all__ = ["Hourglass", "AsyncHourglass", "Child", "Added", "Cancelled", "GroupView", "Lease", "Stats", "TaskView"]
__all__ += ["DataFault", "due_ms", "now_ms", "task_type"]
