"""The clients on a Redis Cluster (one node holding every slot): what goes through redis-py's cluster
pipeline (schedule_many, wait's group lookup) and the blocking stream read."""

from __future__ import annotations

import asyncio
import threading
import time
import unittest

import redis
import redis.asyncio
from support import ClusterServer

import hourglass_client as hg
from hourglass_client import Child, NewTask, Outcome


class ClusterTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = ClusterServer()

    @classmethod
    def tearDownClass(cls):
        cls.server.close()

    def setUp(self):
        self.r = redis.RedisCluster(host="127.0.0.1", port=self.server.port, socket_timeout=0.4)
        self.r.flushall()
        self.hg = hg.Hourglass(self.r, shards={"hot": 4})

    def tearDown(self):
        self.r.close()

    def test_schedule_many_routes_every_task_to_its_slot(self):
        self.r.script_flush()
        tasks = [NewTask("hot" if i % 3 else "cold", f"t-{i}", payload=str(i), delay_ms=600_000) for i in range(1500)]
        written = self.hg.schedule_many(tasks + [NewTask("cold", "t-0", mode="if-absent")])
        self.assertEqual((len(written), written.count(False)), (1501, 1))
        self.assertEqual(self.hg.stats("hot").scheduled_later, 1000)
        self.assertEqual(self.hg.show("hot", "t-1").task_type, self.hg.shard_for("hot", "t-1"))
        self.assertEqual(self.r.hget("hourglass:{cold}:payload", "t-0"), b"0")

    def test_a_graph_over_several_slots(self):
        # Its lookups go through a cluster pipeline, its roots are delivered per shard.
        nodes = [hg.Node(f"r{i}", ("hot", "cold", "mail")[i % 3]) for i in range(40)]
        nodes.append(hg.Node("end", "cold", parents=[n.name for n in nodes]))
        self.assertEqual(self.hg.graph_submit("flow", "g", nodes), hg.Declared(41, 40, 40))
        self.assertEqual(self.hg.show("hot", "g/r3").graph, "flow/g")
        shown = self.hg.graph_show("flow", "g")
        assert shown is not None
        self.assertEqual(shown.counts["scheduled"], 40)

    def test_wait_reads_the_stream_and_finds_a_groups_callback(self):
        self.r.xadd("hourglass:{job}:events", {"id": "none", "outcome": "succeeded", "attempt": 1})
        self.hg.group_open("job", "g", callback_id="cb")
        self.hg.group_add("job", "g", [Child("step", "s-1", due_ms=hg.now_ms() + 600_000)])

        def complete():
            time.sleep(0.3)
            self.hg.cancel("step", "s-1")
            self.r.hset("hourglass:{job}:group:g", mapping={"state": "done", "fired": "callback"})
            self.r.zadd("hourglass:{job}:due", {"cb": 1})
            time.sleep(0.3)
            self.r.xadd("hourglass:{job}:events", {"id": "cb", "outcome": "succeeded", "attempt": 1, "finished_ms": 7})

        thread = threading.Thread(target=complete)
        thread.start()
        self.assertEqual(self.hg.wait("job", "cb", timeout_ms=10_000), hg.Ended(Outcome.SUCCEEDED, 1, None, 7))
        thread.join()

    def test_the_asyncio_cluster_client(self):
        async def main():
            r = redis.asyncio.RedisCluster(host="127.0.0.1", port=self.server.port)
            await r.script_flush()
            client = hg.AsyncHourglass(r, shards={"hot": 4})
            written = await client.schedule_many([NewTask("hot", f"a-{i}", delay_ms=600_000) for i in range(1100)])
            self.assertEqual(written.count(True), 1100)
            self.assertEqual((await client.stats("hot")).scheduled_later, 1100)
            await r.xadd("hourglass:{job}:events", {"id": "old", "outcome": "dead", "attempt": 2, "error": "no"})
            self.assertEqual(await client.wait("job", "old"), hg.Ended(Outcome.DEAD, 2, "no", None))
            await r.aclose()

        asyncio.run(main())


if __name__ == "__main__":
    unittest.main()
