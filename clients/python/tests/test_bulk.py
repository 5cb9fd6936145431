"""schedule_many: checked before anything is sent, pipelined (several batches in flight on one connection),
routed, in order, and the same writes as schedule; what an error, a SCRIPT FLUSH and replicas=N do to it."""

from __future__ import annotations

import asyncio
import unittest
from datetime import datetime, timedelta, timezone
from unittest import mock

import redis.asyncio
from support import ServerTest

import hourglass_client as hg
from hourglass_client import Hourglass, NewTask, _bulk

#: A due time far ahead: every task waits.
LATER = 1_900_000_000_000
#: One id (of type cold) scheduled again across batches in each mode: index → (mode, due after LATER, written).
REPEATS = {
    10: ("upsert", 5000, True),
    1100: ("if-absent", 1, False),
    2100: ("only-later", 9000, True),
    2200: ("only-later", 7000, False),
    3100: ("only-earlier", 3000, True),
    3200: ("only-earlier", 4000, False),
    4100: ("upsert", 6000, True),
}


def ordered_tasks():
    """5000 tasks of three types (hot sharded), with REPEATS in it; and what schedule_many returns for them."""
    tasks = [NewTask(("cold", "hot", "warm")[i % 3], f"t-{i}", payload=str(i), at_ms=LATER) for i in range(5000)]
    written = [True] * len(tasks)
    for i, (mode, after, wrote) in REPEATS.items():
        tasks[i] = NewTask("cold", "rep", payload=f"p-{i}", at_ms=LATER + after, mode=mode)
        written[i] = wrote
    return tasks, written


def wrong_type_tasks():
    """8000 tasks of type fine, but tasks 2500 (in batch 2) and 4500 (batch 4) of type broken."""
    tasks = [NewTask("fine", f"a-{i}") for i in range(8000)]
    tasks[2500] = NewTask("broken", "b-1")
    tasks[4500] = NewTask("broken", "b-2")
    return tasks


