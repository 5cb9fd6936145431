#!/usr/bin/env bash
# Builds the Python and JavaScript example plugins into plugins/<task type>.wasm:
#   plugins/python/<name>/app.py     -> plugins/py.<name>.wasm      (componentize-py, CPython)
#   plugins/js/<name>/handler.js     -> plugins/js.<name>.wasm      (componentize-qjs, QuickJS-ng: the default)
#                                    -> plugins/js-sm.<name>.wasm   (componentize-js, StarlingMonkey)
# against the WIT world in plugin-sdk/wit. Every JavaScript example is built on
# both engines, so the tests run each one on both (docs/sandbox.md, "JavaScript
# engines", says when to choose which). Installs the pinned toolchains on first
# use: componentize-py into plugins/.venv (PyPI), componentize-js into
# plugins/js/node_modules (npm ci from the committed package-lock.json), and
# componentize-qjs with cargo from crates.io into ~/.cache/hourglass (a build
# of several minutes, once per machine; HOURGLASS_CACHE moves it). Each bundles
# its interpreter, so nothing else is needed.
#
# A QuickJS build is the handler behind plugins/js/quickjs/prelude.js (the Web
# APIs StarlingMonkey has and QuickJS lacks, and a Math.random seeded per task)
# and entry.js, against a copy of the world without wasi:http (which
# componentize-qjs 0.4.3 cannot link at build time) and with wasi:random (which
# the prelude uses); `--sync`, since the host runs components without the
# component model's async ABI.
#
# A plugin is rebuilt only when its sources, the WIT or the toolchain changed
# (a stamp per output in plugins/.polyglot-stamps/); --force rebuilds all.
#
# Your own handler, anywhere: --handler <file.js | file.py> --out <type>.wasm
# builds that one file (its folder goes along, for its imports) with the same
# toolchains, on QuickJS unless --engine starlingmonkey.
#
# Usage: bash plugins/build-polyglot.sh [--force] [--install-only] [py|js|js-sm ...]
#        bash plugins/build-polyglot.sh --handler <file> --out <file.wasm> [--engine quickjs|starlingmonkey]
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
wit="$here/../plugin-sdk/wit"
world="task-handler"
componentize_py_version="0.25.1"   # keep in sync with the README's instructions
# The newest componentize-qjs-cli that builds with the project's Rust (1.95): 0.4.4 and 0.4.5 need
# oxc 0.147 (Rust 1.96), 0.5.0 declares 1.97. Keep in sync with plugin-sdk/README.md.
componentize_qjs_version="0.4.3"
qjs_root="${HOURGLASS_CACHE:-$HOME/.cache/hourglass}/componentize-qjs-$componentize_qjs_version"
qjs="$qjs_root/bin/componentize-qjs"

usage() {
    echo "usage: $0 [--force] [--install-only] [py|js|js-sm ...]" >&2
    echo "       $0 --handler <file.js|file.py> --out <file.wasm> [--engine quickjs|starlingmonkey]" >&2
    exit 2
}
force=0 install_only=0 langs=() handler="" out="" engine="quickjs"
while (($#)); do
    case "$1" in
        --force) force=1 ;;
        --install-only) install_only=1 ;;
        --handler) handler="${2:-}"; shift ;;
        --out) out="${2:-}"; shift ;;
        --engine) engine="${2:-}"; shift ;;
        py | js | js-sm) langs+=("$1") ;;
        *) usage ;;
    esac
    shift
