"""Bulk scheduling, measured: ``schedule_many`` against a raw redis-py pipeline of the same writes.

One process, one connection, into a private redis-server on a free local TCP port (never 6379),
started and stopped here. Prints one JSON line:

    .venv/bin/python bench_bulk.py [--tasks 100000] [--batch 1000]

``schedule_many`` runs the host's schedule script per task (the same checks and atomicity as
``schedule``); the raw pipeline is what an application could write by hand: ``ZADD`` + ``HSET``
per task, in pipelines of ``--batch`` tasks, with no checks.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import redis  # noqa: E402

import hourglass_client as hg  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(workdir: str) -> "tuple[subprocess.Popen[bytes], redis.Redis]":
    port = free_port()
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", workdir],
        stdout=subprocess.DEVNULL,
    )
    client = redis.Redis(host="127.0.0.1", port=port)
    deadline = time.monotonic() + 20
    while True:
        try:
            client.ping()
            return proc, client
        except redis.ConnectionError:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("redis-server did not start")
            time.sleep(0.05)


def server_us(r: redis.Redis, *commands: str) -> int:
    """Microseconds Redis spent in ``commands`` since the last CONFIG RESETSTAT."""
    stats = r.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("usec", 0)) for c in commands)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=1000, help="tasks per pipeline of the raw writes")
    opts = ap.parse_args()
    workdir = tempfile.mkdtemp(prefix="hourglass-bench-")
    proc, r = start_server(workdir)
    try:
        n, client = opts.tasks, hg.Hourglass(r)
        client.schedule("warm", "up")  # loads the script, as an application's first call would

        r.flushall()
        r.config_resetstat()
        now = hg.now_ms()
        tasks = [hg.NewTask("bench.bulk", f"task-{i}", payload=f'{{"n":{i}}}', delay_ms=600_000) for i in range(n)]
        started = time.perf_counter()
        written = client.schedule_many(tasks)
        bulk_s = time.perf_counter() - started
        assert all(written) and r.zcard("hourglass:{bench.bulk}:due") == n
        bulk_server_us = server_us(r, "evalsha")

        r.flushall()
        r.config_resetstat()
        started = time.perf_counter()
        due, payload = "hourglass:{bench.raw}:due", "hourglass:{bench.raw}:payload"
        for start in range(0, n, opts.batch):
            pipe = r.pipeline(transaction=False)
            for i in range(start, min(n, start + opts.batch)):
                pipe.zadd(due, {f"task-{i}": now + 600_000})
                pipe.hset(payload, f"task-{i}", f'{{"n":{i}}}')
            pipe.execute()
        raw_s = time.perf_counter() - started
        assert r.zcard(due) == n
        raw_server_us = server_us(r, "zadd", "hset")

        info = r.info("server")
        print(json.dumps({
            "bench": "python-bulk",
            "tasks": n,
            "schedule_many_per_s": round(n / bulk_s),
            "raw_pipeline_per_s": round(n / raw_s),
            "schedule_many_s": round(bulk_s, 3),
            "raw_pipeline_s": round(raw_s, 3),
            # Redis's own time per task (INFO commandstats): the schedule script's checks, or ZADD + HSET.
            "schedule_many_server_us_per_task": round(bulk_server_us / n, 2),
            "raw_pipeline_server_us_per_task": round(raw_server_us / n, 2),
            "server": f"{'valkey' if 'valkey_version' in info else 'redis'} {info.get('redis_version')}",
            "redis_py": redis.__version__,
            "hiredis": bool(getattr(redis.utils, "HIREDIS_AVAILABLE", False)),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
        }))
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
