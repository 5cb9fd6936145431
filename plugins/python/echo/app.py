"""py.echo: an Hourglass task handler in Python (built with componentize-py).

- Echoes every task it acknowledges: schedules a follow-up of type
  `<task type>.out` (or the type named by `config = { reply_to = "..." }`)
  with the same id and the same payload bytes, due when this task was due.
  Binary and non-UTF-8 payloads and ids come through untouched.
- A JSON payload `{"fail_times": N}` fails its first N attempts (retried by
  the type's backoff policy), like the Rust `flaky` example.
- A JSON payload `{"permanent": "reason"}` dead-letters the task at once.
- A JSON payload `{"crash": "message"}` raises an uncaught exception: the
  attempt fails like a trap, with the traceback in the host's log.
- A JSON payload `{"remember": "text"}` keeps the text in a module global;
  `{"recall": true}` dead-letters the task, naming the text, if an earlier
  task left one there, and echoes as usual otherwise. With the default
  `instance_reuse = 0` every task starts in a fresh instance, so a recall
  never finds anything (tests/sandbox/polyglot.rs checks it, and that it
  does under reuse).
- A JSON payload `{"graph": {"home": C, "id": G, "nodes": [...]}}` also
  declares workflow graph G of home type C (the nodes as a graph file has
  them), committed with this run's success.
- A JSON payload `{"progress": N}` reports N % done (detail `{"echo": N}`)
  before anything else, so `hourglass show` has it while the task lives
  (with `fail_times`, it is kept across the retries).
- A JSON payload `{"fanout": {"callback": C, "group": G, "type": T, "ids": [...]}}`
  also opens workflow group G with callback task G of type C, adds one child
  of type T per id (payload `{}`, due now) and seals it.

Build: `bash plugins/build-polyglot.sh` (installs to plugins/py.echo.wasm).
"""

import hashlib
import json

import wit_world
from componentize_py_types import Err
from wit_world.imports import config, log, progress, schedule, workflow

# The world's own `types` interface: componentize-py names the module after the
# interface, qualified when another imported package (wasi:http) has a `types` too.
try:
    from wit_world.imports import hourglass_plugin_types as types
except ImportError:
    from wit_world.imports import types


def _controls(payload: bytes) -> dict:
    """The payload as a JSON object, or {} when it is anything else (binary, text, ...)."""
    try:
        value = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _fan_out(fanout: dict, due_ms: int) -> None:
    """Opens the group, adds its children and seals it: committed with this run's success."""
    callback, group = str(fanout.get("callback", "")), str(fanout.get("group", ""))
    try:
        workflow.open(callback, group, group, "", workflow.FireWhen.ALL_ENDED)
        for child_id in fanout.get("ids", []):
            workflow.add(callback, group, str(fanout.get("type", "")), str(child_id), b"{}", due_ms)
        workflow.seal(callback, group)
    except Err as e:
        # Not granted, a bad group id, a sealed group: retrying would not help.
        raise Err(types.Failure_Permanent(f"cannot fan out: {e.value}"))


def _declare_graph(spec: dict) -> None:
    """Declares the graph: committed with this run's success."""
    try:
        workflow.graph(str(spec.get("home", "")), str(spec.get("id", "")), json.dumps({"nodes": spec.get("nodes", [])}))
    except Err as e:
        # A cycle, an unknown parent, a type not granted: retrying would not help.
        raise Err(types.Failure_Permanent(f"cannot declare the graph: {e.value}"))


#: What a task asked to remember: module state, which a fresh instance starts without.
_remembered = None


class WitWorld(wit_world.WitWorld):
    def handle(self, task: types.Task) -> None:
        global _remembered
        controls = _controls(task.payload)

        if isinstance(controls.get("progress"), int):
            done = controls["progress"]
            try:
                progress.report(done, json.dumps({"echo": done}))
            except Err as e:
                raise Err(types.Failure_Permanent(f"cannot report progress: {e.value}"))

        if controls.get("recall") is True and _remembered is not None:
            raise Err(types.Failure_Permanent(f"recalled {_remembered!r} from an earlier task"))
        if "remember" in controls:
            _remembered = str(controls["remember"])

        if "crash" in controls:
            raise RuntimeError(str(controls["crash"]))

        if "permanent" in controls:
            raise Err(types.Failure_Permanent(str(controls["permanent"])))

        fail_times = controls.get("fail_times", 0)
        if isinstance(fail_times, int) and task.attempt <= fail_times:
            raise Err(types.Failure_Error(
                f"failing on purpose (attempt {task.attempt} of {fail_times} planned failures)"))

        fanout = controls.get("fanout")
        if isinstance(fanout, dict):
            _fan_out(fanout, task.due_ms)
        graph = controls.get("graph")
        if isinstance(graph, dict):
            _declare_graph(graph)

        digest = hashlib.sha256(task.payload).hexdigest()
        reply_to = config.get("reply_to") or f"{task.task_type}.out"
        log.log(log.Level.INFO,
                f"echoing {len(task.payload)} bytes (sha256 {digest}) to {reply_to} on attempt {task.attempt}")
        try:
            schedule.schedule(reply_to, task.id, task.payload, task.due_ms)
        except Err as e:
            # The host refused the follow-up (bad type name, too large, ...): never retry.
            raise Err(types.Failure_Permanent(f"cannot schedule the echo: {e.value}"))
