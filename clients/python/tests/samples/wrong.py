"""What mypy --strict must refuse (tests/test_typing.py counts an error on each line marked WRONG)."""

from __future__ import annotations

from datetime import timedelta

import redis
import redis.asyncio

from hourglass_client import AsyncHourglass, Hourglass, NewTask

client = Hourglass(redis.Redis())
client.schedule("t", "id", delay=30)  # WRONG: a number is not a timedelta (it once meant seconds)
client.schedule("t", "id", at=1893456000000)  # WRONG: at takes a datetime; ms go in at_ms
client.schedule("t", "id", mode="sometimes")  # WRONG: not a mode
client.schedule("t", 4.2)  # WRONG: not an id
client.postpone("t", "id", 60)  # WRONG: seconds, or ms?
client.pause("t", length=300)  # WRONG: not a timedelta
sealed: str = client.group_seal("g", "id")  # WRONG: a Sealed, not a string to parse
client.group_open("g", "id", when="sometimes")  # WRONG: all or success
client.wait("t", "id", timeout=5)  # WRONG: not a timedelta
client.schedule_many([NewTask("t", "id", delay_ms=timedelta(seconds=1))])  # WRONG: delay_ms is a number
moved: int = client.postpone("t", "id", delay_ms=5)  # WRONG: None when not scheduled
aclient = AsyncHourglass(redis.asyncio.Redis())
state: str = aclient.show("t", "id").state  # WRONG: a coroutine: await it
