#!/usr/bin/env bash
# The many-core sitting, run from a folder bundle.sh made, on a server with no
# toolchain. Appends one JSON line per run to $OUT/many-core.jsonl (OUT
# defaults to ./out) and keeps every program's output in $OUT/run.log:
#
#   1. the quick start: `hourglass run` on the shipped runner.toml, as
#      `make run` starts it (a managed redis-server on QS_PORT, 6379 unless
#      set), then the README's three tasks; passes when all three ran;
#   2. `bench burst` fresh and `--reuse 64`, at the default threads, 2 + 2
#      and cores + cores (the host CPU per task by thread count), and 4
#      hosts with a quarter of the cores' handler threads each, ROUNDS
#      rounds interleaved;
#   2b. in the same rounds, separate `hourglass run` processes: one with the
#      default threads (with the default slots, and with as many as 4
#      processes have together), and 4 with a quarter of the cores each;
#   3. 4 hosts on one Redis, and 4 hosts on a 3-master cluster with
#      shards = 1 and shards = 3;
#   3b. `bench instance` (no Redis): one lane, then as many lanes as cores
#      on one engine and on several (cores / 4, at least 2): what parallel
#      instantiation costs, and whether separate instance pools cut it;
#   4. with bullmq/ in the bundle: BullMQ's burst beside Hourglass's, in the
#      same minutes.
#
#   bash run.sh [--quick]     (--quick: 20,000 tasks, one round, no cluster)
#
# Environment: TASKS (200000), ROUNDS (2), QS_PORT (6379), OUT.
set -uo pipefail # not -e: a failed run is recorded and the others go on

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"
quick=0
case "${1:-}" in
    --quick) quick=1 ;;
    "") ;;
    *) echo "usage: bash run.sh [--quick]" >&2; exit 2 ;;
esac
tasks="${TASKS:-$( ((quick)) && echo 20000 || echo 200000)}"
rounds="${ROUNDS:-$( ((quick)) && echo 1 || echo 2)}"
qs_port="${QS_PORT:-6379}"
out="${OUT:-$here/out}"
mkdir -p "$out"
results="$out/many-core.jsonl"
log="$out/run.log"

