// js.noop: a JavaScript task handler that succeeds and does nothing.
//
// What a JavaScript handler costs the host per task, apart from what it does:
// `hourglass bench burst --plugin plugins/js.noop.wasm` and `hourglass bench
// instance --plugin plugins/js.noop.wasm` (BENCHMARKS.md), the counterpart of
// the Rust `noop` and of a no-op BullMQ job.
//
// Build: `bash plugins/build-polyglot.sh` (installs to plugins/js.noop.wasm).

export function handle(_task) {}
