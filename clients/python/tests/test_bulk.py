"""schedule_many: checked before anything is sent, pipelined, routed, in order, and the same writes as schedule."""

from __future__ import annotations

import asyncio
import unittest
from datetime import datetime, timedelta, timezone

import redis.asyncio
from support import ServerTest

import hourglass_client as hg
from hourglass_client import Hourglass, NewTask


class BulkTest(ServerTest):
    def setUp(self):
        super().setUp()
        self.hg = Hourglass(self.r, shards={"hot": 3})

    def test_it_writes_what_schedule_writes_and_answers_in_order(self):
        at = datetime(2030, 1, 1, tzinfo=timezone.utc)
        tasks = [
            NewTask("mail", "m-1", payload={"to": "a"}, at=at),
            {"task_type": "mail", "id": b"\x00\xff", "payload": b"raw", "at_ms": 1893456000000},
            NewTask("mail", 42, delay=timedelta(minutes=5)),
            {"task_type": "mail", "id": "m-1", "at_ms": 1, "mode": "if-absent"},  # kept: the first wins
            NewTask("mail", "m-2", payload="p", delay_ms=60_000, mode="only-later"),
            NewTask("mail", "m-2", payload="q", delay_ms=30_000, mode="only-later"),  # earlier: not written
        ]
        before = hg.now_ms()
        self.assertEqual(self.hg.schedule_many(tasks), [True, True, True, False, True, False])
        due = "hourglass:{mail}:due"
        self.assertEqual(self.r.zscore(due, "m-1"), 1893456000000)
        self.assertEqual(self.r.zscore(due, b"\x00\xff"), 1893456000000)
        self.assertGreaterEqual(self.r.zscore(due, "42"), before + 300_000)
        self.assertEqual(self.r.hgetall("hourglass:{mail}:payload"), {b"m-1": b'{"to":"a"}', b"\x00\xff": b"raw", b"m-2": b"p"})
        # The same tasks one by one write the same keys and bytes.
        one = Hourglass(self.r)
        for task in tasks:
            t = task if isinstance(task, NewTask) else NewTask(**task)
            one.schedule("mail.one", t.id, payload=t.payload, at=t.at, at_ms=t.at_ms, delay=t.delay,
                         delay_ms=t.delay_ms, mode=t.mode)
        self.assertEqual(self.r.hgetall("hourglass:{mail.one}:payload"), self.r.hgetall("hourglass:{mail}:payload"))
        self.assertEqual(self.r.zrange("hourglass:{mail.one}:due", 0, -1), self.r.zrange(due, 0, -1))
        self.assertEqual(self.hg.schedule_many([]), [])

    def test_one_bad_task_is_named_and_nothing_is_written(self):
        good = [NewTask("ok", f"g-{i}") for i in range(5)]
        cases = [
            (NewTask("ok", ""), "task 5: invalid task id: it is empty", hg.InvalidId),
            (NewTask("Bad", "x"), "task 5: invalid task type 'Bad'", hg.InvalidTaskType),
            (NewTask("ok", "x", delay=5), "task 5: delay takes a timedelta", hg.InvalidArgument),  # type: ignore[arg-type]
            (NewTask("ok", "x", mode="sometimes"), "task 5: invalid mode 'sometimes'", hg.InvalidArgument),  # type: ignore[arg-type]
            (NewTask("ok", "x", payload=object()), "task 5: payload of type object", hg.InvalidArgument),  # type: ignore[arg-type]
            ({"task_type": "ok", "id": "x", "traceparent": "00-..."}, "traceparent is not supported in bulk", None),
            ({"task_type": "ok", "id": "x", "delay_s": 5}, "task 5: unknown field 'delay_s'", None),
            ({"task_type": "ok"}, "task 5: a task needs task_type and id", None),
            (("ok", "x"), "task 5: a task is a NewTask or a dict, not tuple", None),
        ]
        for bad, message, cause in cases:
            with self.assertRaises(hg.InvalidArgument, msg=message) as caught:
                self.hg.schedule_many([*good, bad, *good])
            self.assertIn(message, str(caught.exception))
            if cause is not None:
                self.assertIsInstance(caught.exception.__cause__, cause)
        with self.assertRaises(hg.InvalidArgument):
            self.hg.schedule_many(NewTask("ok", "x"))  # type: ignore[arg-type]
        self.assertEqual(self.r.dbsize(), 0, "nothing is sent before every task is checked")

    def test_many_batches_with_sharded_types_routed_and_scripts_reloaded(self):
        self.r.script_flush()  # as after a restart: NOSCRIPT, then the scripts are loaded and the tasks sent
        tasks = [NewTask("hot" if i % 2 else "cold", f"t-{i}", payload=str(i), delay_ms=600_000) for i in range(2500)]
        tasks[1700] = NewTask("cold", "t-0", delay_ms=1, mode="if-absent")  # a later batch sees an earlier one's write
        written = self.hg.schedule_many(tasks)
        self.assertEqual(len(written), 2500)
        self.assertEqual([i for i, w in enumerate(written) if not w], [1700])
        tags = hg.shard_tags("hot", 3)
        for i in range(1, 2500, 2):
            shard = tags[hg.shard_of(f"t-{i}".encode(), 3)]
            self.assertEqual(self.r.hget(f"hourglass:{{{shard}}}:payload", f"t-{i}"), str(i).encode())
        self.assertEqual(sum(self.r.zcard(f"hourglass:{{{t}}}:due") for t in tags), 1250)
        self.assertEqual(self.r.zcard("hourglass:{cold}:due"), 1250 - 1)
        self.assertEqual(self.hg.stats("hot").scheduled_later, 1250)

    def test_a_data_fault_names_its_task_and_stops_after_its_batch(self):
        self.r.set("hourglass:{broken}:due", "oops")
        tasks = [NewTask("fine", f"a-{i}") for i in range(1500)]
        tasks[3] = NewTask("broken", "b")
        with self.assertRaises(hg.DataFault) as caught:
            self.hg.schedule_many(tasks)
        text = str(caught.exception)
        self.assertIn("schedule_many: task 3: hourglass:{broken}:due holds a string, not a zset", text)
        self.assertIn("tasks 0 to 999 were sent", text)
        self.assertEqual(self.r.zcard("hourglass:{fine}:due"), 999, "the rest of its batch is written, nothing after")

    def test_the_asyncio_client_schedules_many_too(self):
        async def main():
            r = redis.asyncio.Redis(unix_socket_path=self.server.socket)
            await r.script_flush()
            client = hg.AsyncHourglass(r, shards={"hot": 3})
            written = await client.schedule_many(
                [NewTask("hot", f"a-{i}", delay_ms=600_000) for i in range(1200)] + [NewTask("hot", "a-0", mode="if-absent")]
            )
            self.assertEqual((len(written), written.count(False)), (1201, 1))
            self.assertEqual((await client.stats("hot")).scheduled_later, 1200)
            await r.aclose()

        asyncio.run(main())


if __name__ == "__main__":
    unittest.main()
