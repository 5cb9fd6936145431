#!/usr/bin/env bash
# Runs the Python and Node clients' tests against a real `redis-server`
# (whatever that name is on PATH: tests/valkey.sh puts Valkey's first).
# Installs their pinned test environments on first use: redis-py and mypy into
# clients/python/.venv (PyPI), ioredis and the pinned TypeScript + @types/node
# (the Node typings' check) into clients/node/node_modules (npm ci from the
# committed package-lock.json). `make test` runs it.
#
#   bash clients/test.sh                  # both clients' tests
#   bash clients/test.sh --install-only   # the environments only (tests/host/workflows/clients.rs uses them)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
redis_py_version="5.2.1"
# The Python tests check the package and a sample app with mypy --strict.
mypy_version="1.19.1"

bash "$here/sync-scripts.sh" --check
venv="$here/python/.venv"
installed() { "$venv/bin/pip" show "$1" 2>/dev/null | sed -n 's/^Version: //p'; }
if [[ "$(installed redis)" != "$redis_py_version" || "$(installed mypy)" != "$mypy_version" ]]; then
    echo "installing redis-py $redis_py_version and mypy $mypy_version into $venv" >&2
    [[ -x "$venv/bin/python" ]] || python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "redis==$redis_py_version" "mypy==$mypy_version"
fi
node_dir="$here/node"
if [[ ! "$node_dir/node_modules/.package-lock.json" -nt "$node_dir/package-lock.json" ]]; then
    echo "installing ioredis and typescript (npm ci) into $node_dir/node_modules" >&2
    (cd "$node_dir" && npm ci --no-audit --no-fund --loglevel=error)
fi
[[ "${1:-}" == "--install-only" ]] && exit 0
echo "== the Python client's tests on: $(redis-server --version | head -c 60)"
(cd "$here/python" && .venv/bin/python -m unittest discover -s tests)
echo "== the Node client's tests"
(cd "$node_dir" && node --test test/)
