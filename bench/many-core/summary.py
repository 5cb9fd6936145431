#!/usr/bin/env python3
"""Summarises run.sh's many-core.jsonl: medians per run and the ratios the
issues and BENCHMARKS.md report (ratios compare runs of one sitting only).

    python3 bench/many-core/summary.py out/many-core.jsonl
"""

import json
import statistics
import sys


def main(path):
    runs = [json.loads(line) for line in open(path, encoding="utf-8") if line.strip()]
    machine = next((r for r in runs if r["run"] == "machine"), {})
    print(f"{machine.get('cores')} cores, {machine.get('model')}, kernel {machine.get('kernel')}, "
          f"commit {machine.get('commit')}, {machine.get('tasks')} tasks per burst")
    for r in runs:
        if r["run"] == "quickstart":
            print(f"quick start: {'ok' if r['ok'] else 'FAILED'}, ready in {r['ready_ms']} ms, "
                  f"{r['plugins_refused']} plugins refused{', missing: ' + r['missing'] if r['missing'] else ''}")
        elif "error" in r:
            print(f"{r['run']}: {r['error']}")

    by_run = {}
    instances = {}
    for r in runs:
        if "result" not in r:
            continue
        if r["result"].get("scenario") == "instance":
            instances[r["run"]] = r["result"]
        else:
            by_run.setdefault(r["run"], []).append(r["result"])
    medians = {}
    print(f"\n{'run':40} {'host CPU µs/task':>18} {'tasks/s':>10} {'busiest master µs':>18}  lost/doubled")
    for name, results in by_run.items():
        cpu = median(results, "host_cpu_us_per_task")
        rate = median(results, "tasks_per_s")
        master = median(results, "busiest_master_cpu_us_per_task")
        medians[name] = (cpu, rate, master)
        lost = sum(x.get("lost", 0) for x in results)
        doubled = sum(x.get("doubled", 0) for x in results)
        print(f"{name:40} {fmt(cpu):>18} {fmt(rate, 0):>10} {fmt(master):>18}  {lost}/{doubled} ({len(results)} runs)")

    def ratio(label, a, b, index=0):
        if a in medians and b in medians and medians[a][index] and medians[b][index]:
            print(f"{label}: {medians[a][index] / medians[b][index]:.2f}x")

    print()
    ratio("host CPU per task, cores+cores / 2+2, fresh", "cores+cores", "2+2")
    ratio("host CPU per task, cores+cores / 2+2, reuse", "cores+cores reuse", "2+2 reuse")
    for threads in ("default", "2+2", "cores+cores"):
        ratio(f"host CPU per task, fresh / reuse, {threads}", threads, f"{threads} reuse")
    quartered = "4 hosts, cores/4 handler threads each"
    ratio("host CPU per task, 4 hosts of cores/4 handler threads / 1 host, default", quartered, "default")
    ratio("tasks/s, 4 hosts of cores/4 handler threads / 1 host, default", quartered, "default", 1)
    spread = "4 processes, cores/4 handler threads each"
    ratio("host CPU per task, 4 processes of cores/4 handler threads / 1 process", spread, "1 process")
    ratio("tasks/s, 4 processes of cores/4 handler threads / 1 process", spread, "1 process", 1)
    # The same slots in all: what the split into processes itself changes.
    ratio("host CPU per task, 4 processes / 1 process with 4x the slots", spread, "1 process, 4x the slots")
    ratio("tasks/s, 4 processes / 1 process with 4x the slots", spread, "1 process, 4x the slots", 1)
    ratio("tasks/s, cluster shards 3 / shards 1", "cluster 4 hosts, shards 3", "cluster 4 hosts, shards 1", 1)
    ratio("busiest master CPU, shards 3 / shards 1", "cluster 4 hosts, shards 3", "cluster 4 hosts, shards 1", 2)
    ratio("tasks/s, Hourglass / BullMQ", "default, beside bullmq", "bullmq", 1)

    if instances:
        print(f"\n{'instance (no Redis)':42} {'lanes':>5} {'engines':>7} {'fresh µs/run':>13} {'warm µs/run':>12}")
        for name, x in instances.items():
            print(f"{name:42} {x.get('parallel', 1):>5} {x.get('engines', 1):>7} "
                  f"{fmt(x.get('fresh_cpu_us_per_run')):>13} {fmt(x.get('reuse_cpu_us_per_run')):>12}")
        one, several = instances.get("instance, cores lanes, 1 engine"), instances.get("instance, cores lanes, several engines")
        if one and several:
            for kind in ("fresh", "reuse"):
                field = f"{kind}_cpu_us_per_run"
                if one.get(field) and several.get(field):
                    print(f"{kind} µs/run, cores lanes, {several.get('engines')} engines / 1: "
                          f"{several[field] / one[field]:.2f}x")


def median(results, field):
    values = [x[field] for x in results if isinstance(x.get(field), (int, float))]
    return statistics.median(values) if values else None


def fmt(value, digits=2):
    return "-" if value is None else f"{value:,.{digits}f}"


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python3 bench/many-core/summary.py <many-core.jsonl>")
    main(sys.argv[1])
