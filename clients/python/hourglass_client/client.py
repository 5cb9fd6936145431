"""The clients: :class:`Hourglass` (blocking) and :class:`AsyncHourglass` (asyncio). Each call is one of
the host's own Lua scripts, run in the task's slot; its body is written once (``Core._<call>_steps``)
and each client drives it, so both clients always do the same."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Iterable, List, Mapping, Optional, Tuple, TypeVar, Union

import redis
import redis.asyncio

from . import _args, _wire
from ._args import Id, Mode, Payload, When
from ._bulk import schedule_many_steps
from ._core import Batch, Cmd, Script, Steps, Stream
from ._graphs import GraphSteps
from ._wait import wait_steps
from .errors import InvalidArgument, from_reply
from .results import Added, Cancelled, Child, Declared, Ended, GraphCancelled, GraphView, GroupView, NewTaskLike, Node, Sealed, Stats, TaskView

T = TypeVar("T")
_ASYNC_CLIENTS = (redis.asyncio.Redis, redis.asyncio.RedisCluster)


class Hourglass(GraphSteps):
    """Schedules, waits for and inspects Hourglass tasks through the host's own scripts.

    ``client`` is a ``redis.Redis`` or ``redis.RedisCluster`` (made without ``decode_responses``);
    ``prefix`` is the hosts' ``[redis] prefix``; ``shards`` maps each sharded type to its
    ``[types.T] shards`` (the same N the hosts run with). Every time is in milliseconds
    (``*_ms``), or a ``datetime`` / ``timedelta`` under the name without ``_ms``.
    """

    def __init__(
        self,
        client: Union[redis.Redis, redis.RedisCluster],
        *,
        prefix: str = "hourglass",
        shards: Optional[Mapping[str, int]] = None,
    ) -> None:
        if isinstance(client, _ASYNC_CLIENTS):
            raise InvalidArgument("Hourglass takes a blocking redis.Redis: give a redis.asyncio client to AsyncHourglass")
        super().__init__(client, prefix=prefix, shards=shards)

    def schedule(
        self,
        t: str,
        task_id: Id,
        *,
        at: Optional[datetime] = None,
        at_ms: Optional[int] = None,
        delay: Optional[timedelta] = None,
        delay_ms: Optional[int] = None,
        payload: Payload = None,
        mode: Mode = "upsert",
        traceparent: Optional[str] = None,
        replicas: Optional[int] = None,
        replicas_timeout_ms: Optional[int] = None,
    ) -> bool:
        """Schedules task ``task_id`` of type ``t`` at ``at`` (an aware datetime) or ``at_ms`` (ms since
        the epoch), or after ``delay`` (a timedelta) or ``delay_ms``; with none of them, now.

        ``mode``: ``upsert`` (the last schedule wins), ``if-absent`` (dedupe: keep the first),
        ``only-later`` (debounce: only postpone) or ``only-earlier``. The payload is written only
        with the due time. ``traceparent`` (W3C) makes the run's span continue the caller's trace.
        ``replicas=N``: a durable schedule, that survives the master's loss: Redis ``WAIT N`` follows
        the write (``replicas_timeout_ms``, default 1000), and :class:`ReplicationTimeout` says when
        fewer replicas acknowledged it in time. Returns whether the due time was written.
        """
        steps = self._schedule_steps(
            t, task_id, at, at_ms, delay, delay_ms, payload, mode, traceparent, replicas, replicas_timeout_ms
        )
        return self._drive(steps)

    def schedule_many(
        self, tasks: Iterable[NewTaskLike], *, replicas: Optional[int] = None, replicas_timeout_ms: Optional[int] = None
    ) -> List[bool]:
        """Schedules many tasks (:class:`NewTask`, or dicts with its fields), 1000 to a batch, each
        routed to its shard and written as :meth:`schedule` would; returns, in their order, whether each
        due time was written. Each batch is one ``schedule_batch`` script call per type (or shard)
        and 200 tasks, as the host sends them; on a plain Redis the batches go on one connection, up
        to 4 in flight (in order: a later task sees an earlier one's write), on a cluster one
        pipeline per batch.

        Every task is checked before anything is sent (a bad one: :class:`InvalidArgument` naming its
        index). Each script call is atomic (its tasks in order), not the whole call; an error from
        Redis (a :class:`DataFault`) names the first task of its call, which wrote nothing, and no
        batch is sent after it (those already in flight run: the error says up to which task was
        sent). ``delay`` counts from the call.
        No ``traceparent`` in bulk: use :meth:`schedule` for a task that carries one. ``replicas=N``:
        one ``WAIT N`` after the last batch, on its connection (it counts every batch), as for
        :meth:`schedule`.
        """
        return self._drive(schedule_many_steps(self, tasks, replicas, replicas_timeout_ms))

    def postpone(
        self, t: str, task_id: Id, delay: Optional[timedelta] = None, *, delay_ms: Optional[int] = None
    ) -> Optional[int]:
        """Moves a scheduled task ``delay`` (or ``delay_ms``) later than the later of its due time and now.

        Returns its new due time (ms), or None when it is not scheduled (running, dead or gone:
        nothing is written).
        """
        return self._drive(self._postpone_steps(t, task_id, delay, delay_ms))

    def run_now(self, t: str, task_id: Id) -> Optional[int]:
        """Makes a scheduled task due now (returns that, ms); None when it is not scheduled."""
        return self._drive(self._run_now_steps(t, task_id))

    def cancel(self, t: str, task_id: Id) -> Cancelled:
        """Cancels a task: removed when scheduled; when running, its host is asked to stop it
        (it is settled as cancelled, never retried). A group's child tells its group."""
        return self._drive(self._cancel_steps(t, task_id))

    def show(self, t: str, task_id: Id, *, payload_bytes: int = 65536) -> TaskView:
        """Where task ``task_id`` is and what Redis holds about it (state ``unknown`` when nowhere)."""
        return self._drive(self._show_steps(t, task_id, payload_bytes))

    def wait(
        self, t: str, task_id: Id, *, timeout: Optional[timedelta] = None, timeout_ms: Optional[int] = None
    ) -> Ended:
        """Waits until task ``task_id`` of type ``t`` ends and returns how: ``succeeded``, ``dead`` (with
        its last error) or ``cancelled``, read from the type's events stream (``events = true``).

        A task that ended before is found in the stream; a group's callback can be waited for
        before its group completes (``wait(callback_type, callback_id)``). Raises
        :class:`NoEvents` (the type has no events stream), :class:`UnknownTask` (neither there nor
        in the stream) or :class:`WaitTimeout` after ``timeout`` / ``timeout_ms`` (default: forever).
        """
        return self._drive(wait_steps(self, t, task_id, _args.span_ms("timeout", timeout, timeout_ms)))

    def pause(self, t: str, *, length: Optional[timedelta] = None, length_ms: Optional[int] = None) -> Optional[int]:
        """Pauses type ``t`` (every shard) on every host, for ``length`` (or ``length_ms``) or until resumed.

        Returns when the pause ends (ms, Redis's clock), or None for "until resumed".
        """
        return self._drive(self._pause_steps(t, length, length_ms))

    def resume(self, t: str) -> bool:
        """Lets hosts claim a paused type again (every shard); False when it was not paused."""
        return self._drive(self._resume_steps(t))

    def stats(self, t: str) -> Stats:
        """Queue sizes and counters of type ``t``, summed over its shards."""
        return self._drive(self._stats_steps(t))

    def group_open(
        self,
        callback_type: str,
        group: str,
        *,
        callback_id: Optional[str] = None,
        payload: str = "",
        when: When = "all",
        replace: bool = True,
    ) -> bool:
        """Opens a group whose callback (``callback_type``/``callback_id``, default the group id)
        is scheduled once the group is sealed and every child has ended.

        ``when``: ``all`` (however the children ended) or ``success`` (only if all succeeded: a
        chain). ``replace=False`` keeps a callback task with that id that is waiting or dead.
        Opening it again with the same callback changes nothing; returns whether this call created it.
        """
        return self._drive(self._group_open_steps(callback_type, group, callback_id, payload, when, replace))

    def group_add(self, callback_type: str, group: str, children: Iterable[Child]) -> Added:
        """Adds children to open group ``group`` and schedules them (a waiting task with the same id
        is re-scheduled, as :meth:`schedule` does). Raises :class:`GroupClosed` when the group is
        sealed or done, :class:`NoSuchGroup` when it was never opened."""
        return self._drive(self._group_add_steps(callback_type, group, children))

    def group_seal(self, callback_type: str, group: str) -> Sealed:
        """Seals a group: no more children; it completes once none is pending.

        Returns ``Sealed(SealState.SEALED)`` (it waits for children), ``Sealed(SealState.COMPLETED,
        fired)`` (nothing was pending: completed now) or ``Sealed(SealState.ALREADY)``.
        """
        return self._drive(self._group_seal_steps(callback_type, group))

    def group_show(self, callback_type: str, group: str) -> Optional[GroupView]:
        """The group as it is now, or None (never opened, or done more than 7 days ago)."""
        return self._drive(self._group_show_steps(callback_type, group))

    def graph_submit(self, home_type: str, graph: str, nodes: Iterable[Node]) -> Declared:
        """Declares workflow graph ``graph`` in ``home_type`` (a host must serve it) and schedules its roots:
        each node runs once its parents have ended as its ``when`` says. Refused whole, nothing written
        (:class:`GraphRefused`, naming the culprit), for a cycle, an unknown parent, a name or task used
        twice, a task already waiting, dead or another workflow's, or a graph id used before."""
        return self._drive(self._graph_submit_steps(home_type, graph, nodes))

    def graph_show(self, home_type: str, graph: str) -> Optional[GraphView]:
        """The graph as it is now, or None (never declared, or done more than 7 days ago)."""
        return self._drive(self._graph_show_steps(home_type, graph))

    def graph_cancel(self, home_type: str, graph: str) -> Optional[GraphCancelled]:
        """Cancels a graph: every node still waiting is skipped at once ("graph cancelled"), and each
        node scheduled is cancelled as :meth:`cancel` does (removed, or stopped by its host); the graph
        is done once those ends come back. None when there is no such graph."""
        return self._drive(self._graph_cancel_steps(home_type, graph))

    # -- the driver ---------------------------------------------------------

    def _drive(self, steps: Steps[T]) -> T:
        reply: Any = None
        try:
            while True:
                reply = self._run(steps.send(reply))
        except StopIteration as done:
            result: T = done.value
            return result

    def _run(self, step: Any) -> Any:
        try:
            if isinstance(step, Script):
                return self._scripts[step.name](keys=step.keys, args=step.args)
            if isinstance(step, Cmd):
                return getattr(self.redis, step.method)(*step.args, **(step.kwargs or {}))
        except redis.ResponseError as e:
            raise from_reply(e) from None
        if isinstance(step, Stream):
            return self._stream(step)
        return self._batch(step)

    def _stream(self, step: Stream) -> Tuple[List[List[Any]], Any]:
        if isinstance(self.redis, redis.Redis):
            replies, then = _wire.stream(self.redis, step.batches, self._scripts, self._heads, step.then)
            return [[_typed(r) for r in batch] for batch in replies], _typed(then)
        # A cluster client: a pipeline per batch, one after the other (each node gets its own part).
        assert step.then is None, "WAIT is refused on a cluster client (Core._wait_cmd)"
        out: List[List[Any]] = []
        for calls in step.batches:
            out.append(self._batch(Batch(list(calls))))
            if any(isinstance(r, BaseException) for r in out[-1]):
                break
        return out, None

    def _batch(self, step: Batch) -> List[Any]:
        replies: List[Any] = [None] * len(step.calls)
        todo = list(range(len(step.calls)))
        scripts_only = all(isinstance(call, Script) for call in step.calls)
        for last_try in (False, True):
            if scripts_only and isinstance(self.redis, redis.Redis):
                out = _wire.run(self.redis, [_script(step.calls[i]) for i in todo], self._scripts, self._heads)
            else:
                pipe = self.redis.pipeline(transaction=False)
                for i in todo:
                    _queue(pipe, self._scripts, step.calls[i])
                out = pipe.execute(raise_on_error=False)
            missing = _sort_replies(step, todo, out, replies, last_try)
            if not missing:
                break
            for name in {_name(step.calls[i]) for i in missing}:
                self.redis.script_load(self._scripts[name].script)
            todo = missing + _waits(step)
        return replies


class AsyncHourglass(GraphSteps):
    """:class:`Hourglass` for asyncio: the same calls, awaited, on a ``redis.asyncio.Redis`` or
    ``redis.asyncio.RedisCluster``."""

    def __init__(
        self,
        client: Union[redis.asyncio.Redis, redis.asyncio.RedisCluster],
        *,
        prefix: str = "hourglass",
        shards: Optional[Mapping[str, int]] = None,
    ) -> None:
        if not isinstance(client, _ASYNC_CLIENTS):
            raise InvalidArgument("AsyncHourglass takes a redis.asyncio client: give a blocking redis.Redis to Hourglass")
        super().__init__(client, prefix=prefix, shards=shards)

    async def schedule(
        self,
        t: str,
        task_id: Id,
        *,
        at: Optional[datetime] = None,
        at_ms: Optional[int] = None,
        delay: Optional[timedelta] = None,
        delay_ms: Optional[int] = None,
        payload: Payload = None,
        mode: Mode = "upsert",
        traceparent: Optional[str] = None,
        replicas: Optional[int] = None,
        replicas_timeout_ms: Optional[int] = None,
    ) -> bool:
        """:meth:`Hourglass.schedule`, awaited."""
        return await self._drive(
            self._schedule_steps(
                t, task_id, at, at_ms, delay, delay_ms, payload, mode, traceparent, replicas, replicas_timeout_ms
            )
        )

    async def schedule_many(
        self, tasks: Iterable[NewTaskLike], *, replicas: Optional[int] = None, replicas_timeout_ms: Optional[int] = None
    ) -> List[bool]:
        """:meth:`Hourglass.schedule_many`, awaited."""
        return await self._drive(schedule_many_steps(self, tasks, replicas, replicas_timeout_ms))

    async def postpone(
        self, t: str, task_id: Id, delay: Optional[timedelta] = None, *, delay_ms: Optional[int] = None
    ) -> Optional[int]:
        """:meth:`Hourglass.postpone`, awaited."""
        return await self._drive(self._postpone_steps(t, task_id, delay, delay_ms))

    async def run_now(self, t: str, task_id: Id) -> Optional[int]:
        """:meth:`Hourglass.run_now`, awaited."""
        return await self._drive(self._run_now_steps(t, task_id))

    async def cancel(self, t: str, task_id: Id) -> Cancelled:
        """:meth:`Hourglass.cancel`, awaited."""
        return await self._drive(self._cancel_steps(t, task_id))

    async def show(self, t: str, task_id: Id, *, payload_bytes: int = 65536) -> TaskView:
        """:meth:`Hourglass.show`, awaited."""
        return await self._drive(self._show_steps(t, task_id, payload_bytes))

    async def wait(
        self, t: str, task_id: Id, *, timeout: Optional[timedelta] = None, timeout_ms: Optional[int] = None
    ) -> Ended:
        """:meth:`Hourglass.wait`, awaited (it blocks no other task of the event loop)."""
        return await self._drive(wait_steps(self, t, task_id, _args.span_ms("timeout", timeout, timeout_ms)))

    async def pause(
        self, t: str, *, length: Optional[timedelta] = None, length_ms: Optional[int] = None
    ) -> Optional[int]:
        """:meth:`Hourglass.pause`, awaited."""
        return await self._drive(self._pause_steps(t, length, length_ms))

    async def resume(self, t: str) -> bool:
        """:meth:`Hourglass.resume`, awaited."""
        return await self._drive(self._resume_steps(t))

    async def stats(self, t: str) -> Stats:
        """:meth:`Hourglass.stats`, awaited."""
        return await self._drive(self._stats_steps(t))

    async def group_open(
        self,
        callback_type: str,
        group: str,
        *,
        callback_id: Optional[str] = None,
        payload: str = "",
        when: When = "all",
        replace: bool = True,
    ) -> bool:
        """:meth:`Hourglass.group_open`, awaited."""
        return await self._drive(self._group_open_steps(callback_type, group, callback_id, payload, when, replace))

    async def group_add(self, callback_type: str, group: str, children: Iterable[Child]) -> Added:
        """:meth:`Hourglass.group_add`, awaited."""
        return await self._drive(self._group_add_steps(callback_type, group, children))

    async def group_seal(self, callback_type: str, group: str) -> Sealed:
        """:meth:`Hourglass.group_seal`, awaited."""
        return await self._drive(self._group_seal_steps(callback_type, group))

    async def group_show(self, callback_type: str, group: str) -> Optional[GroupView]:
        """:meth:`Hourglass.group_show`, awaited."""
        return await self._drive(self._group_show_steps(callback_type, group))

    async def graph_submit(self, home_type: str, graph: str, nodes: Iterable[Node]) -> Declared:
        """:meth:`Hourglass.graph_submit`, awaited."""
        return await self._drive(self._graph_submit_steps(home_type, graph, nodes))

    async def graph_show(self, home_type: str, graph: str) -> Optional[GraphView]:
        """:meth:`Hourglass.graph_show`, awaited."""
        return await self._drive(self._graph_show_steps(home_type, graph))

    async def graph_cancel(self, home_type: str, graph: str) -> Optional[GraphCancelled]:
        """:meth:`Hourglass.graph_cancel`, awaited."""
        return await self._drive(self._graph_cancel_steps(home_type, graph))

    # -- the driver ---------------------------------------------------------

    async def _drive(self, steps: Steps[T]) -> T:
        reply: Any = None
        try:
            while True:
                reply = await self._run(steps.send(reply))
        except StopIteration as done:
            result: T = done.value
            return result

    async def _run(self, step: Any) -> Any:
        try:
            if isinstance(step, Script):
                return await self._scripts[step.name](keys=step.keys, args=step.args)
            if isinstance(step, Cmd):
                return await getattr(self.redis, step.method)(*step.args, **(step.kwargs or {}))
        except redis.ResponseError as e:
            raise from_reply(e) from None
        if isinstance(step, Stream):
            return await self._stream(step)
        return await self._batch(step)

    async def _stream(self, step: Stream) -> Tuple[List[List[Any]], Any]:
        if isinstance(self.redis, redis.asyncio.Redis):
            replies, then = await _wire.stream_async(self.redis, step.batches, self._scripts, self._heads, step.then)
            return [[_typed(r) for r in batch] for batch in replies], _typed(then)
        assert step.then is None, "WAIT is refused on a cluster client (Core._wait_cmd)"
        out: List[List[Any]] = []
        for calls in step.batches:
            out.append(await self._batch(Batch(list(calls))))
            if any(isinstance(r, BaseException) for r in out[-1]):
                break
        return out, None

    async def _batch(self, step: Batch) -> List[Any]:
        replies: List[Any] = [None] * len(step.calls)
        todo = list(range(len(step.calls)))
        scripts_only = all(isinstance(call, Script) for call in step.calls)
        for last_try in (False, True):
            if scripts_only and isinstance(self.redis, redis.asyncio.Redis):
                calls = [_script(step.calls[i]) for i in todo]
                out = await _wire.run_async(self.redis, calls, self._scripts, self._heads)
            else:
                pipe = self.redis.pipeline(transaction=False)
                for i in todo:
                    _queue(pipe, self._scripts, step.calls[i])
                out = await pipe.execute(raise_on_error=False)
            missing = _sort_replies(step, todo, out, replies, last_try)
            if not missing:
                break
            for name in {_name(step.calls[i]) for i in missing}:
                await self.redis.script_load(self._scripts[name].script)
            todo = missing + _waits(step)
        return replies


def _queue(pipe: Any, scripts: Any, call: Union[Script, Cmd]) -> None:
    """Adds one step to a pipeline: a script by its SHA (loaded when Redis says NOSCRIPT), or a command."""
    if isinstance(call, Script):
        pipe.execute_command("EVALSHA", scripts[call.name].sha, len(call.keys), *call.keys, *call.args)
    else:
        getattr(pipe, call.method)(*call.args, **(call.kwargs or {}))


def _sort_replies(step: Batch, todo: List[int], out: List[Any], replies: List[Any], last_try: bool) -> List[int]:
    """Puts each reply in its place (errors typed); returns the places whose script Redis did not have."""
    missing = []
    for i, reply in zip(todo, out):
        if isinstance(reply, redis.exceptions.NoScriptError) and not last_try:
            missing.append(i)
        elif isinstance(reply, redis.ResponseError):
            replies[i] = from_reply(reply)
        else:
            replies[i] = reply
    return missing


def _typed(reply: Any) -> Any:
    """A reply, an error reply as its typed error."""
    return from_reply(reply) if isinstance(reply, redis.ResponseError) else reply


def _waits(step: Batch) -> List[int]:
    """The places of a batch's ``WAIT``: sent again after scripts retried, so that it counts them too."""
    return [i for i, c in enumerate(step.calls) if isinstance(c, Cmd) and c.args[:1] == ("WAIT",)]


def _name(call: Union[Script, Cmd]) -> str:
    return call.name if isinstance(call, Script) else call.method


def _script(call: Union[Script, Cmd]) -> Script:
    assert isinstance(call, Script)
    return call
