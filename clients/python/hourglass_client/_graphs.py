"""Workflow graphs' steps: declare one whole (``graph_open.lua``, the host's script), schedule its roots,
and show it. The host's CLI (``hourglass graph submit``) takes the same steps in the same order."""

from __future__ import annotations

import json
from typing import Any, Dict, Iterable, List, Optional, Tuple

from . import _args
from ._core import Batch, Cmd, Core, Script, Steps, text
from .errors import GraphRefused, InvalidArgument
from .results import CancelState, Declared, GraphCancelled, GraphState, GraphView, Node, NodeState, NodeView

#: Most nodes and edges in one graph (the host's MAX_NODES and MAX_EDGES).
MAX_NODES = 10_000
MAX_EDGES = 50_000
#: Lookups per pipeline, and nodes per group_child.lua call (the host's BATCH and NODES_PER_CALL).
LOOKUPS_PER_BATCH = 500
NODES_PER_CALL = 256
_NODE_STATES = ("waiting", "scheduled", "succeeded", "dead", "cancelled", "skipped")


class GraphSteps(Core):
    """The graph calls' steps, on top of the state every call shares."""

    def _graph_keys(self, home_type: str, graph: str) -> Tuple[str, str, List[str]]:
        c, g = _args.task_type(home_type), _args.text_id(graph, "graph id")
        return c, g, [self.key(c, f"graph:{g}"), self.key(c, f"graph-nodes:{g}")]

    def _graph_submit_steps(self, home_type: str, graph: str, nodes: Iterable[Node]) -> Steps[Declared]:
        c, g, keys = self._graph_keys(home_type, graph)
        spec = [_node_spec(g, n) for n in nodes]
        if not spec:
            raise InvalidArgument(f"graph {c}/{g} has no nodes")
        name = f"{c}/{g}"
        state = yield Cmd("hget", (keys[0], "state"))
        if state is not None:
            raise GraphRefused(f"graph {name} exists ({text(state)}): graph ids are used once; nothing was written")
        # A node is create-only, so one whose task is already in use would not run: refuse the graph whole.
        # (An id taken between this read and the node's turn makes that node end as cancelled.)
        for start in range(0, len(spec), LOOKUPS_PER_BATCH):
            batch = spec[start : start + LOOKUPS_PER_BATCH]
            calls: List[Any] = []
            for n in batch:
                q = self.shard_for(n["type"], n["id"])
                calls += [
                    Cmd("zscore", (self.key(q, "due"), n["id"])),
                    Cmd("zscore", (self.key(q, "dead"), n["id"])),
                    Cmd("hexists", (self.key(q, "member"), n["id"])),
                ]
            replies = yield Batch(calls)
            for n, (due, dead, member) in zip(batch, zip(replies[0::3], replies[1::3], replies[2::3])):
                for reply in (due, dead, member):
                    if isinstance(reply, Exception):
                        raise reply
                why = "waiting" if due is not None else "dead-lettered" if dead is not None else None
                if why is None and member:
                    why = "a workflow group's or graph's already"
                if why:
                    raise GraphRefused(
                        f"graph {name}: node {n['name']!r}: task {n['type']}/{n['id']} is {why}; nothing was written"
                    )
        keys += [self.key(c, s) for s in ("graphs", "outbox", "seq", "stats")]
        r = yield Script("graph_open", keys, [g, c, json.dumps(spec), MAX_NODES, MAX_EDGES])
        declared = Declared(int(r[0]), int(r[1]), int(r[2]))
        # The roots wait in the home type's outbox: schedule them now, not at a host's next pass.
        yield from self._graph_flush_steps(c)
        return declared

    def _graph_flush_steps(self, c: str) -> Steps[int]:
        """Schedules the graph nodes waiting in ``c``'s outbox into their types, each once (its entry's
        marker, as a host delivers it), and clears those entries; returns how many were delivered."""
        outbox, cursor, moved = self.key(c, "outbox"), 0, 0
        while True:
            cursor, page = yield Cmd("hscan", (outbox, cursor), {"match": "*:node", "count": LOOKUPS_PER_BATCH})
            by_slot: Dict[str, List[Tuple[str, bytes, bytes, bytes, bytes, Any]]] = {}
            for entry, data in page.items():
                entry_id = text(entry)
                try:
                    mark, node_type, due, node_id, body = _decode_node(bytes(data))
                except ValueError:
                    continue  # a host serving the type logs and drops it
                by_slot.setdefault(self.shard_for(node_type, node_id), []).append(
                    (entry_id, mark, node_id, due, body, entry)
                )
            done: List[Any] = []
            for q, nodes in by_slot.items():
                for start in range(0, len(nodes), NODES_PER_CALL):
                    batch = nodes[start : start + NODES_PER_CALL]
                    keys = [self.key(q, s) for s in ("due", "payload", "member", "dead", "outbox", "seq")]
                    args: List[Any] = [q]
                    for marker, mark, node_id, due, body, _ in batch:
                        keys.append(self.key(q, f"delivered:{marker}"))
                        args += [node_id, due, body, "1" if body else "0", mark, "create", "1"]
                    yield Script("group_child", keys, args)
                    done += [entry for *_, entry in batch]
            if done:
                yield Cmd("hdel", (outbox, *done))
                moved += len(done)
            if int(cursor) == 0:
                return moved

    def _graph_cancel_steps(self, home_type: str, graph: str) -> Steps[Optional[GraphCancelled]]:
        c, g, keys = self._graph_keys(home_type, graph)
        if (yield Cmd("hget", (keys[0], "state"))) is None:
            return None
        # graph_cancel.lua skips every waiting node at once; the nodes scheduled are cancelled as tasks.
        r = yield Script("graph_cancel", keys + [self.key(c, "graphs"), self.key(c, "stats")], [g, c])
        if int(r[0]) < 0:
            return GraphCancelled(was_done=True)
        done = GraphCancelled(skipped=int(r[0]))
        # Nodes on their way in the outbox become tasks first, so cancelling finds them.
        yield from self._graph_flush_steps(c)
        for t, node_id in zip(r[1::2], r[2::2]):
            cancelled = yield from self._cancel_steps(text(t), bytes(node_id))
            if cancelled.state == CancelState.SCHEDULED:
                done.removed += 1
            elif cancelled.state == CancelState.RUNNING:
                done.stopping += 1
            else:
                done.ended += 1
        return done

    def _graph_show_steps(self, home_type: str, graph: str) -> Steps[Optional[GraphView]]:
        c, g, keys = self._graph_keys(home_type, graph)
        fields = yield Cmd("hgetall", (keys[0],))
        if not fields:
            return None
        f = {text(k): text(v) for k, v in fields.items()}
        stored: Dict[int, Dict[str, Any]] = {}
        cursor = 0
        while True:
            cursor, page = yield Cmd("hscan", (keys[1], cursor), {"count": LOOKUPS_PER_BATCH})
            for index, raw in page.items():
                stored[int(index)] = json.loads(raw)
            if int(cursor) == 0:
                break
        names = {i: n["name"] for i, n in stored.items()}
        nodes = []
        for _, n in sorted(stored.items()):
            # cjson writes an empty list as {}.
            listed = n.get("parents")
            parents: List[int] = listed if isinstance(listed, list) else []
            state = NodeState(n["state"])
            nodes.append(
                NodeView(
                    name=n["name"],
                    task_type=n["type"],
                    id=n["id"],
                    when=n["when"],
                    state=state,
                    parents=[names[p] for p in parents if p in names],
                    waiting_for=max(0, int(n.get("left", 0))) if state == NodeState.WAITING else 0,
                    reason=n.get("reason"),
                )
            )

        def num(name: str) -> Optional[int]:
            return int(f[name]) if name in f else None

        return GraphView(
            home_type=c,
            graph=g,
            state=GraphState(f.get("state", "")),
            edges=num("edges") or 0,
            counts={s: max(0, num(s) or 0) for s in _NODE_STATES},
            opened_ms=num("opened_ms"),
            completed_ms=num("completed_ms"),
            nodes=nodes,
            cancelled_ms=num("cancelled_ms"),
        )


