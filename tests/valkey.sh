#!/usr/bin/env bash
# Runs the Redis contract, the model test, the workflows, the cluster and
# the clients' tests again on Valkey, the second server Hourglass supports: `make test`
# calls it after the whole suite has run on Redis. The tests start
# `redis-server`; here that name is Valkey's binary, put first on PATH
# (.ci/setup installs it). redis-cli stays Redis's own, which Valkey speaks.
#
#   bash tests/valkey.sh             # the tests, on Valkey
#   bash tests/valkey.sh --dir       # where the pinned Valkey lives
set -euo pipefail
cd "$(dirname "$0")/.."
version=9.1.2
wheel=9.1.2.post2
dir="${HOURGLASS_VALKEY_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/hourglass/valkey-$version}"
case "${1:-}" in
    --dir) echo "$dir"; exit 0 ;;
    --version) echo "$version"; exit 0 ;;
    --wheel) echo "$wheel"; exit 0 ;;
esac
server="$dir/bin/redis-server"
if [[ ! -x "$server" ]]; then
    echo "error: no Valkey at $server: run 'bash .ci/setup' (it installs Valkey $version)" >&2
    exit 1
fi
said="$("$server" --version)"
if [[ "$said" != Valkey* ]]; then
    echo "error: $server is not Valkey: it says '$said'" >&2
    exit 1
fi
echo "== the Redis contract, the model test, workflows, cluster and client tests on: $said"
export PATH="$dir/bin:$PATH"
[[ "$(command -v redis-server)" == "$server" ]] || { echo "error: redis-server is not $server on PATH" >&2; exit 1; }
cargo test --workspace --test store -- redis_contract:: model::the_scripts_agree
cargo test --workspace --test host workflows::
cargo test --workspace --test fleet -- cluster_runs_every_task cluster_sharded_type cluster_group_with_children
bash clients/test.sh
