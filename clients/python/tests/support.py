"""What the tests share: a private redis-server (or valkey-server: whatever `redis-server` is on PATH)
on a unix socket in a temp dir, never a TCP port."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import unittest

import redis

CLIENT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV_PYTHON = os.path.join(CLIENT_DIR, ".venv", "bin", "python")


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


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on now (never 6379: the system picks it)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ClusterServer:
    """A private one-node Redis Cluster (all 16384 slots) on a free TCP port of 127.0.0.1 (a cluster
    client finds its nodes by address, so not a unix socket); stopped by close()."""

    def __init__(self):
        self.port, bus = free_port(), free_port()  # the bus port too: port + 10000 may be out of range
        self.dir = tempfile.mkdtemp(prefix="hourglass-py-cluster-")
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--cluster-port", str(bus), "--bind", "127.0.0.1",
             "--cluster-enabled", "yes",
             "--cluster-config-file", os.path.join(self.dir, "nodes.conf"), "--save", "", "--appendonly", "no",
             "--dir", self.dir],
            stdout=subprocess.DEVNULL,
        )
        node = redis.Redis(host="127.0.0.1", port=self.port)
        deadline = time.monotonic() + 30
        added = False
        while True:
            try:
                if not added:
                    node.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
                    added = True
                if b"cluster_state:ok" in node.execute_command("CLUSTER", "INFO"):
                    break
            except (redis.ConnectionError, FileNotFoundError):
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.close()
                raise RuntimeError("redis-server did not start as a cluster")
            time.sleep(0.05)
        node.close()

    def close(self):
        self.proc.terminate()
        self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


class SentinelServer:
    """A master, its replica and one sentinel, each on a free TCP port of 127.0.0.1 (the sentinel
    names the master by address, so not unix sockets); ``SENTINEL FAILOVER`` works with one
    sentinel. Stopped by close()."""

    MASTER = "mymaster"

    def __init__(self):
        ports = set()
        while len(ports) < 3:
            ports.add(free_port())
        self.master_port, self.replica_port, self.sentinel_port = sorted(ports)
        self.dir = tempfile.mkdtemp(prefix="hourglass-py-sentinel-")
        self.procs = []
        for port, extra in ((self.master_port, []), (self.replica_port, ["--replicaof", "127.0.0.1", str(self.master_port)])):
            self.procs.append(subprocess.Popen(
                ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                 "--dir", self.dir, "--dbfilename", f"dump-{port}.rdb", *extra],
                stdout=subprocess.DEVNULL,
            ))
        conf = os.path.join(self.dir, "sentinel.conf")
        with open(conf, "w") as f:
            f.write(f"port {self.sentinel_port}\nbind 127.0.0.1\ndir {self.dir}\n"
                    f"sentinel monitor {self.MASTER} 127.0.0.1 {self.master_port} 1\n"
                    f"sentinel down-after-milliseconds {self.MASTER} 2000\n"
                    f"sentinel failover-timeout {self.MASTER} 4000\n")
        self.procs.append(subprocess.Popen(["redis-server", conf, "--sentinel"], stdout=subprocess.DEVNULL))
        deadline = time.monotonic() + 30
        while True:
            try:
                replica = redis.Redis(host="127.0.0.1", port=self.replica_port)
                linked = replica.info("replication").get("master_link_status") == "up"
                sentinel = redis.Redis(host="127.0.0.1", port=self.sentinel_port)
                known = sentinel.execute_command("SENTINEL", "REPLICAS", self.MASTER)
                if linked and known:
                    break
            except (redis.ConnectionError, redis.ResponseError):
                pass
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.procs):
                self.close()
                raise RuntimeError("the master, replica and sentinel did not start")
            time.sleep(0.05)

    def master_port_now(self) -> int:
        """The master's port as the sentinel names it now."""
        sentinel = redis.Redis(host="127.0.0.1", port=self.sentinel_port)
        return int(sentinel.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.MASTER)[1])

    def close(self):
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


class ServerTest(unittest.TestCase):
    """A test case with its own redis-server for the class, flushed before each test (``self.r``)."""

    @classmethod
    def setUpClass(cls):
        cls.server = Server()

    @classmethod
    def tearDownClass(cls):
        cls.server.close()

    def setUp(self):
        self.r = self.server.client()
        self.r.flushall()

