#!/usr/bin/env bash
# Packs a many-core sitting into one folder, for a server with no toolchain:
# stripped release `hourglass` and `hourglass-bench`, `redis-server` and
# `redis-cli` with the shared libraries `ldd` lists (not the C runtime every
# Linux has), the example plugins, the shipped runner.toml and run.sh, which
# runs the sitting there and writes one JSON line per run.
#
#   bash bench/many-core/bundle.sh <dir> [--bullmq] [--no-build] [--bin-dir DIR] [--plain]
#
#   --bullmq       also pack node and BullMQ 5 with shared/peers/bullmq_bench.js
#                  (installs BullMQ into ~/.cache/hourglass/bullmq-5 on first use)
#   --no-build     pack the release binaries already in target/release
#   --bin-dir DIR  pack the binaries in DIR instead (no build; the tests pack
#                  their debug builds)
#   --plain        leave the binaries uncompressed
#
# Binaries are gzipped and node is xz-compressed (run.sh unpacks them), so
# the folder stays small enough to copy (with BullMQ: about 60 MB); its size
# is printed at the end.
set -euo pipefail

usage() { echo "usage: bash bench/many-core/bundle.sh <dir> [--bullmq] [--no-build] [--bin-dir DIR] [--plain]" >&2; exit 2; }
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
dir="" bullmq=0 build=1 plain=0 bin_dir="$root/target/release"
while (($#)); do
    case "$1" in
        --bullmq) bullmq=1 ;;
        --no-build) build=0 ;;
        --plain) plain=1 ;;
        --bin-dir)
            [[ $# -ge 2 ]] || usage
            bin_dir="$2" build=0
            shift
            ;;
        -*) echo "bundle.sh: unknown option $1" >&2; usage ;;
        *) [[ -z "$dir" ]] || usage; dir="$1" ;;
    esac
    shift
done
[[ -n "$dir" ]] || usage
# Only ever replaces an earlier bundle, never some other folder.
if [[ -e "$dir" && ! ( -f "$dir/run.sh" && -f "$dir/commit" ) ]]; then
    echo "bundle.sh: $dir exists and is not a bundle: name a new folder" >&2
    exit 1
fi
for tool in redis-server redis-cli strip gzip ldd $( ((bullmq)) && echo node npm xz); do
    command -v "$tool" >/dev/null || { echo "bundle.sh: $tool not found on PATH" >&2; exit 1; }
done

if ((build)); then
    cargo build --release --manifest-path "$root/Cargo.toml" -p hourglass -p hourglass-bench
fi
[[ -f "$root/plugins/noop.wasm" ]] || bash "$root/plugins/build.sh"
for bin in hourglass hourglass-bench; do
    [[ -x "$bin_dir/$bin" ]] || { echo "bundle.sh: $bin_dir/$bin is missing (build it: cargo build --release -p $bin)" >&2; exit 1; }
done

rm -rf "$dir"
mkdir -p "$dir/bin" "$dir/lib" "$dir/plugins"
for bin in hourglass hourglass-bench; do
    strip -o "$dir/bin/$bin" "$bin_dir/$bin"
    ((plain)) || gzip -9 "$dir/bin/$bin"
done

# The C runtime (libc, libm, libstdc++, libgcc_s, the loader) is on every
# Linux and must match its kernel's loader, so it stays out.
runtime_lib='^(libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|ld-linux[^ ]*|linux-vdso)\.so'
for bin in redis-server redis-cli; do
    cp "$(command -v "$bin")" "$dir/bin/$bin"
    ldd "$(command -v "$bin")" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }' | while read -r name path; do
        # The two share some libraries; `cp -n` fails on an existing file with some coreutils.
        [[ "$name" =~ $runtime_lib || -e "$dir/lib/$name" ]] || cp "$path" "$dir/lib/$name"
    done
done

cp "$root"/plugins/*.wasm "$dir/plugins/"
cp "$root/runner.toml" "$dir/runner.toml"
cp "$root/bench/many-core/run.sh" "$dir/run.sh"
git -C "$root" rev-parse --short HEAD > "$dir/commit" 2>/dev/null || echo unknown > "$dir/commit"

if ((bullmq)); then
    peers="$root/../shared/peers/bullmq_bench.js"
    [[ -f "$peers" ]] || { echo "bundle.sh: --bullmq needs $peers" >&2; exit 1; }
    cache="$HOME/.cache/hourglass/bullmq-5"
    if [[ ! -d "$cache/node_modules/bullmq" ]]; then
        mkdir -p "$cache"
        (cd "$cache" && npm init -y >/dev/null && npm install --no-audit --no-fund bullmq@5 >/dev/null)
    fi
    mkdir -p "$dir/bullmq"
    cp "$peers" "$dir/bullmq/"
    tar -C "$cache" -czf "$dir/bullmq/node_modules.tar.gz" node_modules
    # xz, not gzip: node is most of the bundle (24 MB against 36). run.sh
    # skips BullMQ, and nothing else, on a server without xz.
    strip -o "$dir/bullmq/node" "$(readlink -f "$(command -v node)")"
    xz -9 -T0 "$dir/bullmq/node"
fi

echo "bundle.sh: $(du -sh "$dir" | cut -f1) in $dir ($(cat "$dir/commit")); run it there with: bash run.sh"
