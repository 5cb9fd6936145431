"""Redis CPU per scheduled task, side by side on one private redis-server: a raw ZADD+HSET pipeline,
one schedule.lua call per task (what schedule_many sent before issue 66), and the Python client's
schedule_many (one schedule_batch.lua call per type and batch); then how long one schedule_batch call
holds Redis, by payload size.

    clients/python/.venv/bin/python bench/ingest/redis_cpu.py [tasks]    # default 100000

It starts the redis-server on PATH (Valkey too) on a unix socket in a temporary folder, and reads
Redis's own CPU time (INFO cpu) before and after each run, and INFO commandstats for the per-call time.
"""
import os, subprocess, sys, tempfile, time
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "clients/python"))
import redis, hourglass_client as hg

N = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
d = tempfile.mkdtemp()
sock = os.path.join(d, "r.sock")
srv = subprocess.Popen(["redis-server", "--port", "0", "--unixsocket", sock, "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL)
for _ in range(100):
    if os.path.exists(sock): break
    time.sleep(0.05)
r = redis.Redis(unix_socket_path=sock)
r.ping()

def cpu():
    i = r.info("cpu")
    return i["used_cpu_sys"] + i["used_cpu_user"]

payload = "x" * 32
due = int(time.time() * 1000) + 3_600_000

def raw(t):
    p = r.pipeline(transaction=False)
    for i in range(N):
        p.zadd(f"hourglass:{{{t}}}:due", {f"id-{i}": due})
        p.hset(f"hourglass:{{{t}}}:payload", f"id-{i}", payload)
        if i % 1000 == 999:
            p.execute()
    p.execute()

prelude = open(os.path.join(ROOT, "host/store/src/scripts/prelude.lua")).read()
single = r.register_script(prelude + open(os.path.join(ROOT, "host/store/src/scripts/schedule.lua")).read())

def per_task(t):
    p = r.pipeline(transaction=False)
    for i in range(N):
        single(keys=[f"hourglass:{{{t}}}:due", f"hourglass:{{{t}}}:payload"], args=[f"id-{i}", due, payload, "1", "upsert"], client=p)
        if i % 1000 == 999:
            p.execute()
    p.execute()

client = hg.Hourglass(r)
def many(t):
    client.schedule_many([hg.NewTask(t, f"id-{i}", payload=payload, at_ms=due) for i in range(N)])

for name, fn in [("raw ZADD+HSET pipeline", raw), ("schedule.lua per task (before)", per_task), ("schedule_many (schedule_batch.lua)", many)]:
    for rep in range(2):
        r.flushall()
        t = f"m{rep}"
        c0, w0 = cpu(), time.perf_counter()
        fn(t)
        c1, w1 = cpu(), time.perf_counter()
        assert r.zcard(f"hourglass:{{{t}}}:due") == N
        print(f"{name:40s} run {rep}: Redis CPU {1e6 * (c1 - c0) / N:5.2f} us/task, {N / (w1 - w0):8.0f} tasks/s")
srv.terminate()

# How long one schedule_batch call holds Redis, by payload size (commandstats of EVALSHA).
srv = subprocess.Popen(["redis-server", "--port", "0", "--unixsocket", sock + "2", "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL)
for _ in range(100):
    if os.path.exists(sock + "2"): break
    time.sleep(0.05)
r = redis.Redis(unix_socket_path=sock + "2")
client = hg.Hourglass(r)
for size, n in [(32, 100_000), (1024, 50_000), (65536, 2_000)]:
    r.flushall(); r.config_resetstat()
    body = "y" * size
    client.schedule_many([hg.NewTask("sized", f"id-{i}", payload=body, at_ms=due) for i in range(n)])
    st = r.info("commandstats").get("cmdstat_evalsha", {})
    print(f"payload {size:6d} B: {st.get('calls')} calls, {st.get('usec_per_call')} us per call, {st.get('usec', 0) / n:.2f} us/task")
srv.terminate()