done
((${#langs[@]})) || langs=(py js js-sm)

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
    # cargo install records what it installed in the root's .crates.toml.
    if [[ -x "$qjs" ]] && grep -qF "componentize-qjs-cli $componentize_qjs_version " "$qjs_root/.crates.toml" 2>/dev/null; then
        return
    fi
    command -v cargo >/dev/null || { echo "error: cargo is needed to install componentize-qjs (https://rustup.rs)" >&2; exit 1; }
    echo "installing componentize-qjs $componentize_qjs_version into $qjs_root (cargo install: several minutes, once)" >&2
    # Its release profile asks for fat LTO, which takes most of a build on a small machine and
    # buys a build tool nothing measurable (a handler compiles in about a second either way).
    CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 \
        cargo install --quiet --locked componentize-qjs-cli --version "$componentize_qjs_version" --root "$qjs_root"
}

install_js-sm() {
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
# compile_<lang> <source dir> <out> [<main file>]: the main file defaults to app.py / handler.js.
compile_py() { # componentize-py finds the module (app.py: `app`) on -p, the source folder.
    local module="${3:-app.py}"
    (cd "$1" && "$here/.venv/bin/componentize-py" -d "$wit" -w "$world" componentize -p . "${module%.py}" -o "$2")
}
compile_js() { # QuickJS: the handler's folder beside the prelude and entry.js, on the world for QuickJS.
    local work main="${3:-handler.js}"
    work="$(mktemp -d)"
    cp -r "$1" "$work/handler"
    # entry.js imports ../handler.js: another name is re-exported under it.
    if [[ "$main" != handler.js ]]; then
        [[ ! -e "$work/handler/handler.js" ]] || { echo "error: $1 has a handler.js beside $main: build that one" >&2; exit 1; }
        echo "export { handle } from \"./$main\";" >"$work/handler/handler.js"
    fi
    mkdir -p "$work/handler/__hourglass"
    cp "$here/js/quickjs/prelude.js" "$work/handler/__hourglass/prelude.js"
    cp "$here/js/quickjs/entry.js" "$work/handler/__hourglass/entry.js"
    cp -r "$wit" "$work/wit"
    quickjs_world "$work/wit/hourglass.wit"
    (cd "$work/handler" && "$qjs" -w "$work/wit" -n "$world" -j __hourglass/entry.js --module-root . --sync -o "$2" >/dev/null)
    rm -rf "$work"
}
compile_js-sm() { # -d http fetch-event: the engine's own wasi:http support stays out.
    "$here/js/node_modules/.bin/componentize-js" "$1/${3:-handler.js}" --wit "$wit" --world-name "$world" \
        -d http fetch-event -o "$2" >/dev/null
}

# The world, rewritten in place for QuickJS: no wasi:http import, wasi:random's instead.
quickjs_world() { # <hourglass.wit>
    local http="    import wasi:http/outgoing-handler@0.2.12;"
    grep -qxF "$http" "$1" || { echo "error: $1 no longer has the line: $http (update quickjs_world)" >&2; exit 1; }
    sed -i "s|^$http\$|    import wasi:random/random@0.2.12;|" "$1"
}

toolchain_id() {
    case "$1" in
        py) echo "componentize-py $componentize_py_version" ;;
        js) echo "componentize-qjs $componentize_qjs_version $(cat "$here/js/quickjs/prelude.js" "$here/js/quickjs/entry.js" | sha256sum | cut -d' ' -f1)" ;;
        js-sm) sha256sum "$here/js/package-lock.json" | cut -d' ' -f1 ;;
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

if [[ -n "$handler" ]]; then
    [[ -n "$out" ]] || usage
    [[ -f "$handler" ]] || { echo "error: no handler file $handler" >&2; exit 1; }
    case "$handler:$engine" in
        *.py:*) lang=py ;;
        *.js:quickjs) lang=js ;;
        *.js:starlingmonkey) lang=js-sm ;;
        *.js:*) echo "error: unknown engine $engine: quickjs or starlingmonkey" >&2; exit 2 ;;
        *) echo "error: $handler is not a .js or .py file" >&2; exit 2 ;;
    esac
    "install_$lang"
    src="$(cd "$(dirname "$handler")" && pwd)"
    out="$(cd "$(dirname "$out")" && pwd)/$(basename "$out")"
    tmpdir="$(mktemp -d)"
    "compile_$lang" "$src" "$tmpdir/out.wasm" "$(basename "$handler")"
    install_wasm "$tmpdir/out.wasm" "$out"
    rm -rf "$tmpdir"
    echo "built $out ($(($(stat -c %s "$out") / 1024)) KiB, $lang)" >&2
    exit 0
fi

for lang in "${langs[@]}"; do
    "install_$lang"
    ((install_only)) && continue
    case "$lang" in
        py) dirs=("$here"/python/*/) prefix=py ;;
        js) dirs=("$here"/js/*/) prefix=js ;;
        js-sm) dirs=("$here"/js/*/) prefix=js-sm ;;
    esac
    for src in "${dirs[@]}"; do
        src="${src%/}"
        # Not handlers: npm's folder, and the QuickJS build's own files.
        [[ -f "$src/handler.js" || -f "$src/app.py" ]] || continue
        build_one "$lang" "$src" "$prefix.$(basename "$src")"
    done
done