for packed in bin/*.gz; do
    [[ -e "$packed" ]] || continue
    gunzip -f "$packed"
done
chmod +x bin/*
export PATH="$here/bin:$PATH" LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
cores="$(nproc)"

emit() { echo "$1" | tee -a "$results"; }
json_str() { printf '"%s"' "$(printf '%s' "$1" | tr -d '\000-\037' | sed 's/\\/\\\\/g; s/"/\\"/g')"; }

model="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
mem_kib="$(awk '/MemTotal/ { print $2 }' /proc/meminfo)"
emit "{\"run\":\"machine\",\"cores\":$cores,\"model\":$(json_str "$model"),\"kernel\":$(json_str "$(uname -r)"),\"mem_kib\":$mem_kib,\"commit\":$(json_str "$(cat commit 2>/dev/null)"),\"tasks\":$tasks,\"rounds\":$rounds}"

# Waits up to $2 seconds for the extended regex $3 in file $1.
wait_for() {
    local file="$1" seconds="$2" pattern="$3" i
    for ((i = 0; i < seconds * 10; i++)); do
        grep -Eq "$pattern" "$file" 2>/dev/null && return 0
        sleep 0.1
    done
    return 1
}

quick_start() {
    local work host_pid started ready ok=true missing=()
    work="$(mktemp -d)"
    cp -r runner.toml plugins "$work/"
    started="$(date +%s%3N)"
    (cd "$work" && exec env HOURGLASS_REDIS_URL="redis://127.0.0.1:$qs_port" HOURGLASS_LOG=info hourglass run) > "$work/host.log" 2>&1 &
    host_pid=$!
    if wait_for "$work/host.log" 300 "hourglass is running"; then
        ready="$(($(date +%s%3N) - started))"
        local now
        now="$(date +%s%3N)"
        redis-cli -p "$qs_port" HSET 'hourglass:{order.timeout}:payload' o-42 '{"order_id": 42, "amount": 19.90}' >> "$log" 2>&1
        redis-cli -p "$qs_port" ZADD 'hourglass:{order.timeout}:due' $((now + 2000)) o-42 >> "$log" 2>&1
        (cd "$work" && export HOURGLASS_REDIS_URL="redis://127.0.0.1:$qs_port" &&
            hourglass schedule order.timeout o-43 --in 2s --payload '{"order_id": 43, "amount": 5}' &&
            hourglass schedule flaky f-1 --in 1s --payload '{"fail_times": 2}') >> "$log" 2>&1
        for pattern in "order 42 .*cancelled" "order 43 .*cancelled" "succeeded on attempt 3.*task_id=f-1"; do
            wait_for "$work/host.log" 60 "$pattern" || { ok=false; missing+=("$pattern"); }
        done
    else
        ready=null ok=false missing+=("hourglass is running")
    fi
    kill -INT "$host_pid" 2>/dev/null
    wait "$host_pid"
    local exit_code=$?
    local refused compiled
    refused="$(grep -c "plugin rejected" "$work/host.log")"
    compiled="$(grep -c "compiled" "$work/host.log")"
    { echo "== quick start host log"; cat "$work/host.log"; } >> "$log"
    emit "{\"run\":\"quickstart\",\"ok\":$ok,\"ready_ms\":$ready,\"plugins_refused\":$refused,\"compile_lines\":$compiled,\"host_exit\":$exit_code,\"missing\":$(json_str "${missing[*]:-}")}"
    rm -rf "$work"
}

# Records one run: its JSON line (kept whole under "result"), or an error
# when it printed none. `record <label> <args> <line>`
record() {
    if [[ "$3" == "{"* ]]; then
        emit "{\"run\":\"$1\",\"args\":$(json_str "$2"),\"result\":$3}"
    else
        emit "{\"run\":\"$1\",\"args\":$(json_str "$2"),\"error\":\"no result: see run.log\"}"
    fi
}

# One `bench <scenario> <label> [args]` on the bundle's noop; `burst` on a
# private redis-server unless --spawn-cluster is given, `instance` on none.
bench() {
    local scenario="$1" label="$2" server=()
    shift 2
    [[ "$scenario" == burst && " $* " != *" --spawn-cluster "* ]] && server=(--spawn-redis)
    echo "== $scenario $label $*" >> "$log"
    record "$label" "$*" "$(timeout 600 hourglass-bench "$scenario" "${server[@]}" --json --tasks "$tasks" \
        --plugin plugins/noop.wasm --config runner.toml "$@" 2>> "$log" | tail -n 1)"
}
burst() { bench burst "$@"; }

# CPU clock ticks (user + system) the processes $@ used so far.
cpu_ticks() {
    local p t=0
    for p in "$@"; do t=$((t + $(awk '{ print $14 + $15 }' "/proc/$p/stat" 2>/dev/null || echo 0))); done
    echo "$t"
}

# Separate `hourglass run` processes, as docs/operations.md advises on a large
# server (not `bench --hosts`, whose hosts share one process): `processes
# <label> <n> [<worker_threads> <host_threads> [<more runner.toml>]]` (empty
# or left out: the defaults) on a private redis-server (a unix socket: no
# port to collide with), $tasks noop tasks due at one instant. The drain's
# seconds come from polling the succeeded counter every 20 ms; host CPU from
# the processes' /proc/<pid>/stat.
processes() {
    local label="$1" n="$2" wt="${3:-}" ht="${4:-}" more="${5:-}" work sock i pids=() due end cpu0 cpu1 done_n=0 tick
    local started=true
    work="$(mktemp -d)"
    sock="$work/redis.sock"
    mkdir -p "$work/plugins"
    cp plugins/noop.wasm "$work/plugins/"
    {
        printf '[redis]\nurl = "redis+unix://%s"\n[runner]\nplugins_dir = "plugins"\ncache_dir = "cache"\n' "$sock"
        [[ -n "$wt" ]] && printf 'worker_threads = %s\nhost_threads = %s\n' "$wt" "$ht"
        printf '%b' "$more"
    } > "$work/runner.toml"
    echo "== processes $label: $n x ($wt + $ht)" >> "$log"
    redis-server --port 0 --unixsocket "$sock" --save "" --appendonly no --dir "$work" --daemonize yes \
        --logfile "$work/redis.log" >> "$log" 2>&1
    sleep 0.5
    for ((i = 0; i < n; i++)); do
        HOURGLASS_LOG=info hourglass --config "$work/runner.toml" run > "$work/host$i.log" 2>&1 &
        pids+=($!)
    done
    for ((i = 0; i < n; i++)); do
        wait_for "$work/host$i.log" 120 "hourglass is running" || started=false
    done
    due=$(($(date +%s%3N) + 3000))
    awk -v d="$due" -v n="$tasks" 'BEGIN { for (i = 0; i < n; i += 1000) {
        printf "ZADD hourglass:{noop}:due"; for (j = i; j < i + 1000 && j < n; j++) printf " %d p%d", d, j; printf "\n" } }' |
        redis-cli -s "$sock" > /dev/null
    cpu0="$(cpu_ticks "${pids[@]}")"
    end=""
    # Polled only while every host runs: one that did not start, or stopped, ends the run.
    for ((tick = 0; tick < 30000; tick++)); do
        for i in "${pids[@]}"; do kill -0 "$i" 2>/dev/null || started=false; done
        [[ "$started" == true ]] || break
        done_n="$(redis-cli -s "$sock" HGET 'hourglass:{noop}:stats' succeeded)"
        if [[ "${done_n:-0}" -ge "$tasks" ]]; then end="$(date +%s%3N)"; break; fi
        sleep 0.02
    done
    cpu1="$(cpu_ticks "${pids[@]}")"
    for p in "${pids[@]}"; do kill -INT "$p" 2>/dev/null; done
    wait "${pids[@]}" 2>/dev/null
    redis-cli -s "$sock" shutdown nosave >> "$log" 2>&1
    for ((i = 0; i < n; i++)); do { echo "== host $i"; grep -Ev "^\s*$" "$work/host$i.log" | tail -n 5; } >> "$log"; done
    rm -rf "$work"
    local ticks_per_s seconds
    ticks_per_s="$(getconf CLK_TCK)"
    if [[ -z "$end" ]]; then
        emit "{\"run\":\"$label\",\"error\":\"$done_n of $tasks succeeded: see run.log\"}"
        return 0
    fi
    seconds="$(awk -v ms="$((end - due))" 'BEGIN { printf "%.3f", ms / 1000 }')"
    emit "{\"run\":\"$label\",\"result\":{\"scenario\":\"processes\",\"hosts\":$n,\"worker_threads\":${wt:-null},\"host_threads\":${ht:-null},\"tasks\":$tasks,\"succeeded\":$done_n,\"seconds\":$seconds,\"tasks_per_s\":$(awk -v t="$tasks" -v s="$seconds" 'BEGIN { printf "%.0f", t / s }'),\"host_cpu_us_per_task\":$(awk -v c="$((cpu1 - cpu0))" -v hz="$ticks_per_s" -v t="$tasks" 'BEGIN { printf "%.2f", c / hz * 1e6 / t }')}}"
}
instance() { bench instance "$@"; }

bullmq() {
    if [[ -f bullmq/node.xz ]]; then
        command -v xz >/dev/null || { emit '{"run":"bullmq","error":"xz is not installed here: node cannot be unpacked"}'; return 0; }
        xz -d -f bullmq/node.xz && chmod +x bullmq/node
    fi
    [[ -d bullmq/node_modules ]] || tar -C bullmq -xzf bullmq/node_modules.tar.gz
    local port=6390 dir line
    dir="$(mktemp -d)"
    redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$dir" --daemonize yes \
        --logfile "$dir/redis.log" >> "$log" 2>&1
    sleep 0.5
    line="$(cd bullmq && timeout 600 ./node bullmq_bench.js "$port" "$tasks" 0 100 2>> "$log" | tail -n 1)"
    redis-cli -p "$port" shutdown nosave >> "$log" 2>&1
    rm -rf "$dir"
    record bullmq "burst, concurrency 100" "$line"
}

quick_start
# docs/operations.md's advice for large servers: several hosts, each with a share of the cores.
quarter=$((cores / 4 > 1 ? cores / 4 : 1))
for ((round = 1; round <= rounds; round++)); do
    burst "default"
    burst "4 hosts, cores/4 handler threads each" --hosts 4 --worker-threads "$quarter"
    processes "1 process" 1
    # As many of the type's tasks in hand as the 4 processes below hold together.
    processes "1 process, 4x the slots" 1 "" "" 'concurrency = 2048\n[defaults]\nconcurrency = 1024\n'
    processes "4 processes, cores/4 handler threads each" 4 "$quarter" "$((quarter / 2 > 1 ? quarter / 2 : 1))"
    burst "default reuse" --reuse 64
    burst "2+2" --worker-threads 2 --host-threads 2
    burst "2+2 reuse" --worker-threads 2 --host-threads 2 --reuse 64
    burst "cores+cores" --worker-threads "$cores" --host-threads "$cores"
    burst "cores+cores reuse" --worker-threads "$cores" --host-threads "$cores" --reuse 64
done
burst "4 hosts" --hosts 4
# Pools of 64 slots: each engine reserves address space for its pool, and
# the shipped concurrency's would not fit many engines in one process.
lanes=$((cores < 64 ? cores : 64))
engines=$((cores / 4 > 2 ? cores / 4 : 2))
instance "instance"
instance "instance, cores lanes, 1 engine" --parallel "$lanes" --worker-threads "$cores" --concurrency 64
instance "instance, cores lanes, several engines" --parallel "$lanes" --worker-threads "$cores" --concurrency 64 \
    --hosts "$engines"

if ((!quick)); then
    burst "cluster 4 hosts, shards 1" --spawn-cluster --hosts 4 --shards 1
    burst "cluster 4 hosts, shards 3" --spawn-cluster --hosts 4 --shards 3
fi
if [[ -f bullmq/bullmq_bench.js ]]; then
    bullmq
    burst "default, beside bullmq"
fi
echo "results: $results"
