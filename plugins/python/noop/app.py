"""py.noop: a Python task handler that succeeds and does nothing.

What a Python handler costs the host per task, apart from what it does:
`hourglass bench burst --plugin plugins/py.noop.wasm` and `hourglass bench
instance --plugin plugins/py.noop.wasm` (BENCHMARKS.md), the counterpart of
the Rust `noop` and of a no-op BullMQ or arq job.

Build: `bash plugins/build-polyglot.sh` (installs to plugins/py.noop.wasm).
"""

import wit_world


class WitWorld(wit_world.WitWorld):
    def handle(self, task) -> None:
        return None
