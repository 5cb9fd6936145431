"""wait: the reading logic, against events this test writes itself with XADD, as a host's settle does
(the end-to-end case, with a host running the task, is in tests/host/workflows/clients.rs)."""

from __future__ import annotations

import asyncio
import threading
import time
import unittest
from datetime import timedelta

import redis
import redis.asyncio
from support import ServerTest

import hourglass_client as hg
from hourglass_client import Ended, Hourglass, Outcome

EVENTS = "hourglass:{job}:events"


def event(r: redis.Redis, task_id: str, outcome: str, attempt: int = 1, key: str = EVENTS, **more: object) -> bytes:
    fields = {"id": task_id, "outcome": outcome, "attempt": attempt, "due_ms": 1, "started_ms": 2, "finished_ms": 3}
    fields.update(more)
    return r.xadd(key, fields)


def later(seconds: float, then) -> threading.Thread:
    """Runs ``then()`` in a thread after ``seconds``."""
    thread = threading.Thread(target=lambda: (time.sleep(seconds), then()))
    thread.start()
    return thread


class WaitTest(ServerTest):
    def setUp(self):
        super().setUp()
        # A short socket timeout makes each blocking read short (half of it), so re-checks come quickly.
        self.hg = Hourglass(redis.Redis(unix_socket_path=self.server.socket, socket_timeout=0.4), shards={"hot": 3})
        event(self.r, "other", "succeeded")  # the stream exists, as a host with events = true leaves it

    def test_it_returns_the_ending_that_follows_skipping_other_tasks_and_retries(self):
        self.hg.schedule("job", "j-1", delay_ms=60_000)
        # An ending of an earlier run, before the wait: not this run's.
        event(self.r, "j-1", "dead", 3, error="old")

        def settle():
            event(self.r, "someone", "succeeded")
            event(self.r, "j-1", "retried", 1, error="flaky", retry_at_ms=5)
            event(self.r, "j-1", "rescheduled", 1)
            event(self.r, "j-1", "succeeded", 2, finished_ms=1767600000000)

        thread = later(0.3, settle)
        started = time.monotonic()
        ended = self.hg.wait("job", "j-1", timeout=timedelta(seconds=10))
        thread.join()
        self.assertEqual(ended, Ended(Outcome.SUCCEEDED, 2, None, 1767600000000))
        self.assertLess(time.monotonic() - started, 5)
        # A dead ending carries its error; a cancel of a running task is an ending too.
        self.hg.schedule("job", "j-2")
        thread = later(0.2, lambda: event(self.r, "j-2", "dead", 5, error="gateway said no"))
        self.assertEqual(self.hg.wait("job", "j-2"), Ended(Outcome.DEAD, 5, "gateway said no", 3))
        thread.join()
        self.hg.schedule("job", "j-3")
        thread = later(0.2, lambda: event(self.r, "j-3", "cancelled", 1))
        self.assertIs(self.hg.wait("job", "j-3", timeout_ms=10_000).outcome, Outcome.CANCELLED)
        thread.join()

    def test_a_timeout_is_a_wait_timeout_and_an_old_ending_is_not_taken(self):
        event(self.r, "j-1", "succeeded")
        self.hg.schedule("job", "j-1", delay_ms=60_000)  # scheduled again: the old ending is not this run's
        started = time.monotonic()
        with self.assertRaises(hg.WaitTimeout) as caught:
            self.hg.wait("job", "j-1", timeout_ms=700)
        took = time.monotonic() - started
        self.assertTrue(0.69 <= took < 2.0, took)
        self.assertIsInstance(caught.exception, TimeoutError)
        self.assertEqual(caught.exception.code, "HG_WAIT_TIMEOUT")
        self.assertIn("job/j-1 did not end within 700 ms", str(caught.exception))

    def test_a_task_that_ended_before_is_found_back_in_the_stream(self):
        event(self.r, "gone", "succeeded", 1, finished_ms=10)
        event(self.r, "gone", "retried", 1)
        event(self.r, "gone", "dead", 4, error="newest", finished_ms=20)
        for i in range(2500):  # more than one page of entries after it
            event(self.r, f"x-{i}", "succeeded")
        self.assertEqual(self.hg.wait("job", "gone"), Ended(Outcome.DEAD, 4, "newest", 20))
        with self.assertRaises(hg.UnknownTask) as caught:
            self.hg.wait("job", "never")
        self.assertIn("task job/never is unknown", str(caught.exception))

    def test_a_dead_task_returns_at_once_and_a_cancelled_waiting_one_ends_cancelled(self):
        self.r.zadd("hourglass:{job}:dead", {"d-1": 1767600000000})
        self.r.hset("hourglass:{job}:attempts", "d-1", 5)
        self.r.hset("hourglass:{job}:errors", "d-1", "gateway said no")
        self.assertEqual(self.hg.wait("job", "d-1", timeout_ms=1), Ended(Outcome.DEAD, 5, "gateway said no", 1767600000000))
        # A client's cancel of a waiting task adds no event: the wait sees it gone.
        self.hg.schedule("job", "c-1", delay_ms=60_000)
        thread = later(0.3, lambda: Hourglass(self.r).cancel("job", "c-1"))
        started = time.monotonic()
        self.assertEqual(self.hg.wait("job", "c-1", timeout_ms=10_000), Ended(Outcome.CANCELLED, 0, None, None))
        self.assertLess(time.monotonic() - started, 3)
        thread.join()

    def test_no_events_stream_is_said_clearly(self):
        self.hg.schedule("quiet", "q-1")
        with self.assertRaises(hg.NoEvents) as caught:
            self.hg.wait("quiet", "q-1")
        self.assertIn("type quiet has no events stream (hourglass:{quiet}:events): set events = true", str(caught.exception))
        with self.assertRaises(hg.NoEvents) as caught:
            self.hg.wait("hot", "h-1")
        self.assertIn("type hot (shard hot", str(caught.exception))
        self.r.set("hourglass:{odd}:events", "x")
        with self.assertRaises(hg.DataFault):
            self.hg.wait("odd", "o-1")

    def test_a_sharded_type_is_read_from_the_tasks_shard(self):
        shard = self.hg.shard_for("hot", "h-1")
        for tag in hg.shard_tags("hot", 3):
            event(self.r, "none", "succeeded", key=f"hourglass:{{{tag}}}:events")
        self.hg.schedule("hot", "h-1")
        thread = later(0.2, lambda: event(self.r, "h-1", "succeeded", 1, key=f"hourglass:{{{shard}}}:events"))
        self.assertIs(self.hg.wait("hot", "h-1", timeout_ms=10_000).outcome, Outcome.SUCCEEDED)
        thread.join()

    def test_a_groups_callback_can_be_waited_for_before_its_group_completes(self):
        for group, callback in (("g-1", "g-1"), ("g-2", "call-2")):
            self.hg.group_open("job", group, callback_id=callback)  # empty: sealing it completes it

            def complete():
                Hourglass(self.r).group_seal("job", group)  # schedules the callback
                time.sleep(0.5)
                event(self.r, callback, "succeeded", 1)  # as the host that runs it writes

            thread = later(0.3, complete)
            self.assertIs(self.hg.wait("job", callback, timeout_ms=10_000).outcome, Outcome.SUCCEEDED, group)
            thread.join()
        # A group that completes without scheduling its callback (skipped: a child failed, when=success).
        self.hg.group_open("job", "g-3", callback_id="call-3", when="success")

        def skip():
            self.r.hset("hourglass:{job}:group:g-3", mapping={"state": "done", "fired": "skipped"})
            self.r.zrem("hourglass:{job}:groups", "g-3")

        thread = later(0.3, skip)
        with self.assertRaises(hg.UnknownTask) as caught:
            self.hg.wait("job", "call-3", timeout_ms=10_000)
        self.assertIn("group job/g-3 completed without running its callback call-3 (fired: skipped)", str(caught.exception))
        thread.join()

    def test_the_asyncio_client_waits_without_blocking_the_loop(self):
        async def main():
            r = redis.asyncio.Redis(unix_socket_path=self.server.socket, socket_timeout=0.4)
            client = hg.AsyncHourglass(r)
            await client.schedule("job", "a-1")
            ticks = 0

            async def settle():
                nonlocal ticks
                for _ in range(5):
                    await asyncio.sleep(0.05)
                    ticks += 1
                await r.xadd(EVENTS, {"id": "a-1", "outcome": "succeeded", "attempt": 1, "finished_ms": 9})

            ended, _ = await asyncio.gather(client.wait("job", "a-1", timeout_ms=10_000), settle())
            self.assertEqual((ended, ticks), (Ended(Outcome.SUCCEEDED, 1, None, 9), 5))
            with self.assertRaises(hg.WaitTimeout):
                await client.wait("job", "a-1", timeout_ms=10)  # still scheduled: it never ends here
            await r.aclose()

        asyncio.run(main())


if __name__ == "__main__":
    unittest.main()
