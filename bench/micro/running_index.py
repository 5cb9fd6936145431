"""What the running-id index's own commands cost in Redis, per id (BENCHMARKS.md, round 20).

Compares, against a private redis-server, three ways a claim/settle pair can
treat the ids of a claim of 64 (3,000 claims, 4 in flight, each claim's ids
read by its script from a sorted set, as claim.lua reads `due`):
  none  the claim reads its ids, the settle gets none (no index);
  set   SADD at the claim, SREM of the ids the host sends at the settle (shipped);
  zset  ZADD scored by token at the claim, one ZREMRANGEBYSCORE over the
        claim's tokens at the settle (the host would send no ids).
Script time comes from INFO commandstats (EVALSHA), five rounds each.

    redis-server --port 0 --unixsocket /tmp/ri.sock --save "" --daemonize yes
    clients/python/.venv/bin/python bench/micro/running_index.py /tmp/ri.sock
"""

import statistics
import sys

import redis

IDS_PER_CLAIM, CLAIMS, IN_FLIGHT, ROUNDS = 64, 3000, 4, 5
# One member over 64 bytes keeps a set a hash table and a sorted set a
# skiplist, as the scripts keep `running` (a small listpack is scanned).
LONG = "x" * 80

r = redis.Redis(unix_socket_path=sys.argv[1])
CLAIM = {
    "none": r.register_script("return #redis.call('ZRANGE', KEYS[1], ARGV[1], ARGV[2])"),
    "set": r.register_script(
        """local ids = redis.call('ZRANGE', KEYS[1], ARGV[1], ARGV[2])
return redis.call('SADD', KEYS[2], unpack(ids))"""
    ),
    "zset": r.register_script(
        """local ids = redis.call('ZRANGE', KEYS[1], ARGV[1], ARGV[2])
local token, scored = tonumber(ARGV[3]), {}
for k, id in ipairs(ids) do scored[2 * k - 1] = token + k - 1; scored[2 * k] = id end
return redis.call('ZADD', KEYS[2], 'NX', unpack(scored))"""
    ),
}
SETTLE = {
    "none": r.register_script("return 0"),
    "set": r.register_script("return redis.call('SREM', KEYS[1], unpack(ARGV))"),
    "zset": r.register_script("return redis.call('ZREMRANGEBYSCORE', KEYS[1], ARGV[1], ARGV[2])"),
}

ids = ["task-%08d" % i for i in range(IDS_PER_CLAIM * CLAIMS)]
r.delete("src")
pipe = r.pipeline(transaction=False)
for i in range(0, len(ids), 1000):
    pipe.zadd("src", {x: i + j for j, x in enumerate(ids[i : i + 1000])})
pipe.execute()


def per_id_us(kind):
    r.delete("running")
    if kind == "set":
        r.sadd("running", LONG)
    elif kind == "zset":
        r.zadd("running", {LONG: 0})
    r.config_resetstat()
    in_flight, token = [], 1
    for c in range(CLAIMS):
        lo = c * IDS_PER_CLAIM
        CLAIM[kind](keys=["src", "running"], args=[lo, lo + IDS_PER_CLAIM - 1, token])
        in_flight.append((token, ids[lo : lo + IDS_PER_CLAIM]))
        token += IDS_PER_CLAIM
        if len(in_flight) > IN_FLIGHT:
            first, its = in_flight.pop(0)
            args = {"none": [], "set": its, "zset": [first, first + IDS_PER_CLAIM - 1]}[kind]
            SETTLE[kind](keys=["running"], args=args)
    return r.info("commandstats")["cmdstat_evalsha"]["usec"] / (CLAIMS * IDS_PER_CLAIM)


runs = {}
for n in range(ROUNDS):
    for kind in ["none", "set", "zset"] if n % 2 == 0 else ["zset", "set", "none"]:
        runs.setdefault(kind, []).append(per_id_us(kind))
base = statistics.median(runs["none"])
for kind, us in runs.items():
    med = statistics.median(us)
    print(f"{kind:5} {med:.3f} µs per id (over none {med - base:+.3f}); runs {[round(u, 3) for u in us]}")
