"""The clients behind Redis Sentinel: redis-py's ``Sentinel(...).master_for(...)`` connection, a durable
schedule (``replicas=N``: ``WAIT N`` after the write) and a failover between two schedules."""

from __future__ import annotations

import asyncio
import time
import unittest

import redis
import redis.asyncio.sentinel
from redis.sentinel import Sentinel
from support import ClusterServer, SentinelServer

import hourglass_client as hg


class SentinelTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = SentinelServer()

    @classmethod
    def tearDownClass(cls):
        cls.server.close()

    def setUp(self):
        self.sentinel = Sentinel([("127.0.0.1", self.server.sentinel_port)], socket_timeout=2)
        self.master = self.sentinel.master_for(SentinelServer.MASTER, socket_timeout=2)
        self.client = hg.Hourglass(self.master)

    def on_replica(self, key: str, member: str) -> bool:
        port = self.server.replica_port if self.server.master_port_now() == self.server.master_port else self.server.master_port
        return redis.Redis(host="127.0.0.1", port=port).zscore(key, member) is not None

    def test_a_schedule_acknowledged_by_a_replica_is_on_the_replica(self):
        self.assertTrue(self.client.schedule("sent", "durable", delay_ms=60_000, payload=b"x", replicas=1))
        # WAIT 1 returned 1: the replica has it now, no polling needed.
        self.assertTrue(self.on_replica("hourglass:{sent}:due", "durable"))
        written = self.client.schedule_many(
            [hg.NewTask("sent", f"bulk-{i}", delay_ms=60_000) for i in range(2500)], replicas=1
        )
        self.assertEqual(written, [True] * 2500)
        self.assertTrue(self.on_replica("hourglass:{sent}:due", "bulk-2499"))

    def test_fewer_replicas_than_asked_is_a_typed_error_after_the_write(self):
        with self.assertRaises(hg.ReplicationTimeout) as caught:
            self.client.schedule("sent", "two", delay_ms=60_000, replicas=2, replicas_timeout_ms=100)
        self.assertEqual((caught.exception.acked, caught.exception.wanted), (1, 2))
        self.assertEqual(caught.exception.code, "HG_REPLICATION_TIMEOUT")
        self.assertIn("1 of 2 replicas", str(caught.exception))
        # The write itself happened on the master.
        self.assertIsNotNone(self.master.zscore("hourglass:{sent}:due", "two"))
        with self.assertRaises(hg.ReplicationTimeout) as bulk:
            self.client.schedule_many([hg.NewTask("sent", "b2")], replicas=2, replicas_timeout_ms=100)
        self.assertIn("tasks 0 to 0 were sent", str(bulk.exception))

    def test_bad_replicas_arguments_are_refused_before_anything_is_sent(self):
        for kwargs in ({"replicas": 0}, {"replicas": True}, {"replicas": "1"}, {"replicas_timeout_ms": 100},
                       {"replicas": 1, "replicas_timeout_ms": 0}):
            with self.subTest(kwargs=kwargs), self.assertRaises(hg.InvalidArgument):
                self.client.schedule("sent", "bad", **kwargs)
        self.assertIsNone(self.master.zscore("hourglass:{sent}:due", "bad"))

    def test_asyncio_through_the_sentinel(self):
        async def go() -> bool:
            sentinel = redis.asyncio.sentinel.Sentinel([("127.0.0.1", self.server.sentinel_port)], socket_timeout=2)
            master = sentinel.master_for(SentinelServer.MASTER, socket_timeout=2)
            try:
                return await hg.AsyncHourglass(master).schedule("sent", "async", delay_ms=60_000, replicas=1)
            finally:
                await master.aclose()

        self.assertTrue(asyncio.run(go()))
        self.assertTrue(self.on_replica("hourglass:{sent}:due", "async"))

    def test_zz_a_failover_between_two_schedules(self):
        # Last in the class (zz): the master moves for good.
        before = self.server.master_port_now()
        self.assertTrue(self.client.schedule("sent", "before", delay_ms=60_000, replicas=1))
        redis.Redis(host="127.0.0.1", port=self.server.sentinel_port).execute_command(
            "SENTINEL", "FAILOVER", SentinelServer.MASTER
        )
        deadline = time.monotonic() + 30
        while self.server.master_port_now() == before:
            self.assertLess(time.monotonic(), deadline, "the sentinel did not fail over")
            time.sleep(0.05)
        # redis-py's Sentinel pool finds the new master; the first call may meet the old one (now a
        # replica: READONLY, nothing written) and fail with ConnectionError, as a retry loop expects.
        written = None
        while written is None:
            try:
                written = self.client.schedule("sent", "after", delay_ms=60_000, replicas=1, replicas_timeout_ms=1000)
            except (redis.ConnectionError, hg.ReplicationTimeout):
                # ReplicationTimeout: the old master is not yet the new one's replica.
                self.assertLess(time.monotonic(), deadline, "no schedule went through after the failover")
                time.sleep(0.1)
        self.assertTrue(written)
        new_master = redis.Redis(host="127.0.0.1", port=self.server.master_port_now())
        self.assertIsNotNone(new_master.zscore("hourglass:{sent}:due", "before"))
        self.assertIsNotNone(new_master.zscore("hourglass:{sent}:due", "after"))


class ClusterReplicasTest(unittest.TestCase):
    def test_replicas_is_refused_on_a_cluster_client(self):
        server = ClusterServer()
        try:
            client = hg.Hourglass(redis.RedisCluster(host="127.0.0.1", port=server.port))
            with self.assertRaises(hg.InvalidArgument) as caught:
                client.schedule("sent", "c", replicas=1)
            self.assertIn("Redis Cluster", str(caught.exception))
        finally:
            server.close()


if __name__ == "__main__":
    unittest.main()