def _node_spec(graph: str, n: Node) -> Dict[str, Any]:
    """A node as graph_open.lua takes it, its arguments checked here first."""
    if not isinstance(n, Node):
        raise InvalidArgument(f"a graph's node is a Node(name, task_type, ...), not {type(n).__name__}")
    name = _args.text_id(n.name, "node name")
    if n.when not in ("all", "success"):
        raise InvalidArgument(f"node {name!r}: invalid when {n.when!r}: expected 'all' or 'success'")
    if isinstance(n.parents, str) or not all(isinstance(p, str) for p in n.parents):
        raise InvalidArgument(f"node {name!r}: parents are a list of node names")
    try:
        body = _args.payload(n.payload).decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidArgument(f"node {name!r}: a graph node's payload is text (UTF-8)") from None
    node_id = _args.text_id(n.id if n.id is not None else f"{graph}/{name}", "node id", 1 << 20)
    spec: Dict[str, Any] = {"name": name, "type": _args.task_type(n.task_type), "id": node_id, "when": n.when}
    spec["parents"] = list(n.parents)
    if body:
        spec["payload"] = body
    return spec


def _decode_node(data: bytes) -> Tuple[bytes, str, bytes, bytes, bytes]:
    """A node's outbox entry (the prelude's graph_node_entry): ``<len>\\n<mark>`` then the task,
    ``<type>\\n<due>\\n<id len>\\n<id><payload>``. Returns mark, type, due, id and payload."""
    length, _, rest = data.partition(b"\n")
    mark, task = rest[: int(length)], rest[int(length) :]
    node_type, due, id_len, tail = task.split(b"\n", 3)
    return mark, node_type.decode(), due, tail[: int(id_len)], tail[int(id_len) :]
