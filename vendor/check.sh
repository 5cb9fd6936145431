#!/usr/bin/env bash
# Checks that vendor/wasmtime is crates.io's wasmtime, at the version its
# Cargo.toml names, plus vendor/wasmtime-pagemap.patch then
# vendor/wasmtime-checkpoint.patch and nothing else (vendor/README.md says
# why we carry them and when they go).
set -euo pipefail
cd "$(dirname "$0")"
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' wasmtime/Cargo.toml | head -1)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# A throwaway package that depends on exactly that version: cargo fetches the pristine crate.
mkdir -p "$work/probe/src"
touch "$work/probe/src/lib.rs"
printf '[package]\nname = "probe"\nversion = "0.0.0"\nedition = "2021"\n[workspace]\n[dependencies]\nwasmtime = { version = "=%s", default-features = false }\n' \
    "$version" >"$work/probe/Cargo.toml"
cargo fetch -q --manifest-path "$work/probe/Cargo.toml"
pristine="$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/"wasmtime-$version" | head -1)"
cp -r "$pristine" "$work/expected"
rm -f "$work/expected/.cargo-ok"
patches=(wasmtime-pagemap.patch wasmtime-checkpoint.patch)
for p in "${patches[@]}"; do
    patch -s -p1 -d "$work/expected" <"$p"
done
if ! diff -r "$work/expected" wasmtime >"$work/diff"; then
    echo "error: vendor/wasmtime differs from wasmtime $version + ${patches[*]}:" >&2
    head -40 "$work/diff" >&2
    exit 1
fi
echo "vendor/wasmtime: wasmtime $version + ${patches[*]}, nothing else"
