#!/usr/bin/env bash
# Builds every plugin for wasm32-wasip2 and installs it where the host looks:
# examples as plugins/<task type>.wasm, test-only ones as plugins/testing/<name>.wasm.
# Installs by copy-to-temp + rename, because a running host hot-reloads this folder
# and must never see a half-written file.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
target="wasm32-wasip2"
out="$here/target/$target/release"

# A machine with rustup but without the target gets it on the first build.
if command -v rustup >/dev/null && ! rustup target list --installed | grep -qx "$target"; then
    echo "adding the Rust target $target (first build only)" >&2
    rustup target add "$target"
fi

# An explicit target dir, so a CARGO_TARGET_DIR set for the host does not move the outputs.
cargo build --manifest-path "$here/Cargo.toml" --target "$target" --release --target-dir "$here/target"

install_wasm() { # <built file> <destination>
    local src="$1" dest="$2"
    local tmp
    tmp="$(mktemp "$(dirname "$dest")/.$(basename "$dest").XXXXXX")"
    cp "$src" "$tmp"
    chmod 0644 "$tmp"
    mv -f "$tmp" "$dest"
}

# <task type> <crate>: cargo turns '-' and '.' into '_' in cdylib file names.
for pair in noop:noop order.timeout:order_timeout device.offline:device_offline \
    device.alert:device_alert flaky:flaky webhook:webhook; do
    install_wasm "$out/${pair#*:}.wasm" "$here/${pair%%:*}.wasm"
done

mkdir -p "$here/testing"
install_wasm "$out/chaos.wasm" "$here/testing/chaos.wasm"
install_wasm "$out/wrong-world.wasm" "$here/testing/wrong-world.wasm"
