"""What the blocking and the asyncio client share: the key names, the routing, and each call's body
as a generator of the Redis steps it needs (it is sent their replies), so that one body serves both."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from importlib import resources
from typing import Any, Dict, Generator, Iterable, Iterator, List, Mapping, NamedTuple, Optional, Tuple, TypeVar, Union

from . import _args
from ._args import Id, Mode, Payload, When
from .errors import DataFault, InvalidArgument, ReplicationTimeout
from .results import (
    Added,
    Cancelled,
    CancelState,
    Child,
    Fired,
    GroupState,
    GroupView,
    Lease,
    Progress,
    Sealed,
    SealState,
    Stats,
    TaskState,
    TaskView,
)
from .shards import shard_of, shard_tags

T = TypeVar("T")

#: Children per script call, as the host sends them (its CHILDREN_PER_CALL).
CHILDREN_PER_CALL = 128
SCRIPTS: Tuple[str, ...] = ("schedule", "schedule_batch", "reschedule", "cancel", "show", "pause", "resume", "stats")
SCRIPTS += ("group_join", "group_child", "group_end", "graph_open", "graph_cancel")


class Script(NamedTuple):
    """A step that runs one of the scripts (by name) with its keys and arguments."""

    name: str
    keys: List[str]
    args: List[Any]


class Cmd(NamedTuple):
    """A step that sends one plain command: a redis-py method name, its arguments and keyword arguments."""

    method: str
    args: Tuple[Any, ...]
    kwargs: Optional[Dict[str, Any]] = None


class Batch(NamedTuple):
    """A step that sends scripts and commands in one pipeline (one round trip); its reply is one item
    per call, in order: the call's reply, or the error it raised (typed, as a call would raise it)."""

    calls: List[Union[Script, Cmd]]


class Stream(NamedTuple):
    """A step that sends batches of script calls one after another on one connection, several in flight
    (each batch is packed when its turn comes, while Redis runs the ones before it), then ``then`` (a
    ``WAIT``) on that connection. It sends no batch after the first error reply (NOSCRIPT aside: those
    calls are sent again once the script is loaded). Its reply: ``(replies, then_reply)``, one list per
    batch sent, each one item per call as a :class:`Batch`'s reply; ``then_reply`` is None when ``then``
    was not sent (no ``then``, or an error before it)."""

    batches: Iterator[List[Script]]
    then: Optional[Cmd] = None


Step = Union[Script, Cmd, Batch, Stream]
Steps = Generator[Step, Any, T]


def load(name: str) -> str:
    return resources.files(__package__).joinpath("scripts").joinpath(f"{name}.lua").read_text(encoding="utf-8")


def text(v: Any) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def to_int(v: Any) -> Optional[int]:
    """A score or number from a reply (``b"1767600000000"``), as an int; None stays None."""
    if v is None:
        return None
    return int(float(v))


def _decodes_responses(client: Any) -> bool:
    """Whether a redis-py client (plain or cluster, blocking or asyncio) turns replies into str."""
    pool = getattr(client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None)
    if kwargs is None and hasattr(client, "get_connection_kwargs"):
        kwargs = client.get_connection_kwargs()
    return bool((kwargs or {}).get("decode_responses"))


def _socket_timeout(client: Any) -> Optional[float]:
    pool = getattr(client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None)
    if kwargs is None and hasattr(client, "get_connection_kwargs"):
        kwargs = client.get_connection_kwargs()
    value = (kwargs or {}).get("socket_timeout")
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


#: How long ``replicas=N`` waits for the replicas by default (ms).
REPLICAS_TIMEOUT_MS = 1000


def check_replicas(acked: Any, wait: Cmd) -> None:
    """Raises :class:`ReplicationTimeout` when ``WAIT`` (``wait``) counted fewer replicas than it asked for."""
    wanted, ms = int(wait.args[1]), int(wait.args[2])
    if int(acked) < wanted:
        raise ReplicationTimeout(
            f"written on the master, but {int(acked)} of {wanted} replicas acknowledged it within {ms} ms "
            "(WAIT): it may be lost if the master fails now",
            acked=int(acked),
            wanted=wanted,
        )


