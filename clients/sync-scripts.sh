#!/usr/bin/env bash
# Ships the host's Lua scripts to the clients: the one copy lives in
# host/store/src/scripts/; each client carries a byte-for-byte copy of the
# ones it runs (clients/python/hourglass_client/scripts/, clients/node/scripts/),
# so a group step from Python or Node is exactly the host's step, and the
# script SHAs are the host's too. tests/host/layout.rs fails when a copy differs.
#
#   bash clients/sync-scripts.sh           # copy them (after changing a script)
#   bash clients/sync-scripts.sh --check   # exit 1, naming each copy that differs
set -euo pipefail
cd "$(dirname "$0")/.."
source=host/store/src/scripts
# Read by clients/scripts.txt's readers too: one name per line.
mapfile -t names < clients/scripts.txt
targets=(clients/python/hourglass_client/scripts clients/node/scripts)
check=0
[[ "${1:-}" == "--check" ]] && check=1
stale=()
for dir in "${targets[@]}"; do
    ((check)) || mkdir -p "$dir"
    for name in "${names[@]}"; do
        if ((check)); then
            cmp -s "$source/$name.lua" "$dir/$name.lua" || stale+=("$dir/$name.lua")
        else
            cp "$source/$name.lua" "$dir/$name.lua"
        fi
    done
done
if ((${#stale[@]})); then
    echo "error: the clients' scripts differ from $source: ${stale[*]}: run 'bash clients/sync-scripts.sh'" >&2
    exit 1
fi
((check)) || echo "copied ${#names[@]} scripts into ${targets[*]}"