def flush_scripts_when_batch_3_is_packed(r):
    """_bulk._calls, patched to flush the scripts (another connection) while batches 0 to 2 are in flight."""
    calls = _bulk._calls

    def flushing(core, checked, start, end):
        if start == 3 * _bulk.BATCH:
            r.script_flush()
        return calls(core, checked, start, end)

    return mock.patch.object(_bulk, "_calls", flushing)


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

    def assert_in_order(self, tasks):
        """What ordered_tasks writes: every task, and the repeated id as its last write left it."""
        self.assertEqual(self.r.zscore("hourglass:{cold}:due", "rep"), LATER + 6000)
        self.assertEqual(self.r.hget("hourglass:{cold}:payload", "rep"), b"p-4100")
        for t in ("cold", "warm"):
            self.assertEqual(self.r.zcard(f"hourglass:{{{t}}}:due"), len({x.id for x in tasks if x.task_type == t}))
        self.assertEqual(self.hg.stats("hot").scheduled_later, sum(x.task_type == "hot" for x in tasks))

    def test_many_batches_in_flight_keep_their_order_on_one_connection(self):
        tasks, written = ordered_tasks()
        self.hg.schedule_many([NewTask("first", "x")])  # loads the script
        self.r.config_resetstat()
        connections = self.r.info("stats")["total_connections_received"]
        self.assertEqual(self.hg.schedule_many(tasks), written)
        # The pooled connection, taken for the whole call and given back: no other was opened.
        self.assertEqual(self.r.info("stats")["total_connections_received"], connections)
        # Each batch: a call per type or shard and 200 tasks, each sent once (the script was loaded before).
        checked = [_bulk._step(self.hg, t, 0, {}) for t in tasks]
        calls = sum(len(_bulk._calls(self.hg, checked, s, s + 1000)[0]) for s in range(0, 5000, 1000))
        self.assertEqual(self.r.info("commandstats")["cmdstat_evalsha"]["calls"], calls)
        self.assert_in_order(tasks)

    def test_a_data_fault_stops_the_batches_and_says_which_were_sent(self):
        self.r.set("hourglass:{broken}:due", "oops")
        self.hg.schedule_many([NewTask("first", "x")])  # loads the script: no batch sent again
        connections = self.r.info("stats")["total_connections_received"]
        with self.assertRaises(hg.DataFault) as caught:
            self.hg.schedule_many(wrong_type_tasks())
        text = str(caught.exception)
        self.assertIn("schedule_many: task 2500: hourglass:{broken}:due holds a string, not a zset", text)
        # Batches 0 to 3 go at once, 4 and 5 as 0 and 1 are answered; none after batch 2's error.
        self.assertIn("(tasks 0 to 5999 were sent; the 1 of its script call (of this task's type in its batch, "
                      "from task 2500) were not written, nor 1 more in 1 later call(s) that failed too, the first "
                      "from task 4500, the others were; none after 5999 was sent)", text)
        self.assertEqual(self.r.zcard("hourglass:{fine}:due"), 6000 - 2)
        self.assertIsNotNone(self.r.zscore("hourglass:{fine}:due", "a-5999"))
        self.assertIsNone(self.r.zscore("hourglass:{fine}:due", "a-6000"))
        # Every reply in flight was read: the connection goes back to the pool, and serves the next call.
        self.assertEqual(self.hg.schedule_many([NewTask("fine", "after")]), [True])
        self.assertEqual(self.r.info("stats")["total_connections_received"], connections)

    def test_a_failure_with_replies_unread_drops_the_connection(self):
        def failing(core, checked, start, end):
            if start == 2 * _bulk.BATCH:
                raise RuntimeError("stop")  # batches 0 and 1 in flight, unread
            return calls(core, checked, start, end)

        calls = _bulk._calls
        connections = self.r.info("stats")["total_connections_received"]
        with mock.patch.object(_bulk, "_calls", failing), self.assertRaisesRegex(RuntimeError, "stop"):
            self.hg.schedule_many([NewTask("fine", f"a-{i}") for i in range(5000)])
        # Not given back as it was: the next call reads its own replies, on a new connection.
        self.assertEqual(self.hg.schedule_many([NewTask("fine", "b")]), [True])
        self.assertEqual(self.r.info("stats")["total_connections_received"], connections + 1)

    def test_scripts_flushed_mid_call_are_loaded_and_the_calls_sent_again_in_order(self):
        tasks, written = ordered_tasks()
        self.r.config_resetstat()
        with flush_scripts_when_batch_3_is_packed(self.r):
            self.assertEqual(self.hg.schedule_many(tasks), written)
        stats = self.r.info("commandstats")
        self.assertGreaterEqual(stats["cmdstat_evalsha"]["failed_calls"], 7, "batch 3 at least met NOSCRIPT")
        self.assertEqual(stats["cmdstat_script|load"]["calls"], 1)
        self.assert_in_order(tasks)

    def test_replicas_is_one_wait_after_the_last_batch(self):
        self.r.config_resetstat()
        with self.assertRaises(hg.ReplicationTimeout) as caught:  # a lone server: no replica acknowledges
            self.hg.schedule_many([NewTask("lone", f"r-{i}") for i in range(3500)], replicas=1, replicas_timeout_ms=50)
        self.assertEqual((caught.exception.acked, caught.exception.wanted), (0, 1))
        self.assertIn("schedule_many: tasks 0 to 3499 were sent, then one WAIT for them all, and written on the "
                      "master, but 0 of 1 replicas acknowledged it within 50 ms", str(caught.exception))
        self.assertEqual(self.r.info("commandstats")["cmdstat_wait"]["calls"], 1)
        self.assertEqual(self.r.zcard("hourglass:{lone}:due"), 3500)
        self.r.set("hourglass:{broken}:due", "oops")
        with self.assertRaises(hg.DataFault):  # an error first: no WAIT, the error says what was written
            self.hg.schedule_many(wrong_type_tasks(), replicas=1, replicas_timeout_ms=50)
        self.assertEqual(self.r.info("commandstats")["cmdstat_wait"]["calls"], 1)

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

    def test_the_asyncio_client_keeps_order_stops_at_an_error_and_reloads_scripts(self):
        async def main():
            r = redis.asyncio.Redis(unix_socket_path=self.server.socket)
            client = hg.AsyncHourglass(r, shards={"hot": 3})
            await client.schedule_many([NewTask("first", "x")])  # loads the script
            tasks, written = ordered_tasks()
            self.assertEqual(await client.schedule_many(tasks), written)
            self.assert_in_order(tasks)
            await r.flushall()
            with flush_scripts_when_batch_3_is_packed(self.r):
                self.assertEqual(await client.schedule_many(tasks), written)
            self.assert_in_order(tasks)
            await r.flushall()
            await r.set("hourglass:{broken}:due", "oops")
            with self.assertRaises(hg.DataFault) as caught:
                await client.schedule_many(wrong_type_tasks())
            self.assertIn("schedule_many: task 2500: hourglass:{broken}:due", str(caught.exception))
            self.assertIn("tasks 0 to 5999 were sent", str(caught.exception))
            self.assertIn("nor 1 more in 1 later call(s) that failed too, the first from task 4500", str(caught.exception))
            self.assertEqual(await r.zcard("hourglass:{fine}:due"), 6000 - 2)
            self.assertEqual(await client.schedule_many([NewTask("fine", "after")]), [True])
            with self.assertRaises(hg.ReplicationTimeout) as late:
                await client.schedule_many([NewTask("lone", f"r-{i}") for i in range(1500)], replicas=1, replicas_timeout_ms=50)
            self.assertIn("tasks 0 to 1499 were sent, then one WAIT for them all", str(late.exception))
            self.assertEqual(await r.zcard("hourglass:{lone}:due"), 1500)
            await r.aclose()

        asyncio.run(main())


if __name__ == "__main__":
    unittest.main()