class Core:
    """The state both clients share, and every call's steps (``_<call>_steps``)."""

    def __init__(self, client: Any, *, prefix: str = "hourglass", shards: Optional[Mapping[str, int]] = None):
        if _decodes_responses(client):
            raise InvalidArgument(
                "this redis client decodes replies to str (decode_responses=True), but task ids and payloads "
                "are bytes: give Hourglass a client made without decode_responses (it can share the pool's URL)"
            )
        if (
            not isinstance(prefix, str)
            or not 1 <= len(prefix.encode()) <= 64
            or any(c.isspace() or c in "{}*?[]\\" for c in prefix)
        ):
            raise InvalidArgument(
                f"invalid key prefix {prefix!r}: the hosts' [redis] prefix, 1 to 64 characters, "
                "no whitespace, braces or * ? [ ] \\"
            )
        self.redis: Any = client
        self.prefix = prefix
        self._shards: Dict[str, Tuple[str, ...]] = {}
        for name, n in (shards or {}).items():
            if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 256:
                raise InvalidArgument(f"shards of {name!r} must be 1 to 256 (got {n!r})")
            if n > 1:
                self._shards[_args.task_type(name)] = shard_tags(name, n)
        prelude = load("prelude")
        self._scripts = {n: client.register_script(prelude + load(n)) for n in SCRIPTS}
        #: Packed heads of script calls, for batches on a plain Redis (_wire.py).
        self._heads: Dict[Tuple[str, Tuple[str, ...]], Tuple[int, bytes]] = {}
        #: The longest single block of a blocking read (ms), below the connection's socket timeout.
        timeout = _socket_timeout(client)
        self._block_ms = 1000 if timeout is None else max(10, min(1000, int(timeout * 500)))

    def _is_cluster(self) -> bool:
        import redis
        import redis.asyncio

        return isinstance(self.redis, (redis.RedisCluster, redis.asyncio.RedisCluster))

    # -- keys and shards -------------------------------------------------

    def key(self, queue: str, suffix: str) -> str:
        """The name of key ``suffix`` of type (or shard) ``queue``: ``hourglass:{T}:due``."""
        return f"{self.prefix}:{{{queue}}}:{suffix}"

    def shard_for(self, t: str, task_id: Id) -> str:
        """The shard (its hash tag) that holds ``task_id`` of type ``t``; ``t`` itself when unsharded."""
        tags = self._shards.get(_args.task_type(t))
        return tags[shard_of(_args.task_id(task_id), len(tags))] if tags else t

    def _shards_of(self, t: str) -> Tuple[str, ...]:
        return self._shards.get(t, (t,))

    def _lookup_order(self, t: str, raw: bytes) -> List[str]:
        # Its own shard, the other shards, then the tags of the layout before
        # shard tags spread (T#1..T#N-1) that the hosts drain: as the host looks.
        own = self.shard_for(t, raw)
        current = self._shards_of(t)
        return [own] + [s for s in current if s != own] + [
            f"{t}#{k}" for k in range(1, len(current)) if f"{t}#{k}" not in current
        ]

    # -- tasks ------------------------------------------------------------

    def _schedule_steps(
        self,
        t: str,
        task_id: Id,
        at: Optional[datetime],
        at_ms: Optional[int],
        delay: Optional[timedelta],
        delay_ms: Optional[int],
        payload: Payload,
        mode: Mode,
        traceparent: Optional[str],
        replicas: Optional[int] = None,
        replicas_timeout_ms: Optional[int] = None,
    ) -> Steps[bool]:
        how = _args.mode(mode)
        raw, body = _args.task_id(task_id), _args.payload(payload)
        due = _args.due_ms(at=at, at_ms=at_ms, delay=delay, delay_ms=delay_ms)
        if traceparent is not None and not isinstance(traceparent, str):
            raise InvalidArgument(f"traceparent must be a str (W3C), not {type(traceparent).__name__}")
        wait = self._wait_cmd(replicas, replicas_timeout_ms)
        q = self.shard_for(t, raw)
        if traceparent is not None and how == "upsert":
            yield Cmd("hset", (self.key(q, "trace"), raw, traceparent))
        script = Script(
            "schedule", [self.key(q, "due"), self.key(q, "payload")], [raw, due, body, "1" if body else "0", how]
        )
        if wait is None:
            written = yield script
        else:
            # WAIT counts the writes of its own connection: it goes in the same pipeline.
            written, acked = yield Batch([script, wait])
            for reply in (written, acked):
                if isinstance(reply, BaseException):
                    raise reply
            check_replicas(acked, wait)
        if traceparent is not None and how != "upsert" and written == 1:
            yield Cmd("hset", (self.key(q, "trace"), raw, traceparent))
        return bool(written == 1)

    def _wait_cmd(self, replicas: Optional[int], timeout_ms: Optional[int]) -> Optional[Cmd]:
        """The ``WAIT`` that ``replicas=N`` asks for (None without it); refused on a cluster client,
        whose pipeline may send it to another node than the task's slot's master."""
        if replicas is None:
            if timeout_ms is not None:
                raise InvalidArgument("replicas_timeout_ms needs replicas")
            return None
        if isinstance(replicas, bool) or not isinstance(replicas, int) or not 1 <= replicas <= 64:
            raise InvalidArgument(f"replicas must be 1 to 64, not {replicas!r}")
        ms = REPLICAS_TIMEOUT_MS if timeout_ms is None else timeout_ms
        if isinstance(ms, bool) or not isinstance(ms, int) or ms < 1:
            raise InvalidArgument(f"replicas_timeout_ms must be a positive number of ms, not {ms!r}")
        if self._is_cluster():
            raise InvalidArgument(
                "replicas is not supported on a Redis Cluster client: send WAIT on a connection to the task's slot's master"
            )
        return Cmd("execute_command", ("WAIT", replicas, ms))

    def _postpone_steps(self, t: str, task_id: Id, delay: Optional[timedelta], delay_ms: Optional[int]) -> Steps[Optional[int]]:
        ms = _args.span_ms("delay", delay, delay_ms)
        if ms is None:
            raise InvalidArgument("postpone needs delay (a timedelta) or delay_ms")
        return (yield from self._reschedule_steps(t, task_id, ["postpone", ms]))

    def _run_now_steps(self, t: str, task_id: Id) -> Steps[Optional[int]]:
        return (yield from self._reschedule_steps(t, task_id, ["now"]))

    def _reschedule_steps(self, t: str, task_id: Id, how: List[Any]) -> Steps[Optional[int]]:
        raw = _args.task_id(task_id)
        for q in self._lookup_order(_args.task_type(t), raw):
            due = yield Script("reschedule", [self.key(q, "due")], [raw, *how])
            if due:
                return int(due)
        return None

    def _cancel_steps(self, t: str, task_id: Id) -> Steps[Cancelled]:
        raw = _args.task_id(task_id)
        for q in self._lookup_order(_args.task_type(t), raw):
            keys = [self.key(q, s) for s in ("due", "payload", "tokens", "claimed", "cancels", "member")]
            keys += [self.key(q, s) for s in ("outbox", "seq", "held", "progress")]
            reply = yield Script("cancel", keys, [raw, q, f"{self.prefix}:cancel"])
            state = text(reply[0])
            if state == "scheduled":
                yield Cmd("hdel", (self.key(q, "trace"), raw))
                return Cancelled(CancelState.SCHEDULED, group_told=text(reply[1]) == "1")
            if state == "running":
                return Cancelled(CancelState.RUNNING, holder=text(reply[1]))
        return Cancelled(CancelState.UNKNOWN)

    def _show_steps(self, t: str, task_id: Id, payload_bytes: int) -> Steps[TaskView]:
        raw = _args.task_id(task_id)
        if isinstance(payload_bytes, bool) or not isinstance(payload_bytes, int) or payload_bytes < 0:
            raise InvalidArgument(f"payload_bytes must be an int >= 0 (got {payload_bytes!r})")
        order = self._lookup_order(_args.task_type(t), raw)
        view: Optional[TaskView] = None
        for q in order:
            view = yield from self._show_in(q, raw, payload_bytes)
            if view.state != TaskState.UNKNOWN:
                break
        assert view is not None
        if view.state == TaskState.UNKNOWN:
            view.task_type = order[0]
        tags = self._shards.get(t)
        if tags and view.task_type in tags:
            view.shard = tags.index(view.task_type)
        return view

    def _show_in(self, q: str, raw: bytes, most: int) -> Steps[TaskView]:
        suffixes = ("due", "leases", "tokens", "attempts", "errors", "dead", "payload", "claims", "claimed")
        keys = [self.key(q, s) for s in suffixes + ("member", "held", "progress")]
        r = yield Script("show", keys, [raw, most])
        now, due_raw, lease_until, entry, attempts, error, died_raw, size, head, group, reported = r
        running = None
        if lease_until is not None and entry is not None:
            numbers, _, host = text(entry).partition("@")
            token, _, attempt = numbers.partition(":")
            running = Lease(host, int(attempt), int(token), int(float(lease_until)))
        elif lease_until is not None:
            running = Lease("", int(attempts or 0) + 1, 0, int(float(lease_until)))
        due, died = to_int(due_raw), to_int(died_raw)
        if running:
            state = TaskState.RUNNING
        elif due is not None:
            state = TaskState.DUE if due <= int(now) else TaskState.SCHEDULED
        else:
            state = TaskState.DEAD if died is not None else TaskState.UNKNOWN
        group_ref = graph_ref = None
        if group is not None:
            home, _, rest = text(group).partition("\n")
            # A graph's node is marked "\x1f<home>\n<graph>\n<node>", a group's child "<callback type>\n<group>\n<n>".
            if home.startswith("\x1f"):
                graph_ref = f"{home[1:]}/{rest.partition(chr(10))[0]}"
            else:
                group_ref = f"{home}/{rest.partition(chr(10))[0]}"
        return TaskView(
            task_type=q,
            id=raw,
            state=state,
            now_ms=int(now),
            due_ms=due,
            running=running,
            died_ms=died,
            attempts=int(attempts or 0),
            last_error=text(error) if error is not None else None,
            payload_size=int(size or 0),
            payload=bytes(head) if head is not None else None,
            group=group_ref,
            graph=graph_ref,
            progress=_progress(reported),
        )

    # -- types ------------------------------------------------------------

    def _pause_steps(self, t: str, length: Optional[timedelta], length_ms: Optional[int]) -> Steps[Optional[int]]:
        ms = _args.span_ms("length", length, length_ms)
        if ms == 0:
            raise InvalidArgument("a pause's length must be more than 0 ms (leave it out to pause until resumed)")
        ends = None
        for q in self._shards_of(_args.task_type(t)):
            ends = int((yield Script("pause", [self.key(q, "paused"), self.key(q, "due")], [ms or 0])))
        return ends or None

    def _resume_steps(self, t: str) -> Steps[bool]:
        resumed = False
        for q in self._shards_of(_args.task_type(t)):
            resumed |= int((yield Script("resume", [self.key(q, "paused"), self.key(q, "due")], []))) == 1
        return resumed

    def _stats_steps(self, t: str) -> Steps[Stats]:
        total = Stats()
        suffixes: Tuple[str, ...] = ("due", "leases", "dead", "stats", "payload", "tokens", "attempts", "errors", "seq", "outbox")
        suffixes += ("events", "recur", "throttle", "paused", "cancels", "claims", "claimed", "groups", "member", "graphs")
        for q in self._shards_of(_args.task_type(t)):
            r = yield Script("stats", [self.key(q, s) for s in suffixes], [])
            n = [int(v) if v is not None else 0 for v in r[:8]]
            total.due_now += n[0]
            total.scheduled_later += max(0, n[1] - n[0])
            total.in_flight += n[2]
            total.dead += n[3]
            total.succeeded += n[4]
            total.failed += n[5]
            total.retried += n[6]
            total.dead_total += n[7]
            if r[8] is not None and total.fault is None:
                total.fault = text(r[8]) if q == t else f"shard {q}: {text(r[8])}"
            if r[9] is not None and total.paused_ms is None:
                total.paused_ms = int(r[9])
            total.cancelled += int(r[10] or 0)
            total.oldest_due_age_ms = max(total.oldest_due_age_ms, int(r[11] or 0))
            total.groups_open += int(r[12] or 0)
            total.groups_completed += int(r[13] or 0)
            total.groups_failed += int(r[14] or 0)
            total.graphs_running += int(r[15] or 0)
            total.graphs_opened += int(r[16] or 0)
            total.graphs_completed += int(r[17] or 0)
            total.graphs_failed += int(r[18] or 0)
        return total

    # -- workflow groups --------------------------------------------------

    def _group_keys(self, callback_type: str, group: str) -> Tuple[str, str, List[str]]:
        c, g = _args.task_type(callback_type), _args.text_id(group, "group id")
        return c, g, [self.key(c, f"group:{g}"), self.key(c, f"group-pending:{g}")]

    def _group_open_steps(
        self, callback_type: str, group: str, callback_id: Optional[str], payload: str, when: When, replace: bool
    ) -> Steps[bool]:
        c, g, keys = self._group_keys(callback_type, group)
        cb = _args.text_id(callback_id if callback_id is not None else g, "callback id", 1 << 20)
        if when not in ("all", "success"):
            raise InvalidArgument(f"invalid group trigger {when!r}: expected 'all' or 'success'")
        if not isinstance(payload, str):
            raise InvalidArgument(f"a group's callback payload is text, not {type(payload).__name__}")
        r = yield Script(
            "group_join",
            keys + [self.key(c, "groups"), self.key(c, "stats"), self.key(c, "delivered:-")],
            [g, "0", "1", cb, payload, when, "replace" if replace else "create"],
        )
        return int(r[0]) == 1

    def _group_add_steps(self, callback_type: str, group: str, children: Iterable[Child]) -> Steps[Added]:
        c, g, keys = self._group_keys(callback_type, group)
        kids: List[Tuple[str, str, bytes, int]] = []
        now = _args.now_ms()
        for k in children:
            if not isinstance(k, Child):
                raise InvalidArgument(f"a group's child is a Child(task_type, id, ...), not {type(k).__name__}")
            due = now if k.due_ms is None else _args.due_ms(at_ms=k.due_ms)
            kids.append((_args.task_type(k.task_type), _args.text_id(k.id, "child id", 1 << 20), _args.payload(k.payload), due))
        added = Added()
        for start in range(0, len(kids), CHILDREN_PER_CALL):
            batch = kids[start : start + CHILDREN_PER_CALL]
            members = [f"{kt}\n{kid}" for kt, kid, _, _ in batch]
            r = yield Script(
                "group_join",
                keys + [self.key(c, "groups"), self.key(c, "stats"), self.key(c, "delivered:-")],
                [g, "0", "0", "", "", "", "", *members],
            )
            added.joined += max(0, int(r[1]))
            # Each child still pending, with its join number, is scheduled in its own slot.
            by_slot: Dict[str, List[Tuple[str, bytes, int, int]]] = {}
            for (kt, kid, body, due), number in zip(batch, r[2:]):
                if number is None:
                    continue  # added before, and ended since
                by_slot.setdefault(self.shard_for(kt, kid), []).append((kid, body, due, int(number)))
            for q, steps in by_slot.items():
                keys_c = [self.key(q, s) for s in ("due", "payload", "member", "dead", "outbox", "seq")]
                args: List[Any] = [q]
                for kid, body, due, number in steps:
                    keys_c.append(self.key(q, "delivered:-"))
                    args += [kid, due, body, "1" if body else "0", f"{c}\n{g}\n{number}", "replace", "0"]
                for (kid, _, _, _), result in zip(steps, (yield Script("group_child", keys_c, args))):
                    if int(result) == 2:
                        added.refused.append((q.partition("#")[0], kid))
        return added

    def _group_seal_steps(self, callback_type: str, group: str) -> Steps[Sealed]:
        c, g, keys = self._group_keys(callback_type, group)
        keys += [self.key(c, f"group-failed:{g}"), self.key(c, "groups"), self.key(c, "stats")]
        keys += [self.key(c, "due"), self.key(c, "payload"), self.key(c, "dead"), self.key(c, "delivered:-")]
        reply = yield Script("group_end", keys, [g, "0"])
        what, fired = (text(v) for v in reply)
        if what != "sealed":
            return Sealed(SealState.ALREADY)
        return Sealed(SealState.COMPLETED, Fired(fired)) if fired else Sealed(SealState.SEALED)

    def _group_show_steps(self, callback_type: str, group: str) -> Steps[Optional[GroupView]]:
        c, g, keys = self._group_keys(callback_type, group)
        fields = yield Cmd("hgetall", (keys[0],))
        pending = yield Cmd("hlen", (keys[1],))
        if not fields:
            return None
        f = {text(k): text(v) for k, v in fields.items()}

        def num(name: str) -> int:
            return int(f.get(name) or 0)

        fired = f.get("fired")
        return GroupView(
            callback_type=c,
            group=g,
            state=GroupState(f.get("state", "")),
            callback_id=f.get("callback_id", ""),
            when=f.get("when", ""),
            added=num("added"),
            pending=int(pending),
            succeeded=num("succeeded"),
            dead=num("dead"),
            cancelled=num("cancelled"),
            opened_ms=num("opened_ms"),
            completed_ms=int(f["completed_ms"]) if "completed_ms" in f else None,
            fired=Fired(fired) if fired else None,
        )

    # -- keys of other kinds ----------------------------------------------

    def _stream_steps(self, key: str) -> Steps[bool]:
        """Whether ``key`` is a stream (False: no key); a key of another type is a :class:`DataFault`."""
        kind = text((yield Cmd("type", (key,))))
        if kind == "none":
            return False
        if kind != "stream":
            raise DataFault(f"{key} holds a {kind}, not a stream: delete it, and a host that starts recreates it")
        return True


def _progress(stored: Any) -> Optional[Progress]:
    """A stored progress report (``{"percent":P,"detail":D,"attempt":A,"at_ms":T}``); None when absent
    or not such a value (a hand-written one is not shown as progress)."""
    if stored is None:
        return None
    try:
        value = json.loads(stored)
        return Progress(int(value["percent"]), value.get("detail"), int(value["attempt"]), int(value["at_ms"]))
    except (ValueError, TypeError, KeyError):
        return None
