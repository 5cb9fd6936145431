"""Workflow graphs declared from Python against a real redis-server: what is written, what is refused
(whole, nothing written), and how a graph is shown. Nodes running to the end under a real host is
tests/host/workflows/clients.rs's part."""

from __future__ import annotations

import asyncio
import json
import unittest

import redis.asyncio
from support import ServerTest

import hourglass_client as hg
from hourglass_client import GraphRefused, Hourglass, InvalidArgument, Node, NodeState


def diamond() -> list:
    return [
        Node("a", "step", payload={"n": 1}),
        Node("b", "step", parents=["a"]),
        Node("c", "check", id="c-17", parents=["a"], when="success"),
        Node("d", "step", parents=["b", "c"]),
    ]


class GraphTest(ServerTest):
    def setUp(self):
        super().setUp()
        self.hg = Hourglass(self.r, shards={"check": 3})

    def test_a_diamond_is_declared_whole_and_its_root_scheduled_at_once(self):
        declared = self.hg.graph_submit("flow", "g-1", diamond())
        self.assertEqual((declared.nodes, declared.edges, declared.roots), (4, 4, 1))
        # The root is an ordinary task of its type, due now, with its payload, marked as the graph's node.
        self.assertEqual(self.r.zrange("hourglass:{step}:due", 0, -1), [b"g-1/a"])
        self.assertEqual(self.r.hget("hourglass:{step}:payload", "g-1/a"), b'{"n":1}')
        self.assertEqual(self.r.hget("hourglass:{step}:member", "g-1/a"), b"\x1fflow\ng-1\n1")
        self.assertEqual(self.r.hlen("hourglass:{flow}:outbox"), 0, "the root's entry was delivered")
        view = self.hg.show("step", "g-1/a")
        self.assertEqual((view.graph, view.group), ("flow/g-1", None))
        self.assertIsNone(self.hg.show("check", "c-17").graph, "not scheduled until its parent ends")

        shown = self.hg.graph_show("flow", "g-1")
        assert shown is not None
        self.assertEqual((shown.state, shown.edges), ("running", 4))
        self.assertEqual(shown.counts, {"waiting": 3, "scheduled": 1, "succeeded": 0, "dead": 0, "cancelled": 0, "skipped": 0})
        self.assertEqual([(n.name, n.state, n.parents, n.waiting_for) for n in shown.nodes], [
            ("a", NodeState.SCHEDULED, [], 0),
            ("b", NodeState.WAITING, ["a"], 1),
            ("c", NodeState.WAITING, ["a"], 1),
            ("d", NodeState.WAITING, ["b", "c"], 2),
        ])
        self.assertEqual((shown.nodes[2].task_type, shown.nodes[2].id, shown.nodes[2].when), ("check", "c-17", "success"))
        self.assertIsNone(self.hg.graph_show("flow", "never"))
        stats = self.hg.stats("flow")
        self.assertEqual((stats.graphs_running, stats.graphs_opened, stats.graphs_completed, stats.graphs_failed), (1, 1, 0, 0))

    def test_a_refused_graph_is_a_typed_one_line_error_and_writes_nothing(self):
        self.r.zadd("hourglass:{step}:due", {"taken": 1})
        before = sorted(self.r.keys("*"))
        cases = [
            ([Node("a", "step", parents=["b"]), Node("b", "step", parents=["a"])], "has a cycle through edge"),
            ([Node("a", "step"), Node("b", "step", parents=["x"])], '"x" is not a node of the graph'),
            ([Node("a", "step"), Node("a", "step", id="other")], 'two nodes are named "a"'),
            ([Node("a", "step", id="same"), Node("b", "step", id="same")], "are both task step/same"),
            ([Node("a", "step", id="taken")], "node 'a': task step/taken is waiting"),
        ]
        for nodes, says in cases:
            with self.assertRaises(GraphRefused) as caught:
                self.hg.graph_submit("flow", "g", nodes)
            self.assertIn(says, str(caught.exception))
            self.assertEqual(len(str(caught.exception).splitlines()), 1)
            self.assertEqual(caught.exception.code, "HG_GRAPH_REFUSED")
            self.assertEqual(sorted(self.r.keys("*")), before, f"{says}: something was written")

        self.hg.graph_submit("flow", "g", [Node("a", "step")])
        with self.assertRaises(GraphRefused) as caught:
            self.hg.graph_submit("flow", "g", [Node("z", "step")])
        self.assertIn("graph flow/g exists (running): graph ids are used once", str(caught.exception))

        bad_arguments = [
            (lambda: self.hg.graph_submit("Flow", "g2", [Node("a", "step")]), hg.InvalidTaskType),
            (lambda: self.hg.graph_submit("flow", "", [Node("a", "step")]), hg.InvalidId),
            (lambda: self.hg.graph_submit("flow", "g2", []), InvalidArgument),
            (lambda: self.hg.graph_submit("flow", "g2", [Node("a", "Step")]), hg.InvalidTaskType),
            (lambda: self.hg.graph_submit("flow", "g2", [Node("a", "step", when="sometimes")]), InvalidArgument),  # type: ignore[arg-type]
            (lambda: self.hg.graph_submit("flow", "g2", [Node("a", "step", parents="b")]), InvalidArgument),
            (lambda: self.hg.graph_submit("flow", "g2", [Node("a", "step", payload=b"\xff")]), InvalidArgument),
            (lambda: self.hg.graph_submit("flow", "g2", [("a", "step")]), InvalidArgument),  # type: ignore[list-item]
        ]
        for call, error in bad_arguments:
            with self.assertRaises(error):
                call()
        self.assertIsNone(self.hg.graph_show("flow", "g2"))

    def test_a_cancelled_graph_skips_what_waits_and_removes_what_is_scheduled(self):
        self.hg.graph_submit("flow", "g-c", diamond())
        self.assertIsNone(self.hg.graph_cancel("flow", "never"))
        done = self.hg.graph_cancel("flow", "g-c")
        self.assertEqual(done, hg.GraphCancelled(was_done=False, skipped=3, removed=1, stopping=0, ended=0))
        self.assertEqual(self.r.zcard("hourglass:{step}:due"), 0, "the root waited to run: removed")
        shown = self.hg.graph_show("flow", "g-c")
        assert shown is not None
        self.assertIsNotNone(shown.cancelled_ms)
        self.assertEqual([(n.state, n.reason) for n in shown.nodes[1:]], [("skipped", "graph cancelled")] * 3)
        # The root's end waits in its type's outbox for a host, which then finishes the graph.
        self.assertEqual(self.r.hlen("hourglass:{step}:outbox"), 1)

    def test_nodes_of_a_sharded_type_go_to_their_shards(self):
        nodes = [Node("root", "step")] + [Node(f"n{i}", "check", parents=["root"]) for i in range(3)]
        nodes += [Node(f"r{i}", "check") for i in range(20)]
        self.assertEqual(self.hg.graph_submit("flow", "s", nodes).roots, 21)
        placed = 0
        for i in range(20):
            q = self.hg.shard_for("check", f"s/r{i}")
            self.assertIsNotNone(self.r.zscore(f"hourglass:{{{q}}}:due", f"s/r{i}"), f"s/r{i} not in {q}")
            placed += 1
        self.assertEqual(placed, 20)
        self.assertEqual(self.hg.show("check", "s/r7").graph, "flow/s")

    def test_the_asyncio_client_declares_and_shows_graphs(self):
        async def main() -> None:
            client = redis.asyncio.Redis(unix_socket_path=self.server.socket)
            a = hg.AsyncHourglass(client)
            declared = await a.graph_submit("flow", "g-2", diamond())
            self.assertEqual(declared.roots, 1)
            shown = await a.graph_show("flow", "g-2")
            assert shown is not None
            self.assertEqual([n.state for n in shown.nodes][:2], ["scheduled", "waiting"])
            with self.assertRaises(GraphRefused):
                await a.graph_submit("flow", "g-3", [Node("a", "step", parents=["a"])])
            await client.aclose()

        asyncio.run(main())
        self.assertEqual(json.loads(self.r.hget("hourglass:{step}:payload", "g-2/a")), {"n": 1})


if __name__ == "__main__":
    unittest.main()
