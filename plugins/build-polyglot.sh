#!/usr/bin/env bash
# Builds the Python and JavaScript example plugins into plugins/<task type>.wasm:
#   plugins/python/<name>/app.py     -> plugins/py.<name>.wasm   (componentize-py)
#   plugins/js/<name>/handler.js     -> plugins/js.<name>.wasm   (componentize-js)
# against the WIT world in plugin-sdk/wit. Installs the pinned toolchains on
# first use: componentize-py into plugins/.venv (PyPI), componentize-js into
# plugins/js/node_modules (npm ci from the committed package-lock.json). Both
# bundle their interpreter (CPython, StarlingMonkey), so nothing else is needed.
#
# A plugin is rebuilt only when its sources, the WIT or the toolchain changed
# (a stamp per output in plugins/.polyglot-stamps/); --force rebuilds all.
# Usage: bash plugins/build-polyglot.sh [--force] [--install-only] [py|js ...]
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
wit="$here/../plugin-sdk/wit"
world="task-handler"
componentize_py_version="0.25.1"   # keep in sync with the README's instructions

force=0 install_only=0 langs=()
for arg in "$@"; do
    case "$arg" in
        --force) force=1 ;;
        --install-only) install_only=1 ;;
        py | js) langs+=("$arg") ;;
        *) echo "usage: $0 [--force] [--install-only] [py|js ...]" >&2; exit 2 ;;
    esac
done
((${#langs[@]})) || langs=(py js)

install_py() {
    local venv="$here/.venv"
    if [[ -x "$venv/bin/componentize-py" ]] &&
        [[ "$("$venv/bin/pip" show componentize-py 2>/dev/null | sed -n 's/^Version: //p')" == "$componentize_py_version" ]]; then
        return
    fi
    echo "installing componentize-py $componentize_py_version into $venv" >&2
    [[ -d "$venv" ]] || python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "componentize-py==$componentize_py_version"
}

install_js() {
    local dir="$here/js"
    # npm ci when node_modules is missing or older than the lock file.
    if [[ -x "$dir/node_modules/.bin/componentize-js" && "$dir/node_modules/.package-lock.json" -nt "$dir/package-lock.json" ]]; then
        return
    fi
    echo "installing componentize-js (npm ci) into $dir/node_modules" >&2
    (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error)
}

install_wasm() { # <built file> <destination>: copy-to-temp + rename, the host hot-reloads this folder
    local tmp
    tmp="$(mktemp "$(dirname "$2")/.$(basename "$2").XXXXXX")"
    cp "$1" "$tmp"
    chmod 0644 "$tmp"
    mv -f "$tmp" "$2"
}

# Prints a digest of everything a plugin's build depends on.
inputs_digest() { # <source dir> <toolchain id>
    {
        echo "$2"
        find "$1" "$wit" -type f ! -name '*.pyc' ! -path '*/__pycache__/*' -print0 | sort -z |
            xargs -0 sha256sum | sed "s|$here/||"
    } | sha256sum | cut -d' ' -f1
}

# Compile one plugin from <source dir> into <out>.
compile_py() { # componentize-py finds the module `app` (app.py) on -p, the source folder.
    (cd "$1" && "$here/.venv/bin/componentize-py" -d "$wit" -w "$world" componentize -p . app -o "$2")
}
compile_js() { # -d http fetch-event: the engine's own wasi:http support stays out.
    "$here/js/node_modules/.bin/componentize-js" "$1/handler.js" --wit "$wit" --world-name "$world" \
        -d http fetch-event -o "$2" >/dev/null
}

toolchain_id() {
    case "$1" in
        py) echo "componentize-py $componentize_py_version" ;;
        js) sha256sum "$here/js/package-lock.json" | cut -d' ' -f1 ;;
    esac
}

# build_one <lang> <source dir> <task type>: compiles unless the stamp says
# the installed output is up to date.
build_one() {
    local lang="$1" src="$2" task_type="$3"
    local dest="$here/$task_type.wasm" stamp="$here/.polyglot-stamps/$task_type"
    local digest tmpdir start=$SECONDS
    digest="$(inputs_digest "$src" "$lang:$(toolchain_id "$lang")")"
    if ((!force)) && [[ -f "$dest" && -f "$stamp" && "$(cat "$stamp")" == "$digest" ]]; then
        echo "$task_type.wasm is up to date" >&2
        return
    fi
    echo "building $task_type.wasm from ${src#"$here/"}" >&2
    tmpdir="$(mktemp -d)"
    "compile_$lang" "$src" "$tmpdir/out.wasm"
    install_wasm "$tmpdir/out.wasm" "$dest"
    rm -rf "$tmpdir"
    mkdir -p "$here/.polyglot-stamps"
    echo "$digest" >"$stamp"
    echo "built $task_type.wasm ($(($(stat -c %s "$dest") / 1024)) KiB) in $((SECONDS - start)) s" >&2
}

for lang in "${langs[@]}"; do
    "install_$lang"
    ((install_only)) && continue
    case "$lang" in
        py) dirs=("$here"/python/*/) prefix=py ;;
        js) dirs=("$here"/js/*/) prefix=js ;;
    esac
    for src in "${dirs[@]}"; do
        src="${src%/}"
        [[ "$(basename "$src")" == node_modules ]] && continue
        build_one "$lang" "$src" "$prefix.$(basename "$src")"
    done
done
