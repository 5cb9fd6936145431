//! A host paused (SIGSTOP) past its lease in the middle of a workflow graph: no node lost or committed twice, none started before its parents committed, only the nodes the paused host held run twice (its late outcomes fenced), the graph done once.

use super::{TYPE, Wrapped, commits, config, lose_h1_for_a_while, tasks};
use crate::support::{RedisServer, stat};
use hourglass::group::{FireWhen, GroupId};
use hourglass::store::NodeSpec;

/// Nodes per layer; each waits for two of the layer above.
const WIDTH: usize = 20;

/// The graph, declared with the tasks' own type as its home: `n` nodes
/// `w0..w<n>` in layers of [`WIDTH`], each sleeping `run_ms`.
fn declare(redis: &RedisServer, n: usize, run_ms: u64) {
    let nodes: Vec<NodeSpec> = (0..n)
        .map(|i| NodeSpec {
            name: format!("w{i}"),
            task_type: TYPE.parse().unwrap(),
            id: format!("w{i}"),
            payload: format!("sleep:{run_ms}"),
            when: FireWhen::AllSucceeded,
            parents: parents(i).into_iter().map(|p| format!("w{p}")).collect(),
        })
        .collect();
    let gid: GroupId = "g".parse().unwrap();
    let rt = crate::support::tokio_runtime();
    rt.block_on(async { crate::support::store(redis).await.graph_open(&TYPE.parse().unwrap(), &gid, &nodes).await })
        .unwrap();
}

/// Node `i`'s parents: two of the layer above.
fn parents(i: usize) -> Vec<usize> {
    let (layer, at) = (i / WIDTH, i % WIDTH);
    if layer == 0 { vec![] } else { vec![(layer - 1) * WIDTH + at, (layer - 1) * WIDTH + (at + 7) % WIDTH] }
}

#[test]
fn a_host_paused_past_its_lease_mid_graph_loses_no_node_and_runs_none_before_its_parents() {
    let n = tasks();
    let redis = RedisServer::start();
    let h1 = Wrapped::start(&redis.url(), &config("h1", n), &[], &[]);
    let cut = || {
        h1.signal("STOP");
        h1.wait_stopped();
    };
    let heal = || h1.signal("CONT");
    let start = |_: &mut redis::Connection, n: usize, run_ms: u64| declare(&redis, n, run_ms);
    let report =
        lose_h1_for_a_while("host paused (SIGSTOP) past its lease mid-graph", &redis, &h1, &cut, &heal, 200, &start);
    assert_eq!(report.completed, n);
    let mut conn = redis.client();
    assert_eq!(stat(&mut conn, TYPE, "graphs_completed"), 1, "the graph is done exactly once");
    assert_eq!(stat(&mut conn, TYPE, "graphs_failed"), 0);
    // Each node started (by its host's clock, this machine's) after its parents were committed (Redis's clock).
    let commits = commits(&mut conn);
    for i in WIDTH..n {
        let child = &commits[&format!("w{i}")][0];
        for p in parents(i) {
            let parent = &commits[&format!("w{p}")][0];
            assert!(
                parent.at_ms <= child.started_ms,
                "w{i} started at {}, before w{p} was committed at {}",
                child.started_ms,
                parent.at_ms
            );
        }
    }
}
