//! Graphs a handler declares through the `workflow` interface: committed with its run's ack, declared once by a host, refused at once when malformed, and refused (logged) when its id is in use.

use super::WAIT;
use crate::support::{Host, RedisServer, key, schedule_now, stat, store, test_plugin, ty, wait_for};
use hourglass::group::GroupId;
use redis::Commands;

const CONFIG: &str = "[types.start]\nmay_schedule = [\"flow\", \"work\"]\nmax_attempts = 1\n";

fn plugins() -> [(&'static str, std::path::PathBuf); 3] {
    [("start", test_plugin("chaos")), ("work", test_plugin("chaos")), ("flow", test_plugin("chaos"))]
}

/// A run of `start` declares a diamond of `work` nodes; the host runs it to
/// the end, each node once, after its parents.
#[test]
fn a_graph_a_handler_declares_runs_to_the_end() {
    let server = RedisServer::start();
    let mut c = server.client();
    let host = Host::start(&server, &plugins(), CONFIG);
    schedule_now(&mut c, "start", "s-1", "graph:flow:h-1:work");
    let rt = crate::support::tokio_runtime();
    let s = rt.block_on(store(&server));
    let gid: GroupId = "h-1".parse().unwrap();
    let v = wait_for("the graph to be done", WAIT, || {
        rt.block_on(s.graph_show(&ty("flow"), &gid)).unwrap().filter(|v| v.state == "done")
    });
    let states: Vec<(&str, &str)> = v.nodes.iter().map(|n| (n.name.as_str(), n.state.as_str())).collect();
    assert_eq!(states, [("a", "succeeded"), ("b", "succeeded"), ("c", "succeeded"), ("d", "succeeded")]);
    assert_eq!(stat(&mut c, "start", "succeeded"), 1);
    assert_eq!((stat(&mut c, "flow", "graphs_opened"), stat(&mut c, "flow", "graphs_completed")), (1, 1));
    let log = host.log();
    for n in ["a", "b", "c", "d"] {
        assert_eq!(host.runs_of(&log, "work", &format!("h-1/{n}")), 1, "{n} ran once\n{log}");
    }
    assert!(log.contains("workflow graph declared by a run"), "{log}");
}

/// A malformed graph (a cycle) is refused at the call: the handler gets the
/// error, nothing is declared. A graph whose id is in use is refused when
/// delivered: logged and counted, the existing graph untouched.
#[test]
fn a_bad_graph_is_refused_at_the_call_and_a_taken_id_when_delivered() {
    let server = RedisServer::start();
    let mut c = server.client();
    let host = Host::start(&server, &plugins(), CONFIG);
    schedule_now(&mut c, "start", "cycle", "graph-cycle:flow:h-2:work");
    wait_for("the run to die", WAIT, || {
        let error: Option<String> = c.hget(key("start", "errors"), "cycle").unwrap();
        let dead: Option<f64> = c.zscore(key("start", "dead"), "cycle").unwrap();
        dead.map(|_| error)
    });
    let log = host.log();
    assert!(
        log.contains(r#"graph "h-2" has a cycle through edge "d" -> "a""#),
        "the handler's error names the cycle:\n{log}"
    );
    assert!(!c.exists::<_, bool>(key("flow", "graph:h-2")).unwrap(), "nothing declared");

    // The id is taken by a graph the CLI declared; a run declaring it again is refused on delivery.
    let rt = crate::support::tokio_runtime();
    let s = rt.block_on(store(&server));
    let gid: GroupId = "h-3".parse().unwrap();
    let first = hourglass::graph::parse_nodes(r#"{"nodes": [{"name": "x", "type": "idle"}]}"#, &gid).unwrap();
    rt.block_on(s.graph_open(&ty("flow"), &gid, &first)).unwrap();
    schedule_now(&mut c, "start", "taken", "graph:flow:h-3:work");
    let log = wait_for("the refusal", WAIT, || {
        let log = host.log();
        log.contains("a graph a run declared was refused").then_some(log)
    });
    assert!(log.contains("graph=flow/h-3") && log.contains("graph ids are used once"), "{log}");
    assert_eq!(stat(&mut c, "start", "succeeded"), 1, "the run itself succeeded");
    let v = rt.block_on(s.graph_show(&ty("flow"), &gid)).unwrap().unwrap();
    assert_eq!(v.nodes.len(), 1, "the graph declared first is untouched");
    assert_eq!(stat(&mut c, "flow", "graphs_opened"), 1);
}

/// A run's graph entry delivered twice (a host that died after declaring it,
/// before clearing the entry) is declared once.
#[tokio::test(flavor = "multi_thread")]
async fn a_graph_entry_delivered_twice_is_declared_once() {
    use hourglass::task::{GraphWork, Outcome, RunInfo, Settlement};
    let server = RedisServer::start();
    let mut c = server.client();
    let s = store(&server).await;
    let _: () = c.zadd(key("start", "due"), "s-1", 0).unwrap();
    let claimed = super::claim_all(&s, "start").await;
    let gid: GroupId = "twice".parse().unwrap();
    let nodes = hourglass::graph::parse_nodes(
        r#"{"nodes": [{"name": "a", "type": "work"}, {"name": "b", "type": "work", "parents": ["a"]}]}"#,
        &gid,
    )
    .unwrap();
    let work = GraphWork { home: ty("flow"), id: gid.clone(), nodes };
    let ack = Outcome::Ack { followups: vec![], groups: vec![], graphs: vec![work] };
    let settled = Settlement { lease: claimed[0].lease(), outcome: ack, run: RunInfo::default() };
    s.settle(&ty("start"), &[settled], None).await.unwrap();
    let entries: Vec<(Vec<u8>, Vec<u8>)> = c.hgetall(key("start", "outbox")).unwrap();
    assert_eq!(entries.len(), 1, "one outbox entry, committed with the ack");
    assert!(entries[0].0.ends_with(b":graph"));
    let flushed = s.flush_outbox(&ty("start")).await.unwrap();
    assert_eq!(flushed.graphs_declared, [(ty("flow"), gid.clone())]);
    // Put back, as a host that died before clearing it leaves it: delivered again, nothing changes.
    let _: () = c.hset(key("start", "outbox"), &entries[0].0, &entries[0].1).unwrap();
    let again = s.flush_outbox(&ty("start")).await.unwrap();
    assert!(again.graphs_declared.is_empty() && again.graphs_refused.is_empty(), "{again:?}");
    assert_eq!(stat(&mut c, "flow", "graphs_opened"), 1);
    let v = s.graph_show(&ty("flow"), &gid).await.unwrap().unwrap();
    assert_eq!(v.nodes.iter().map(|n| n.state.as_str()).collect::<Vec<_>>(), ["scheduled", "waiting"]);
    let due: Vec<String> = c.zrange(key("work", "due"), 0, -1).unwrap();
    assert_eq!(due, ["twice/a"], "the root was scheduled once, with the declaration");
}
