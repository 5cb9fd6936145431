"""What a workflow graph costs (BENCHMARKS.md, "Workflow graphs"): declare one of N nodes and E edges, drain it.

Starts a private redis-server and a release host (`target/release/hourglass`) serving the no-op
plugin for the nodes' type and the home type, declares a layered graph with the CLI (every node
after the first layer waits for 2 nodes of earlier layers, and some for a third, up to --edges), and
times the declaration (wall, and the script's own time from Redis's commandstats), the drain
(from the declaration to the graph's `done`), and Redis memory per node while it waits.

    python3 bench/graph.py [--nodes 10000] [--width 100] [--port 6461]
"""

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cli(port, *args):
    return subprocess.run(["redis-cli", "-p", str(port), *args], capture_output=True, text=True, check=True).stdout


def info(port, section):
    out = {}
    for line in cli(port, "INFO", section).splitlines():
        if ":" in line:
            k, v = line.split(":", 1)
            out[k] = v.strip()
    return out


def script_usec(port):
    """Microseconds Redis spent in scripts (EVALSHA and EVAL), from commandstats."""
    total = 0
    for k, v in info(port, "commandstats").items():
        if k in ("cmdstat_evalsha", "cmdstat_eval"):
            total += int(dict(p.split("=") for p in v.split(","))["usec"])
    return total


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--nodes", type=int, default=10_000)
    p.add_argument("--width", type=int, default=100, help="nodes per layer")
    p.add_argument("--edges", type=int, default=20_000, help="edges in all (a third parent for some nodes)")
    p.add_argument("--port", type=int, default=6461)
    a = p.parse_args()
    rng = random.Random(7)
    nodes = []
    for i in range(a.nodes):
        layer = i // a.width
        parents = [] if layer == 0 else sorted({f"n{rng.randrange(0, layer * a.width)}" for _ in range(2)})
        while layer and len(parents) < 2:
            parents = sorted(set(parents) | {f"n{rng.randrange(0, layer * a.width)}"})
        nodes.append({"name": f"n{i}", "type": "gwork", "parents": parents})
    edges = sum(len(n["parents"]) for n in nodes)
    # Up to --edges: a third parent for nodes from the last layer up.
    for n in reversed(nodes):
        if edges >= a.edges:
            break
        i = int(n["name"][1:])
        layer = i // a.width
        extra = [f"n{j}" for j in range(layer * a.width) if f"n{j}" not in n["parents"]][:1]
        if extra:
            n["parents"].append(extra[0])
            edges += 1
    work = tempfile.mkdtemp(prefix="hourglass-graph-")
    plugins = os.path.join(work, "plugins")
    os.makedirs(plugins)
    for t in ("gwork", "gflow"):
        shutil.copy(os.path.join(ROOT, "plugins", "noop.wasm"), os.path.join(plugins, f"{t}.wasm"))
    with open(os.path.join(work, "runner.toml"), "w") as f:
        f.write(f'[redis]\nurl = "redis://127.0.0.1:{a.port}"\n[runner]\nplugins_dir = "{plugins}"\n')
    graph_file = os.path.join(work, "graph.json")
    with open(graph_file, "w") as f:
        json.dump({"nodes": nodes}, f)
    redis = subprocess.Popen(["redis-server", "--port", str(a.port), "--save", "", "--appendonly", "no"],
                             stdout=subprocess.DEVNULL)
    host = None
    try:
        time.sleep(0.5)
        exe = os.path.join(ROOT, "target", "release", "hourglass")
        config = os.path.join(work, "runner.toml")
        # Declared before any host runs, so Redis's script time is the declaration's alone (and the
        # roots' scheduling, which the CLI does at once); the memory is read while every node waits.
        mem0, scripts0 = int(info(a.port, "memory")["used_memory"]), script_usec(a.port)
        t0 = time.monotonic()
        out = subprocess.run([exe, "--config", config, "graph", "submit", "gflow", "big", graph_file],
                             capture_output=True, text=True)
        declared = time.monotonic() - t0
        if out.returncode != 0:
            sys.exit(f"submit failed: {out.stderr}")
        declare_ms = (script_usec(a.port) - scripts0) / 1000
        mem1 = int(info(a.port, "memory")["used_memory"])
        log_path = os.path.join(work, "host.log")
        host = subprocess.Popen([exe, "--config", config, "run"], stdout=subprocess.DEVNULL, stderr=open(log_path, "w"))
        while "hourglass is running" not in open(log_path).read():
            time.sleep(0.01)
        t1 = time.monotonic()
        while cli(a.port, "HGET", "hourglass:{gflow}:graph:big", "state").strip() != "done":
            time.sleep(0.01)
        drained = time.monotonic() - t1
        counts = cli(a.port, "HMGET", "hourglass:{gflow}:graph:big", "succeeded", "skipped", "dead").split()
        print(json.dumps({
            "nodes": a.nodes, "edges": edges, "width": a.width,
            "declare_wall_s": round(declared, 3),
            "declare_redis_script_ms": round(declare_ms, 1),
            "drain_wall_s_from_host_start": round(drained, 3),
            "nodes_per_s": round(a.nodes / drained),
            "redis_bytes_per_node_declared": round((mem1 - mem0) / a.nodes),
            "succeeded": int(counts[0]), "skipped": int(counts[1]), "dead": int(counts[2]),
            "cores": os.cpu_count(),
        }))
    finally:
        if host:
            host.terminate()
            host.wait()
        redis.terminate()
        redis.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
