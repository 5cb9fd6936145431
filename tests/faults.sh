#!/usr/bin/env bash
# Runs the fault-injection harness (tests/fleet/faults.rs and tests/fleet/faults/) one fault at a time and
# ends with a summary: one FAULT line per fault.
#
#   HOURGLASS_FAULTS_TASKS=N      tasks per fault (default 300)
#   HOURGLASS_REDIS_SERVER=PATH   run against this redis-server build (Valkey, a
#                                 newer Redis, ...) instead of the one on PATH;
#                                 it needs `enable-debug-command` (Redis 7+)
#
# The network partition needs root (ip netns); without it that fault falls
# back to pausing the host and says so. The clock fault needs libfaketime
# (apt-get install faketime).
set -euo pipefail
cd "$(dirname "$0")/.."

bash plugins/build.sh

if [[ -n "${HOURGLASS_REDIS_SERVER:-}" ]]; then
    if [[ ! -x "$HOURGLASS_REDIS_SERVER" ]]; then
        echo "error: HOURGLASS_REDIS_SERVER=$HOURGLASS_REDIS_SERVER is not an executable" >&2
        exit 1
    fi
    # The tests start `redis-server` from PATH: put the chosen one first.
    shim=$(mktemp -d)
    trap 'rm -rf "$shim"' EXIT
    ln -s "$(realpath "$HOURGLASS_REDIS_SERVER")" "$shim/redis-server"
    export PATH="$shim:$PATH"
fi
echo "redis-server: $(redis-server --version)"
export HOURGLASS_FAULTS_TASKS="${HOURGLASS_FAULTS_TASKS:-300}"

out=$(mktemp)
set +e
cargo test --workspace --test fleet faults:: -- --nocapture --test-threads=1 2>&1 | tee "$out"
status=${PIPESTATUS[0]}
set -e

echo
echo "summary ($HOURGLASS_FAULTS_TASKS tasks per fault):"
grep '^FAULT ' "$out" || echo "  no FAULT line: see the output above"
rm -f "$out"
exit "$status"
