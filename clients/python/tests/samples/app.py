"""A small application that uses every public call of both clients, as a user would write it.
tests/test_typing.py checks it with `mypy --strict` and runs it against a test redis-server."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import List, Optional

import redis
import redis.asyncio

import hourglass_client as hg
from hourglass_client import (
    AsyncHourglass,
    Child,
    Ended,
    Hourglass,
    NewTask,
    Outcome,
    Sealed,
    SealState,
    TaskState,
)


def describe(ended: Ended) -> str:
    if ended.outcome is Outcome.DEAD:
        return f"dead after {ended.attempt} attempts: {ended.error or '?'}"
    return f"{ended.outcome.value} at {ended.finished_ms}"


def main(r: redis.Redis) -> List[str]:
    out: List[str] = []
    client = Hourglass(r, prefix="hourglass", shards={"device.offline": 3})
    written: bool = client.schedule(
        "order.timeout", "o-42", delay=timedelta(minutes=15), payload={"order": 42}, mode="if-absent"
    )
    client.schedule("article.publish", b"a-981", at=datetime(2031, 1, 1, tzinfo=timezone.utc))
    client.schedule("device.offline", 7, delay_ms=30_000, mode="only-later", traceparent="00-" + "a" * 32 + "-" + "b" * 16 + "-01")
    many: List[bool] = client.schedule_many(
        [NewTask("order.timeout", f"o-{i}", payload=b"{}", at_ms=hg.now_ms() + 60_000) for i in range(10)]
        + [{"task_type": "device.offline", "id": "d-9", "delay": timedelta(seconds=30)}]
    )
    out.append(f"{written} {many.count(True)}")
    moved: Optional[int] = client.postpone("order.timeout", "o-42", timedelta(minutes=10))
    moved = client.postpone("order.timeout", "o-42", delay_ms=600_000)
    now: Optional[int] = client.run_now("order.timeout", "o-42")
    view = client.show("order.timeout", "o-42", payload_bytes=100)
    if view.state == TaskState.DUE and view.payload is not None and moved and now:
        out.append(f"{view.state} {view.payload.decode()}")
    cancelled = client.cancel("order.timeout", "o-42")
    out.append(f"{cancelled.state} {cancelled.holder!r} {cancelled.group_told}")
    ends: Optional[int] = client.pause("order.timeout", length=timedelta(minutes=5))
    client.pause("order.timeout", length_ms=300_000)
    resumed: bool = client.resume("order.timeout")
    stats = client.stats("order.timeout")
    out.append(f"{ends is not None} {resumed} {stats.scheduled_later} {stats.paused_ms}")
    r.xadd("hourglass:{order.timeout}:events", {"id": "o-1", "outcome": "succeeded", "attempt": 1, "finished_ms": 5})
    client.cancel("order.timeout", "o-1")
    out.append(describe(client.wait("order.timeout", "o-1", timeout=timedelta(seconds=5))))
    try:
        client.wait("order.timeout", "o-2", timeout_ms=50)
    except hg.WaitTimeout:
        out.append("o-2 still waits")
    try:
        client.wait("article.publish", "a-981")
    except hg.NoEvents as e:
        out.append(e.code)
    opened: bool = client.group_open("order.ship", "o-17", payload='{"order":"o-17"}', when="success", replace=False)
    added = client.group_add("order.ship", "o-17", [Child("order.charge", "o-17", payload={"amount": 4200})])
    sealed: Sealed = client.group_seal("order.ship", "o-17")
    group = client.group_show("order.ship", "o-17")
    if group is not None and sealed.state is SealState.SEALED:
        out.append(f"{opened} {added.joined} {added.refused} {group.state} {group.pending} {group.fired}")
    try:
        client.group_add("order.ship", "o-17", [Child("order.mail", "o-17")])
    except hg.GroupClosed as e:
        out.append(type(e).__name__)
    out.append(f"{client.shard_for('device.offline', 7)} {client.key('order.timeout', 'due')} {hg.__version__}")
    return out


async def amain(r: redis.asyncio.Redis) -> List[str]:
    client = AsyncHourglass(r, shards={"device.offline": 3})
    out: List[str] = []
    await client.schedule("order.timeout", "a-1", delay_ms=60_000)
    out.append(str(await client.schedule_many([NewTask("order.timeout", "a-2", delay=timedelta(minutes=1))])))
    await client.postpone("order.timeout", "a-1", delay_ms=1_000)
    await client.run_now("order.timeout", "a-1")
    state: TaskState = (await client.show("order.timeout", "a-1")).state
    out.append(f"{state} {(await client.cancel('order.timeout', 'a-1')).state}")
    await client.pause("order.timeout", length_ms=1_000)
    await client.resume("order.timeout")
    out.append(str((await client.stats("order.timeout")).scheduled_later))
    try:
        await client.wait("order.timeout", "a-2", timeout=timedelta(milliseconds=50))
    except hg.WaitTimeout:
        out.append("a-2 still waits")
    await client.group_open("order.ship", "a-17")
    await client.group_add("order.ship", "a-17", [Child("order.charge", "a-17")])
    sealed = await client.group_seal("order.ship", "a-17")
    view = await client.group_show("order.ship", "a-17")
    out.append(f"{sealed.state} {view.state if view else None}")
    return out
