"""The Python client against a real redis-server (or valkey-server: whatever `redis-server` is on PATH),
started by the test on a unix socket in a temp dir."""

from __future__ import annotations

import asyncio
import json
import os
import unittest
from datetime import datetime, timedelta, timezone

import redis
import redis.asyncio
from support import ServerTest

import hourglass_client as hg
from hourglass_client import Child, Fired, Hourglass, Sealed, SealState

HOST_SCRIPTS = os.path.join(os.path.dirname(__file__), "..", "..", "..", "host", "store", "src", "scripts")


class ClientTest(ServerTest):
    def setUp(self):
        super().setUp()
        self.hg = Hourglass(self.r)

    def test_schedule_writes_the_contract_keys_and_each_mode_keeps_its_promise(self):
        due = int(datetime(2030, 1, 1, tzinfo=timezone.utc).timestamp() * 1000)
        self.assertTrue(self.hg.schedule("order.timeout", "o-1", at_ms=due, payload=b'{"order":1}'))
        self.assertEqual(self.r.zscore("hourglass:{order.timeout}:due", "o-1"), due)
        self.assertEqual(self.r.hget("hourglass:{order.timeout}:payload", "o-1"), b'{"order":1}')
        # if-absent keeps the first schedule and its payload.
        self.assertFalse(self.hg.schedule("order.timeout", "o-1", at_ms=due + 5, payload="second", mode="if-absent"))
        self.assertEqual(self.r.hget("hourglass:{order.timeout}:payload", "o-1"), b'{"order":1}')
        # only-later postpones, never brings forward.
        self.assertFalse(self.hg.schedule("order.timeout", "o-1", at_ms=due - 1, mode="only-later"))
        self.assertTrue(self.hg.schedule("order.timeout", "o-1", at_ms=due + 10, mode="only-later"))
        self.assertTrue(self.hg.schedule("order.timeout", "o-1", at_ms=due + 1, mode="only-earlier"))
        self.assertEqual(self.r.zscore("hourglass:{order.timeout}:due", "o-1"), due + 1)
        # Written without a payload, the payload goes (as the CLI does).
        self.assertIsNone(self.r.hget("hourglass:{order.timeout}:payload", "o-1"))
        # A delay, a datetime, and a W3C traceparent for the run's span.
        before = hg.now_ms()
        self.hg.schedule("mail", "m-1", delay=timedelta(minutes=5), traceparent="00-" + "a" * 32 + "-" + "b" * 16 + "-01")
        self.assertGreaterEqual(self.r.zscore("hourglass:{mail}:due", "m-1"), before + 300_000)
        self.assertTrue(self.r.hget("hourglass:{mail}:trace", "m-1").startswith(b"00-aaaa"))
        self.hg.schedule("mail", b"\x00\xff", at=datetime(2031, 5, 1, tzinfo=timezone.utc))
        self.assertEqual(self.r.zscore("hourglass:{mail}:due", b"\x00\xff"), 1935360000000)

    def test_postpone_and_run_now_move_only_a_scheduled_task(self):
        self.hg.schedule("device.offline", "d-1", delay_ms=30_000)
        moved = self.hg.postpone("device.offline", "d-1", timedelta(seconds=60))
        self.assertEqual(self.r.zscore("hourglass:{device.offline}:due", "d-1"), moved)
        self.assertGreater(moved, hg.now_ms() + 80_000)
        now = self.hg.run_now("device.offline", "d-1")
        self.assertLessEqual(abs(now - hg.now_ms()), 60_000)
        self.assertIsNone(self.hg.postpone("device.offline", "nobody", delay_ms=5_000))
        self.assertIsNone(self.hg.run_now("device.offline", "nobody"))
        self.assertFalse(self.r.exists("hourglass:{device.offline}:due") and self.r.zscore(
            "hourglass:{device.offline}:due", "nobody"))

    def test_show_and_cancel_a_waiting_task(self):
        self.hg.schedule("order.timeout", "o-2", delay_ms=600_000, payload="x" * 100, traceparent="00-" + "c" * 32 + "-" + "d" * 16 + "-01")
        view = self.hg.show("order.timeout", "o-2", payload_bytes=10)
        self.assertEqual((view.state, view.payload_size, view.payload), ("scheduled", 100, b"x" * 10))
        self.assertGreater(view.due_ms, view.now_ms)
        self.assertIsNone(view.running)
        self.assertIsNone(view.progress)
        # Progress as a host stores it (a retried task keeps its last report).
        self.r.hset("hourglass:{order.timeout}:progress", "o-2", '{"percent":40,"detail":{"rows":4},"attempt":1,"at_ms":5}')
        self.assertEqual(self.hg.show("order.timeout", "o-2").progress, hg.Progress(40, {"rows": 4}, 1, 5))
        self.assertEqual(self.hg.cancel("order.timeout", "o-2"), hg.Cancelled("scheduled"))
        self.assertFalse(self.r.hexists("hourglass:{order.timeout}:progress", "o-2"), "a cancel drops the progress")
        self.assertEqual(self.hg.show("order.timeout", "o-2").state, "unknown")
        self.assertEqual(self.r.hlen("hourglass:{order.timeout}:payload"), 0)
        self.assertEqual(self.r.hlen("hourglass:{order.timeout}:trace"), 0, "cancel drops the trace entry too")
        self.assertEqual(self.hg.cancel("order.timeout", "o-2").state, "unknown")
        # A dead-lettered task, as the host leaves one.
        self.r.zadd("hourglass:{order.timeout}:dead", {"o-3": 1767600000000})
        self.r.hset("hourglass:{order.timeout}:attempts", "o-3", 5)
        self.r.hset("hourglass:{order.timeout}:errors", "o-3", "gateway said no")
        view = self.hg.show("order.timeout", "o-3")
        self.assertEqual((view.state, view.died_ms, view.attempts, view.last_error), ("dead", 1767600000000, 5, "gateway said no"))
        self.hg.schedule("order.timeout", "o-4", at_ms=hg.now_ms() - 1000)
        self.assertEqual(self.hg.show("order.timeout", "o-4").state, "due")

    def test_pause_resume_and_stats(self):
        for i in range(3):
            self.hg.schedule("report", f"r-{i}", delay_ms=600_000)
        self.hg.schedule("report", "now", at_ms=hg.now_ms() - 5)
        stats = self.hg.stats("report")
        self.assertEqual((stats.due_now, stats.scheduled_later, stats.in_flight, stats.paused_ms), (1, 3, 0, None))
        self.assertIsNone(self.hg.pause("report"))
        self.assertEqual(self.hg.stats("report").paused_ms, 0)
        self.assertTrue(self.hg.resume("report"))
        self.assertFalse(self.hg.resume("report"))
        ends = self.hg.pause("report", length=timedelta(seconds=60))
        self.assertGreater(ends, hg.now_ms() + 50_000)
        self.assertGreater(self.hg.stats("report").paused_ms, 50_000)

    def test_a_group_fires_its_callback_once_with_its_summary(self):
        self.assertTrue(self.hg.group_open("order.ship", "o-17", payload='{"order":"o-17"}'))
        self.assertFalse(self.hg.group_open("order.ship", "o-17", payload='{"order":"o-17"}'), "opening again changes nothing")
        later = hg.now_ms() + 600_000
        added = self.hg.group_add("order.ship", "o-17", [
            Child("order.reserve", "o-17", due_ms=later),
            Child("order.charge", "o-17", payload='{"amount":4200}', due_ms=later),
        ])
        self.assertEqual((added.joined, added.refused), (2, []))
        self.assertEqual(self.hg.group_add("order.ship", "o-17", [Child("order.reserve", "o-17", due_ms=later)]).joined, 0)
        self.assertEqual(self.r.hget("hourglass:{order.charge}:payload", "o-17"), b'{"amount":4200}')
        self.assertEqual(self.hg.show("order.charge", "o-17").group, "order.ship/o-17")
        self.assertEqual(self.hg.group_seal("order.ship", "o-17"), Sealed(SealState.SEALED))
        self.assertEqual(self.hg.group_seal("order.ship", "o-17"), Sealed(SealState.ALREADY, None))
        view = self.hg.group_show("order.ship", "o-17")
        self.assertEqual((view.state, view.added, view.pending, view.callback_id), ("sealed", 2, 2, "o-17"))
        with self.assertRaises(hg.GroupClosed):
            self.hg.group_add("order.ship", "o-17", [Child("order.mail", "late")])
        self.assertEqual(self.r.zcard("hourglass:{order.mail}:due"), 0, "a refused add schedules nothing")

        # An empty group sealed completes at once: its callback is due now, with the summary.
        self.hg.group_open("done", "empty", callback_id="cb", payload="p")
        self.assertEqual(self.hg.group_seal("done", "empty"), Sealed(SealState.COMPLETED, Fired.CALLBACK))
        summary = json.loads(self.r.hget("hourglass:{done}:payload", "cb"))
        self.assertEqual((summary["group"], summary["payload"], summary["added"]), ("empty", "p", 0))
        self.assertEqual(self.hg.group_show("done", "empty").fired, "callback")
        with self.assertRaises(hg.GroupConflict):
            self.hg.group_open("done", "empty", callback_id="cb")
        self.assertIsNone(self.hg.group_show("done", "never"))

    def test_refusals_are_typed_and_write_nothing(self):
        with self.assertRaises(hg.NoSuchGroup):
            self.hg.group_add("ship", "nope", [Child("step", "a")])
        with self.assertRaises(hg.NoSuchGroup):
            self.hg.group_seal("ship", "nope")
        self.hg.group_open("ship", "g", callback_id="one")
        with self.assertRaises(hg.GroupConflict):
            self.hg.group_open("ship", "g", callback_id="two")
        with self.assertRaises(hg.GroupRefused):
            self.hg.group_open("ship", "g", callback_id="one", when="success")
        for bad in ("Bad", "", "a{b}", "x" * 65, "order timeout"):
            with self.assertRaises(hg.InvalidTaskType, msg=bad):
                self.hg.schedule(bad, "id")
        with self.assertRaises(hg.InvalidId):
            self.hg.schedule("ok", "")
        with self.assertRaises(hg.InvalidId):
            self.hg.group_open("ok", "a\nb")
        with self.assertRaises(hg.InvalidArgument):
            self.hg.schedule("ok", "id", mode="sometimes")
        with self.assertRaises(hg.InvalidArgument):
            self.hg.group_open("ok", "g", when="sometimes")
        with self.assertRaises(hg.InvalidArgument):
            self.hg.schedule("ok", "id", at=datetime(2030, 1, 1))
        with self.assertRaises(ValueError, msg="typed errors are ValueErrors too"):
            self.hg.postpone("ok", "id", delay_ms=-5)
        self.assertEqual(self.r.keys("hourglass:{ok}:*") + self.r.keys("hourglass:{Bad}:*"), [])

        # Bad data in a type's keys: a DataFault naming the key and the fix, and nothing half-written.
        self.r.set("hourglass:{broken}:due", "oops")
        with self.assertRaises(hg.DataFault) as caught:
            self.hg.schedule("broken", "b-1", payload="body")
        self.assertIn("hourglass:{broken}:due holds a string, not a zset", str(caught.exception))
        self.assertFalse(self.r.exists("hourglass:{broken}:payload"))
        self.assertIn("holds a string", self.hg.stats("broken").fault)

    def test_ids_and_payloads_are_written_as_given_or_refused(self):
        # An int id is its decimal text, as the Node client and the CLI write it; JSON-able payloads are JSON.
        self.hg.schedule("ok", 42, payload={"order": 42, "note": "é"})
        self.hg.schedule("ok", -1, payload=5)
        self.hg.schedule("ok", bytearray(b"\x00\xff"), payload=[1, 2])
        members = set(self.r.zrange("hourglass:{ok}:due", 0, -1))
        self.assertEqual(members, {b"42", b"-1", b"\x00\xff"})
        self.assertEqual(self.r.hget("hourglass:{ok}:payload", "42"), '{"order":42,"note":"é"}'.encode())
        self.assertEqual(self.r.hget("hourglass:{ok}:payload", "-1"), b"5")
        self.assertEqual(self.r.hget("hourglass:{ok}:payload", b"\x00\xff"), b"[1,2]")
        self.assertEqual(self.hg.show("ok", 42).payload, b'{"order":42,"note":"\xc3\xa9"}')
        # What has no faithful bytes is refused before anything is sent.
        for bad in (4.2, True, None, object(), [1]):
            with self.assertRaises(hg.InvalidId, msg=repr(bad)):
                self.hg.schedule("bad", bad)
        for bad in (object(), float("nan"), {1, 2}):
            with self.assertRaises(hg.InvalidArgument, msg=repr(bad)):
                self.hg.schedule("bad", "id", payload=bad)
        # What json.dumps would change without an error is refused too, naming where it is.
        unfaithful = [
            ((1, 2), "payload is a tuple"),
            ({"lines": [{"at": (1, 2)}]}, "payload['lines'][0]['at'] is a tuple"),
            ({1: "x"}, "payload has a key 1 of type int"),
            ({"order": {None: 1}}, "payload['order'] has a key None"),
        ]
        for bad, why in unfaithful:
            for call in (
                lambda: self.hg.schedule("bad", "id", payload=bad),
                lambda: self.hg.schedule_many([{"task_type": "bad", "id": "id", "payload": bad}]),
            ):
                with self.assertRaises(hg.InvalidArgument, msg=repr(bad)) as caught:
                    call()
                self.assertIn(why, str(caught.exception))
        self.assertEqual(self.r.keys("hourglass:{bad}:*"), [])

    def test_a_client_that_decodes_replies_is_refused_at_construction(self):
        with self.assertRaises(hg.InvalidArgument) as caught:
            Hourglass(redis.Redis(unix_socket_path=self.server.socket, decode_responses=True))
        self.assertIn("decode_responses", str(caught.exception))

        async def asyncio_client():  # made in a running loop, as Python 3.9's asyncio wants
            with self.assertRaises(hg.InvalidArgument) as caught:
                hg.AsyncHourglass(redis.asyncio.Redis(unix_socket_path=self.server.socket, decode_responses=True))
            self.assertIn("decode_responses", str(caught.exception))
            with self.assertRaises(hg.InvalidArgument) as caught:
                Hourglass(redis.asyncio.Redis(unix_socket_path=self.server.socket))
            self.assertIn("give a redis.asyncio client to AsyncHourglass", str(caught.exception))

        asyncio.run(asyncio_client())
        for prefix in ("", "a b", "app{1}", "app*", "x" * 65):
            with self.assertRaises(hg.InvalidArgument, msg=prefix) as caught:
                Hourglass(self.r, prefix=prefix)
            self.assertIn("invalid key prefix", str(caught.exception))
        self.assertEqual(Hourglass(self.r, prefix="app:hg").key("t", "due"), "app:hg:{t}:due")

    def test_a_sharded_type_routes_each_id_to_its_shard(self):
        client = Hourglass(self.r, shards={"hot": 3})
        tags = hg.shard_tags("hot", 3)
        self.assertEqual(tags[0], "hot")
        ids = [f"t-{i}" for i in range(30)]
        for i in ids:
            client.schedule("hot", i, delay_ms=600_000)
        for i in ids:
            shard = hg.shard_of(i.encode(), 3)
            self.assertEqual(client.shard_for("hot", i), tags[shard])
            self.assertIsNotNone(self.r.zscore(f"hourglass:{{{tags[shard]}}}:due", i))
            view = client.show("hot", i)
            self.assertEqual((view.task_type, view.shard), (tags[shard], shard))
        self.assertEqual(client.stats("hot").scheduled_later, 30)
        self.assertIsNone(client.pause("hot"))
        self.assertTrue(all(self.r.exists(f"hourglass:{{{t}}}:paused") for t in tags), "a pause writes every shard")
        # A task written to the wrong shard is still found and cancelled.
        wrong = tags[(hg.shard_of(b"stray", 3) + 1) % 3]
        self.r.zadd(f"hourglass:{{{wrong}}}:due", {"stray": 1})
        self.assertEqual(client.show("hot", "stray").task_type, wrong)
        self.assertEqual(client.cancel("hot", "stray").state, "scheduled")
        with self.assertRaises(hg.InvalidArgument):
            Hourglass(self.r, shards={"hot": 0})

    def test_the_asyncio_client_runs_the_same_calls(self):
        async def main():
            r = redis.asyncio.Redis(unix_socket_path=self.server.socket)
            client = hg.AsyncHourglass(r, shards={"hot": 3})
            self.assertTrue(await client.schedule("order.timeout", "a-1", delay_ms=600_000, payload="p", traceparent="00-" + "e" * 32 + "-" + "f" * 16 + "-01"))
            self.assertFalse(await client.schedule("order.timeout", "a-1", delay=timedelta(minutes=15), mode="if-absent"))
            view = await client.show("order.timeout", "a-1")
            self.assertEqual((view.state, view.payload), ("scheduled", b"p"))
            self.assertIsNotNone(await client.postpone("order.timeout", "a-1", delay_ms=60_000))
            self.assertEqual((await client.cancel("order.timeout", "a-1")).state, "scheduled")
            await client.schedule("hot", "h-1", delay_ms=600_000)
            self.assertEqual((await client.show("hot", "h-1")).task_type, client.shard_for("hot", "h-1"))
            self.assertEqual((await client.stats("hot")).scheduled_later, 1)
            self.assertIsNone(await client.pause("hot"))
            self.assertTrue(await client.resume("hot"))
            self.assertTrue(await client.group_open("done", "ag"))
            added = await client.group_add("done", "ag", [Child("step", "s-1", due_ms=hg.now_ms() + 600_000)])
            self.assertEqual(added.joined, 1)
            self.assertEqual((await client.group_seal("done", "ag")).state, "sealed")
            self.assertEqual((await client.group_show("done", "ag")).pending, 1)
            with self.assertRaises(hg.GroupClosed):
                await client.group_add("done", "ag", [Child("step", "late")])
            with self.assertRaises(hg.NoSuchGroup):
                await client.group_seal("done", "never")
            await r.aclose()

        asyncio.run(main())
        # What the asyncio client wrote is what the blocking one reads.
        self.assertEqual(self.hg.group_show("done", "ag").state, "sealed")

    def test_every_time_is_milliseconds_and_a_number_given_as_a_time_type_is_refused(self):
        # A number of ms, or the time type under the name without _ms: both say the same.
        self.hg.schedule("u", "a", delay=timedelta(seconds=90, microseconds=1500))
        self.hg.schedule("u", "b", delay_ms=90_001)
        due_a, due_b = (self.r.zscore("hourglass:{u}:due", i) for i in ("a", "b"))
        self.assertLessEqual(abs(due_a - due_b), 1_000)
        at = datetime(2030, 1, 1, 0, 0, 0, 999_999, tzinfo=timezone(timedelta(hours=2)))
        self.hg.schedule("u", "c", at=at)
        self.assertEqual(self.r.zscore("hourglass:{u}:due", "c"), 1893448800999, "exact ms, no float rounding")
        self.assertEqual(hg.due_ms(at_ms=5), 5)
        # What used to be seconds is refused, never read as ms; both forms of one thing are refused.
        refusals = [
            (lambda: self.hg.schedule("u", "x", delay=30), "delay takes a timedelta; give a number of milliseconds as delay_ms="),  # type: ignore[arg-type]
            (lambda: self.hg.schedule("u", "x", at=1893448800000), "at takes an aware datetime; give ms since the epoch as at_ms="),  # type: ignore[arg-type]
            (lambda: self.hg.schedule("u", "x", delay=timedelta(1), delay_ms=5), "give delay or delay_ms, not both"),
            (lambda: self.hg.schedule("u", "x", at_ms=5, delay_ms=5), "give a due time (at or at_ms) or a delay"),
            (lambda: self.hg.schedule("u", "x", at=at, at_ms=5), "give at or at_ms, not both"),
            (lambda: self.hg.schedule("u", "x", delay_ms=-1), "delay_ms must not be negative"),
            (lambda: self.hg.schedule("u", "x", at_ms="soon"), "at_ms takes a number of milliseconds, not str"),  # type: ignore[arg-type]
            (lambda: self.hg.postpone("u", "a", 60), "delay takes a timedelta"),  # type: ignore[arg-type]
            (lambda: self.hg.postpone("u", "a"), "postpone needs delay (a timedelta) or delay_ms"),
            (lambda: self.hg.pause("u", length=300), "length takes a timedelta; give a number of milliseconds as length_ms="),  # type: ignore[arg-type]
            (lambda: self.hg.pause("u", length_ms=0), "more than 0 ms"),
            (lambda: self.hg.wait("u", "a", timeout=5), "timeout takes a timedelta; give a number of milliseconds as timeout_ms="),  # type: ignore[arg-type]
        ]
        for call, message in refusals:
            with self.assertRaises(hg.InvalidArgument) as caught:
                call()
            self.assertIn(message, str(caught.exception))
            self.assertEqual(caught.exception.code, "HG_INVALID_ARGUMENT")
        self.assertEqual(self.r.zcard("hourglass:{u}:due"), 3, "a refusal writes nothing")
        self.assertFalse(self.r.exists("hourglass:{u}:paused"))
        ends = self.hg.pause("u", length_ms=60_000)
        self.assertGreater(ends, hg.now_ms() + 50_000)

    def test_states_are_str_enums_and_results_are_typed(self):
        self.hg.schedule("e", "a", delay_ms=60_000)
        view = self.hg.show("e", "a")
        self.assertIs(view.state, hg.TaskState.SCHEDULED)
        self.assertEqual(view.state, "scheduled", "still equal to the word")
        self.assertEqual((str(view.state), f"{view.state}", f"{view.state:>10}"), ("scheduled", "scheduled", " scheduled"))
        self.assertIs(self.hg.cancel("e", "a").state, hg.CancelState.SCHEDULED)
        self.assertIs(self.hg.cancel("e", "a").state, hg.CancelState.UNKNOWN)
        self.hg.group_open("e", "g")
        self.assertIs(self.hg.group_show("e", "g").state, hg.GroupState.OPEN)
        sealed = self.hg.group_seal("e", "g")
        self.assertEqual((sealed.state, sealed.fired), (SealState.COMPLETED, Fired.CALLBACK))
        view = self.hg.group_show("e", "g")
        self.assertEqual((view.state, view.fired), (hg.GroupState.DONE, Fired.CALLBACK))
        # Every public call is a real method (a coroutine function on the asyncio client), not a generator.
        import inspect

        for name in ("schedule", "schedule_many", "postpone", "run_now", "cancel", "show", "wait", "pause", "resume",
                     "stats", "group_open", "group_add", "group_seal", "group_show"):
            self.assertIn(name, vars(Hourglass), name)
            self.assertFalse(inspect.isgeneratorfunction(getattr(Hourglass, name)), name)
            self.assertTrue(inspect.iscoroutinefunction(getattr(hg.AsyncHourglass, name)), name)
        self.assertEqual(inspect.signature(Hourglass.schedule).parameters.keys(),
                         inspect.signature(hg.AsyncHourglass.schedule).parameters.keys())
        with self.assertRaises(hg.InvalidArgument) as caught:
            hg.AsyncHourglass(self.r)  # type: ignore[arg-type]
        self.assertIn("give a blocking redis.Redis to Hourglass", str(caught.exception))

    def test_the_shipped_scripts_are_the_hosts(self):
        here = os.path.join(os.path.dirname(hg.__file__), "scripts")
        for name in sorted(os.listdir(here)):
            with open(os.path.join(here, name), "rb") as mine, open(os.path.join(HOST_SCRIPTS, name), "rb") as host:
                self.assertEqual(mine.read(), host.read(), f"{name}: run 'bash clients/sync-scripts.sh'")


if __name__ == "__main__":
    unittest.main()
