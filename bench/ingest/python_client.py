"""One run of `hourglass bench ingest` for the Python client: N tasks of one type written into the Redis at URL,
either with the client's `schedule_many` or with a raw redis-py pipeline of the same writes (ZADD due + HSET
payload per task, 1,000 tasks per round trip), as an application would write them. The tasks are built first;
what is timed is the write alone. Prints one JSON line: {"seconds": ..., "stored": ...}.

    python bench/ingest/python_client.py <redis URL> <many|raw> <N> <task type> <payload> <key prefix>
"""
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "clients", "python"))
import redis  # noqa: E402
import hourglass_client as hg  # noqa: E402

url, kind, n, task_type, payload, prefix = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6]
if url.startswith("redis+unix://"):
    url = "unix://" + url[len("redis+unix://"):]
r = redis.Redis.from_url(url)
due_key, payload_key = f"{prefix}:{{{task_type}}}:due", f"{prefix}:{{{task_type}}}:payload"
due = int(time.time() * 1000) + 3_600_000
ids = [f"{i:016x}" for i in range(n)]

if kind == "many":
    client = hg.Hourglass(r, prefix=prefix)
    client.schedule_many([hg.NewTask(f"{task_type}.warm", "w", payload=payload, at_ms=due)])  # scripts loaded
    tasks = [hg.NewTask(task_type, i, payload=payload, at_ms=due) for i in ids]
    started = time.perf_counter()
    client.schedule_many(tasks)
    seconds = time.perf_counter() - started
elif kind == "raw":
    started = time.perf_counter()
    pipe = r.pipeline(transaction=False)
    for k, i in enumerate(ids):
        pipe.zadd(due_key, {i: due})
        pipe.hset(payload_key, i, payload)
        if k % 1000 == 999:
            pipe.execute()
    pipe.execute()
    seconds = time.perf_counter() - started
else:
    sys.exit(f"unknown kind {kind!r}: many or raw")
print(json.dumps({"seconds": seconds, "stored": r.zcard(due_key)}))
