"""The Python client against a real redis-server (or valkey-server: whatever `redis-server` is on PATH),
started by the test on a unix socket in a temp dir."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import tempfile
import time
import unittest
from datetime import datetime, timedelta, timezone

import redis
import redis.asyncio

import hourglass_client as hg
from hourglass_client import Child, Hourglass

HOST_SCRIPTS = os.path.join(os.path.dirname(__file__), "..", "..", "..", "host", "store", "src", "scripts")


class Server:
    """A private redis-server on a unix socket; stopped by close()."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="hourglass-py-")
        self.socket = os.path.join(self.dir, "redis.sock")
        self.proc = subprocess.Popen(
            ["redis-server", "--port", "0", "--unixsocket", self.socket, "--save", "", "--appendonly", "no",
             "--dir", self.dir],
            stdout=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while True:
            try:
                redis.Redis(unix_socket_path=self.socket).ping()
                break
            except (redis.ConnectionError, FileNotFoundError):
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("redis-server did not start")
                time.sleep(0.05)

    def client(self) -> redis.Redis:
        return redis.Redis(unix_socket_path=self.socket)

    def close(self):
        self.proc.terminate()
        self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


class ClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server()

    @classmethod
    def tearDownClass(cls):
        cls.server.close()

    def setUp(self):
        self.r = self.server.client()
        self.r.flushall()
        self.hg = Hourglass(self.r)

    def test_schedule_writes_the_contract_keys_and_each_mode_keeps_its_promise(self):
        due = int(datetime(2030, 1, 1, tzinfo=timezone.utc).timestamp() * 1000)
        self.assertTrue(self.hg.schedule("order.timeout", "o-1", at=due, payload=b'{"order":1}'))
        self.assertEqual(self.r.zscore("hourglass:{order.timeout}:due", "o-1"), due)
        self.assertEqual(self.r.hget("hourglass:{order.timeout}:payload", "o-1"), b'{"order":1}')
        # if-absent keeps the first schedule and its payload.
        self.assertFalse(self.hg.schedule("order.timeout", "o-1", at=due + 5, payload="second", mode="if-absent"))
        self.assertEqual(self.r.hget("hourglass:{order.timeout}:payload", "o-1"), b'{"order":1}')
        # only-later postpones, never brings forward.
        self.assertFalse(self.hg.schedule("order.timeout", "o-1", at=due - 1, mode="only-later"))
        self.assertTrue(self.hg.schedule("order.timeout", "o-1", at=due + 10, mode="only-later"))
        self.assertTrue(self.hg.schedule("order.timeout", "o-1", at=due + 1, mode="only-earlier"))
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
        self.hg.schedule("device.offline", "d-1", delay=30)
        moved = self.hg.postpone("device.offline", "d-1", 60)
        self.assertEqual(self.r.zscore("hourglass:{device.offline}:due", "d-1"), moved)
        self.assertGreater(moved, hg.now_ms() + 80_000)
        now = self.hg.run_now("device.offline", "d-1")
        self.assertLessEqual(abs(now - hg.now_ms()), 60_000)
        self.assertIsNone(self.hg.postpone("device.offline", "nobody", 5))
        self.assertIsNone(self.hg.run_now("device.offline", "nobody"))
        self.assertFalse(self.r.exists("hourglass:{device.offline}:due") and self.r.zscore(
            "hourglass:{device.offline}:due", "nobody"))

    def test_show_and_cancel_a_waiting_task(self):
        self.hg.schedule("order.timeout", "o-2", delay=600, payload="x" * 100, traceparent="00-" + "c" * 32 + "-" + "d" * 16 + "-01")
        view = self.hg.show("order.timeout", "o-2", payload_bytes=10)
        self.assertEqual((view.state, view.payload_size, view.payload), ("scheduled", 100, b"x" * 10))
        self.assertGreater(view.due_ms, view.now_ms)
        self.assertIsNone(view.running)
        self.assertEqual(self.hg.cancel("order.timeout", "o-2"), hg.Cancelled("scheduled"))
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
        self.hg.schedule("order.timeout", "o-4", at=hg.now_ms() - 1000)
        self.assertEqual(self.hg.show("order.timeout", "o-4").state, "due")

    def test_pause_resume_and_stats(self):
        for i in range(3):
            self.hg.schedule("report", f"r-{i}", delay=600)
        self.hg.schedule("report", "now", at=hg.now_ms() - 5)
        stats = self.hg.stats("report")
        self.assertEqual((stats.due_now, stats.scheduled_later, stats.in_flight, stats.paused_ms), (1, 3, 0, None))
        self.assertIsNone(self.hg.pause("report"))
        self.assertEqual(self.hg.stats("report").paused_ms, 0)
        self.assertTrue(self.hg.resume("report"))
        self.assertFalse(self.hg.resume("report"))
        ends = self.hg.pause("report", length=60)
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
        self.assertEqual(self.hg.group_seal("order.ship", "o-17"), "sealed")
        self.assertEqual(self.hg.group_seal("order.ship", "o-17"), "already")
        view = self.hg.group_show("order.ship", "o-17")
        self.assertEqual((view.state, view.added, view.pending, view.callback_id), ("sealed", 2, 2, "o-17"))
        with self.assertRaises(hg.GroupClosed):
            self.hg.group_add("order.ship", "o-17", [Child("order.mail", "late")])
        self.assertEqual(self.r.zcard("hourglass:{order.mail}:due"), 0, "a refused add schedules nothing")

        # An empty group sealed completes at once: its callback is due now, with the summary.
        self.hg.group_open("done", "empty", callback_id="cb", payload="p")
        self.assertEqual(self.hg.group_seal("done", "empty"), "completed:callback")
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
            self.hg.postpone("ok", "id", -5)
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
        self.assertEqual(self.r.keys("hourglass:{bad}:*"), [])

    def test_a_client_that_decodes_replies_is_refused_at_construction(self):
        for client in (
            redis.Redis(unix_socket_path=self.server.socket, decode_responses=True),
            redis.asyncio.Redis(unix_socket_path=self.server.socket, decode_responses=True),
        ):
            with self.assertRaises(hg.InvalidArgument) as caught:
                (hg.AsyncHourglass if isinstance(client, redis.asyncio.Redis) else Hourglass)(client)
            self.assertIn("decode_responses", str(caught.exception))

    def test_a_sharded_type_routes_each_id_to_its_shard(self):
        client = Hourglass(self.r, shards={"hot": 3})
        tags = hg.shard_tags("hot", 3)
        self.assertEqual(tags[0], "hot")
        ids = [f"t-{i}" for i in range(30)]
        for i in ids:
            client.schedule("hot", i, delay=600)
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
            self.assertTrue(await client.schedule("order.timeout", "a-1", delay=600, payload="p", traceparent="00-" + "e" * 32 + "-" + "f" * 16 + "-01"))
            self.assertFalse(await client.schedule("order.timeout", "a-1", delay=900, mode="if-absent"))
            view = await client.show("order.timeout", "a-1")
            self.assertEqual((view.state, view.payload), ("scheduled", b"p"))
            self.assertIsNotNone(await client.postpone("order.timeout", "a-1", 60))
            self.assertEqual((await client.cancel("order.timeout", "a-1")).state, "scheduled")
            await client.schedule("hot", "h-1", delay=600)
            self.assertEqual((await client.show("hot", "h-1")).task_type, client.shard_for("hot", "h-1"))
            self.assertEqual((await client.stats("hot")).scheduled_later, 1)
            self.assertIsNone(await client.pause("hot"))
            self.assertTrue(await client.resume("hot"))
            self.assertTrue(await client.group_open("done", "ag"))
            added = await client.group_add("done", "ag", [Child("step", "s-1", due_ms=hg.now_ms() + 600_000)])
            self.assertEqual(added.joined, 1)
            self.assertEqual(await client.group_seal("done", "ag"), "sealed")
            self.assertEqual((await client.group_show("done", "ag")).pending, 1)
            with self.assertRaises(hg.GroupClosed):
                await client.group_add("done", "ag", [Child("step", "late")])
            with self.assertRaises(hg.NoSuchGroup):
                await client.group_seal("done", "never")
            await r.aclose()

        asyncio.run(main())
        # What the asyncio client wrote is what the blocking one reads.
        self.assertEqual(self.hg.group_show("done", "ag").state, "sealed")

    def test_the_shipped_scripts_are_the_hosts(self):
        here = os.path.join(os.path.dirname(hg.__file__), "scripts")
        for name in sorted(os.listdir(here)):
            with open(os.path.join(here, name), "rb") as mine, open(os.path.join(HOST_SCRIPTS, name), "rb") as host:
                self.assertEqual(mine.read(), host.read(), f"{name}: run 'bash clients/sync-scripts.sh'")


if __name__ == "__main__":
    unittest.main()
