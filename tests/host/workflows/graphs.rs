//! Workflow graphs: a node runs once, after all its parents, or is skipped with its reason; a graph with a
//! cycle, an unknown parent or a task used twice is refused whole; the CLI declares and shows one; hosts run one,
//! through a host killed and a Redis restart.

use std::collections::{BTreeMap, BTreeSet};

use super::{WAIT, claim_all, ended};
use crate::support::{Host, RedisServer, ack, hourglass_on, key, stat, store, test_plugin, ty};
use hourglass::group::{FireWhen, GroupId};
use hourglass::store::{GraphRefusal, NodeSpec, Store};
use hourglass::task::Outcome;
use redis::Commands;

fn node(name: &str, when: FireWhen, parents: &[&str]) -> NodeSpec {
    NodeSpec {
        name: name.into(),
        task_type: ty("step"),
        id: format!("g1.{name}"),
        payload: format!("payload of {name}"),
        when,
        parents: parents.iter().map(|p| p.to_string()).collect(),
    }
}

fn gid(id: &str) -> GroupId {
    id.parse().unwrap()
}

/// Runs the graph's nodes as they come, each ending as `plan` says (default:
/// succeeded), moving the outboxes by hand. Returns the order in which nodes
/// were claimed, one batch per round.
async fn drive(s: &Store, plan: &BTreeMap<&str, &str>) -> Vec<Vec<String>> {
    let mut rounds = Vec::new();
    for _ in 0..20 {
        s.flush_outbox(&ty("flow")).await.unwrap();
        let tasks = claim_all(s, "step").await;
        if tasks.is_empty() {
            break;
        }
        let mut names = Vec::new();
        let mut settlements = Vec::new();
        for t in &tasks {
            let name = String::from_utf8(t.id.clone()).unwrap().trim_start_matches("g1.").to_owned();
            assert_eq!(t.payload, format!("payload of {name}").into_bytes(), "a node gets its own payload");
            settlements.push(match plan.get(name.as_str()).copied().unwrap_or("succeeded") {
                "dead" => ended(t, Outcome::Dead { error: "failed".into() }),
                _ => ack(t, vec![]),
            });
            names.push(name);
        }
        names.sort();
        s.settle(&ty("step"), &settlements, None).await.unwrap();
        s.flush_outbox(&ty("step")).await.unwrap();
        rounds.push(names);
    }
    rounds
}

#[tokio::test(flavor = "multi_thread")]
async fn each_node_runs_once_after_all_its_parents_and_a_failure_skips_what_needs_success() {
    let server = RedisServer::start();
    let mut c = server.client();
    let s = store(&server).await;
    use FireWhen::{AllEnded as All, AllSucceeded as Success};
    // Two diamonds sharing a: a and b feed c, a also feeds d; b fails, so g
    // (success) is skipped, h (success, below g) too, and i (all) still runs.
    let nodes = vec![
        node("c", All, &["a", "b"]),
        node("a", All, &[]),
        node("b", All, &[]),
        node("d", Success, &["a"]),
        node("e", Success, &["c"]),
        node("f", All, &["d"]),
        node("g", Success, &["b"]),
        node("h", Success, &["g"]),
        node("i", All, &["g", "c"]),
    ];
    let declared = s.graph_open(&ty("flow"), &gid("g1"), &nodes).await.unwrap();
    assert_eq!((declared.nodes, declared.edges, declared.roots), (9, 9, 2));
    assert_eq!(stat(&mut c, "flow", "graphs_opened"), 1);
    let shown = s.graph_show(&ty("flow"), &gid("g1")).await.unwrap().unwrap();
    assert_eq!(shown.state, "running");
    assert_eq!(shown.nodes[0].name, "c", "nodes are shown in the order declared");
    assert_eq!((shown.nodes[0].waiting_for, shown.nodes[0].parents.clone()), (2, vec!["a".to_owned(), "b".to_owned()]));

    s.flush_outbox(&ty("flow")).await.unwrap();
    let root = s.show(&ty("step"), b"g1.a").await.unwrap();
    assert_eq!((root.graph.as_deref(), root.group.as_deref()), (Some("flow/g1"), None), "a node says whose it is");

    let plan = BTreeMap::from([("b", "dead"), ("d", "dead")]);
    let rounds = drive(&s, &plan).await;
    let words = |r: &[&str]| r.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(rounds, vec![words(&["a", "b"]), words(&["c", "d"]), words(&["e", "f", "i"])], "each after its parents");

    let v = s.graph_show(&ty("flow"), &gid("g1")).await.unwrap().unwrap();
    assert_eq!(v.state, "done");
    let states: BTreeMap<&str, (&str, Option<&str>)> =
        v.nodes.iter().map(|n| (n.name.as_str(), (n.state.as_str(), n.reason.as_deref()))).collect();
    assert_eq!(states["a"], ("succeeded", None));
    assert_eq!(states["b"], ("dead", None));
    assert_eq!(states["d"], ("dead", None));
    assert_eq!(states["f"], ("succeeded", None), "all: runs after a dead parent");
    assert_eq!(states["g"], ("skipped", Some("parent b dead")));
    assert_eq!(states["h"], ("skipped", Some("parent g skipped")), "a skip travels down");
    assert_eq!(states["i"], ("succeeded", None), "all: runs after a skipped parent");
    assert_eq!((v.counts["succeeded"], v.counts["dead"], v.counts["skipped"]), (5, 2, 2));
    assert_eq!((stat(&mut c, "flow", "graphs_completed"), stat(&mut c, "flow", "graphs_failed")), (1, 1));
    let open: Vec<String> = c.zrange(key("flow", "graphs"), 0, -1).unwrap();
    assert!(open.is_empty(), "a done graph leaves the index");
    let ttl: i64 = c.pttl(key("flow", "graph:g1")).unwrap();
    assert!(ttl > 0, "a done graph is kept for a while, then expires");
    let marks: Vec<String> = c.hkeys(key("step", "member")).unwrap();
    assert!(marks.is_empty(), "no node keeps its mark: {marks:?}");

    // A report delivered again changes nothing: the node has ended.
    let again = s.graph_show(&ty("flow"), &gid("g1")).await.unwrap().unwrap();
    assert_eq!(again, v);
}

#[tokio::test(flavor = "multi_thread")]
async fn nodes_of_the_graph_s_own_type_are_released_in_the_pass_that_delivers_their_parents_end() {
    let server = RedisServer::start();
    let s = store(&server).await;
    let mut nodes = vec![node("a", FireWhen::AllEnded, &[]), node("b", FireWhen::AllEnded, &["a"])];
    for n in &mut nodes {
        n.task_type = ty("flow");
    }
    s.graph_open(&ty("flow"), &gid("own"), &nodes).await.unwrap();
    s.flush_outbox(&ty("flow")).await.unwrap();
    let a = claim_all(&s, "flow").await;
    assert_eq!(a.len(), 1);
    s.settle(&ty("flow"), &[ack(&a[0], vec![])], None).await.unwrap();
    // One pass: a's end reaches the graph, and b, released, is scheduled at once.
    s.flush_outbox(&ty("flow")).await.unwrap();
    let b = claim_all(&s, "flow").await;
    assert_eq!(b.iter().map(|t| t.id.clone()).collect::<Vec<_>>(), vec![b"g1.b".to_vec()]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bad_graph_is_refused_whole_naming_the_culprit_and_nothing_is_written() {
    let server = RedisServer::start();
    let mut c = server.client();
    let s = store(&server).await;
    use FireWhen::AllEnded as All;
    let cases: Vec<(Vec<NodeSpec>, &str)> = vec![
        (
            vec![node("a", All, &["c"]), node("b", All, &["a"]), node("c", All, &["b"]), node("r", All, &[])],
            "cycle through edge",
        ),
        (vec![node("a", All, &[]), node("b", All, &["x"])], "edge \"x\" -> \"b\": \"x\" is not a node"),
        (vec![node("a", All, &[]), node("a", All, &[])], "two nodes are named \"a\""),
        (vec![node("a", All, &[]), node("b", All, &["a", "a"])], "edge \"a\" -> \"b\" is given twice"),
        (vec![node("a", All, &["a"])], "cannot be its own parent"),
        (vec![node("a", All, &[]), NodeSpec { name: "b".into(), ..node("a", All, &[]) }], "are both task step/g1.a"),
        (vec![], "at least one node"),
    ];
    for (nodes, why) in cases {
        let e = s.graph_open(&ty("flow"), &gid("bad"), &nodes).await.unwrap_err();
        let refusal = GraphRefusal::of(&e).unwrap_or_else(|| panic!("not a refusal: {e:#}"));
        assert!(refusal.0.contains(why), "{refusal} should say {why:?}");
        assert!(!refusal.0.contains('\n'), "one line: {refusal}");
    }
    let keys: Vec<String> = c.keys("*").unwrap();
    assert!(keys.is_empty(), "a refused graph writes nothing: {keys:?}");

    // Declared once; the id cannot be used again, and the second try writes nothing.
    s.graph_open(&ty("flow"), &gid("once"), &[node("a", All, &[])]).await.unwrap();
    let outbox: usize = c.hlen(key("flow", "outbox")).unwrap();
    let e = s.graph_open(&ty("flow"), &gid("once"), &[node("z", All, &[])]).await.unwrap_err();
    assert!(GraphRefusal::of(&e).unwrap().0.contains("exists"), "{e:#}");
    assert_eq!(c.hlen::<_, usize>(key("flow", "outbox")).unwrap(), outbox);
    assert_eq!(stat(&mut c, "flow", "graphs_opened"), 1);
}

#[test]
fn the_cli_declares_a_graph_refuses_a_taken_id_and_hosts_run_it_to_the_end() {
    let server = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("graph.json");
    // chaos: an empty payload succeeds, "permanent:..." dead-letters.
    std::fs::write(
        &file,
        r#"{"nodes": [
            {"name": "a", "type": "work"},
            {"name": "b", "type": "work", "payload": "permanent:card declined"},
            {"name": "c", "type": "work", "parents": ["a", "b"]},
            {"name": "d", "type": "work", "parents": ["a"], "when": "success"},
            {"name": "e", "type": "work", "parents": ["b"], "when": "success"},
            {"name": "f", "type": "work", "parents": ["c", "d", "e"]}
        ]}"#,
    )
    .unwrap();
    // Bad input: one line naming the culprit, exit 1, nothing written.
    let bad_file = dir.path().join("bad.json");
    std::fs::write(&bad_file, r#"{"nodes": [{"name": "a", "type": "work", "colour": "red"}]}"#).unwrap();
    let bad_type = dir.path().join("bad-type.json");
    std::fs::write(&bad_type, r#"{"nodes": [{"name": "a", "type": "no spaces"}]}"#).unwrap();
    for (args, says) in [
        (vec!["graph", "submit", "flow", "", file.to_str().unwrap()], "invalid graph id \"\""),
        (vec!["graph", "submit", "flow", "g7", bad_file.to_str().unwrap()], "unknown field `colour`"),
        (vec!["graph", "submit", "flow", "g7", bad_type.to_str().unwrap()], "node \"a\""),
        (vec!["graph", "submit", "flow", "g7", "/no/such/file.json"], "cannot read /no/such/file.json"),
    ] {
        let out = hourglass_on(&server, &args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(says), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: one line: {err}");
    }
    // A node whose task is already waiting is refused before anything is written.
    let mut c = server.client();
    let () = c.zadd(key("work", "due"), "g7/a", 4_102_444_800_000i64).unwrap();
    let out = hourglass_on(&server, &["graph", "submit", "flow", "g7", file.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("node \"a\": task work/g7/a is waiting"), "{err}");
    assert!(!c.exists::<_, bool>(key("flow", "graph:g7")).unwrap(), "nothing written");
    let () = c.zrem(key("work", "due"), "g7/a").unwrap();

    let out = hourglass_on(&server, &["graph", "submit", "flow", "g7", file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("6 nodes, 7 edges, 2 scheduled now"));

    let config = "[types.work]\nmax_attempts = 1\n";
    let host = Host::start(&server, &[("work", test_plugin("chaos")), ("flow", test_plugin("chaos"))], config);
    let deadline = std::time::Instant::now() + WAIT;
    let shown = loop {
        let out = hourglass_on(&server, &["graph", "show", "flow", "g7", "--json"]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        if v["state"] == "done" {
            break v;
        }
        assert!(std::time::Instant::now() < deadline, "graph not done: {v}\n{}", host.log());
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let states: BTreeMap<String, String> = shown["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| (n["name"].as_str().unwrap().to_owned(), n["state"].as_str().unwrap().to_owned()))
        .collect();
    let want: BTreeMap<String, String> = [
        ("a", "succeeded"),
        ("b", "dead"),
        ("c", "succeeded"),
        ("d", "succeeded"),
        ("e", "skipped"),
        ("f", "succeeded"),
    ]
    .into_iter()
    .map(|(a, b)| (a.to_owned(), b.to_owned()))
    .collect();
    assert_eq!(states, want);
    let log = host.log();
    for name in ["a", "c", "d", "f"] {
        assert_eq!(host.runs_of(&log, "work", &format!("g7/{name}")), 1, "{name} ran once\n{log}");
    }
    let ran: BTreeSet<&str> = ["e"].into_iter().filter(|n| log.contains(&format!("task_id=g7/{n} "))).collect();
    assert!(ran.is_empty(), "a skipped node never runs: {ran:?}");

    let text = hourglass_on(&server, &["graph", "show", "flow", "g7"]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("graph flow/g7: done"), "{text}");
    assert!(text.contains("skipped   e = work/g7/e (when success) after b (parent b dead)"), "{text}");
    let unknown = hourglass_on(&server, &["graph", "show", "flow", "nope"]);
    assert_eq!(unknown.status.code(), Some(1));
}

/// Two hosts run a graph of four layers, each node waiting for three of the
/// layer above (diamonds everywhere); one host is killed with SIGKILL
/// mid-graph. Every node succeeds exactly once (one success in the type's
/// events), and starts only after each of its parents finished.
#[test]
fn a_host_killed_mid_graph_loses_no_node_and_runs_none_before_its_parents() {
    const LAYERS: usize = 4;
    const WIDTH: usize = 25;
    let server = RedisServer::start();
    let mut c = server.client();
    // At most 4 runs at a time on each host, so both hosts have nodes running when one is killed.
    let config = "[runner]\nlease = \"2s\"\n[types.work]\nevents = true\nconcurrency = 4\n";
    let plugins = [("work", test_plugin("chaos")), ("flow", test_plugin("chaos"))];
    let mut hosts: Vec<Host> = (0..2).map(|_| Host::start(&server, &plugins, config)).collect();
    let name = |layer: usize, i: usize| format!("n{layer}-{i}");
    let mut nodes = Vec::new();
    let mut parents_of = BTreeMap::new();
    for layer in 0..LAYERS {
        for i in 0..WIDTH {
            let parents: Vec<String> =
                if layer == 0 { vec![] } else { (0..3).map(|k| name(layer - 1, (i + k * 7) % WIDTH)).collect() };
            parents_of.insert(
                format!("big/{}", name(layer, i)),
                parents.iter().map(|p| format!("big/{p}")).collect::<Vec<_>>(),
            );
            nodes.push(NodeSpec {
                name: name(layer, i),
                task_type: ty("work"),
                id: format!("big/{}", name(layer, i)),
                payload: "sleep:30".into(),
                when: FireWhen::AllSucceeded,
                parents,
            });
        }
    }
    let rt = crate::support::tokio_runtime();
    let s = rt.block_on(store(&server));
    rt.block_on(s.graph_open(&ty("flow"), &gid("big"), &nodes)).unwrap();
    crate::support::wait_for("a third of the nodes to be done", WAIT, || {
        (stat(&mut c, "work", "succeeded") > (LAYERS * WIDTH / 3) as i64).then_some(())
    });
    let log = hosts[1].log();
    assert!(log.contains("task_type=work") && log.contains("succeeded"), "the host to kill runs nodes too:\n{log}");
    hosts[1].signal("KILL");
    hosts[1].wait_exit(std::time::Duration::from_secs(10));
    let v = crate::support::wait_for("the graph to be done", std::time::Duration::from_secs(180), || {
        rt.block_on(s.graph_show(&ty("flow"), &gid("big"))).unwrap().filter(|v| v.state == "done")
    });
    assert_eq!(v.counts["succeeded"], (LAYERS * WIDTH) as u64, "{:?}", v.counts);
    assert_eq!(stat(&mut c, "flow", "graphs_completed"), 1, "done exactly once");

    // One success per node in the events, each started after its parents finished.
    let events: redis::streams::StreamRangeReply = c.xrange_all(key("work", "events")).unwrap();
    let mut runs: BTreeMap<String, (i64, i64)> = BTreeMap::new();
    for e in &events.ids {
        let field = |f: &str| e.get::<String>(f).unwrap_or_default();
        if field("outcome") != "succeeded" {
            continue;
        }
        assert_eq!(field("graph"), "big", "a node's event names its graph");
        let times = (field("started_ms").parse().unwrap(), field("finished_ms").parse().unwrap());
        assert!(runs.insert(field("id"), times).is_none(), "{} succeeded twice", field("id"));
    }
    assert_eq!(runs.len(), LAYERS * WIDTH);
    for (id, parents) in &parents_of {
        let started = runs[id].0;
        for p in parents {
            assert!(runs[p].1 <= started, "{id} started at {started}, before its parent {p} finished at {}", runs[p].1);
        }
    }
    drop(hosts);
}

/// Redis restarts (from its append-only file) while a graph's nodes run:
/// no node is lost, none runs twice, and the graph is done once.
#[test]
fn a_redis_restart_mid_graph_loses_no_node() {
    let mut server = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let mut c = server.client();
    let config = "[runner]\nlease = \"2s\"\n[types.work]\nevents = true\n";
    let host = Host::start(&server, &[("work", test_plugin("chaos")), ("flow", test_plugin("chaos"))], config);
    // A chain of layers: every node of a layer waits for the whole layer above.
    let nodes: Vec<NodeSpec> = (0..5)
        .flat_map(|layer| {
            (0..20).map(move |i| NodeSpec {
                name: format!("n{layer}-{i}"),
                task_type: ty("work"),
                id: format!("r/n{layer}-{i}"),
                payload: "sleep:20".into(),
                when: FireWhen::AllSucceeded,
                parents: if layer == 0 { vec![] } else { (0..20).map(|p| format!("n{}-{p}", layer - 1)).collect() },
            })
        })
        .collect();
    let rt = crate::support::tokio_runtime();
    let s = rt.block_on(store(&server));
    rt.block_on(s.graph_open(&ty("flow"), &gid("r"), &nodes)).unwrap();
    crate::support::wait_for("some nodes to end", WAIT, || (stat(&mut c, "work", "succeeded") > 25).then_some(()));
    server.restart(&["--appendonly", "yes", "--appendfsync", "always"]);
    let mut c = server.client();
    let s = rt.block_on(store(&server));
    let v = crate::support::wait_for("the graph to be done", std::time::Duration::from_secs(180), || {
        rt.block_on(s.graph_show(&ty("flow"), &gid("r"))).ok().flatten().filter(|v| v.state == "done")
    });
    assert_eq!(v.counts["succeeded"], 100, "{:?}", v.counts);
    assert_eq!(stat(&mut c, "flow", "graphs_completed"), 1);
    let events: redis::streams::StreamRangeReply = c.xrange_all(key("work", "events")).unwrap();
    let mut succeeded = BTreeSet::new();
    for e in &events.ids {
        if e.get::<String>("outcome").as_deref() == Some("succeeded") {
            assert!(succeeded.insert(e.get::<String>("id").unwrap()), "a node succeeded twice");
        }
    }
    assert_eq!(succeeded.len(), 100);
    drop(host);
}

/// `hourglass graph cancel`: the waiting nodes are skipped at once, a node
/// waiting to run is removed, a running one is stopped by its host; all end,
/// the graph is done (failed) once, and nothing below ever runs.
#[test]
fn a_cancelled_graph_skips_what_waits_and_stops_what_runs() {
    let server = RedisServer::start();
    let mut c = server.client();
    let host = Host::start(&server, &[("work", test_plugin("chaos")), ("flow", test_plugin("chaos"))], "");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("graph.json");
    // No host serves `idle`: its root stays waiting to run.
    std::fs::write(
        &file,
        r#"{"nodes": [
            {"name": "long", "type": "work", "payload": "progress:50:60000"},
            {"name": "idle", "type": "idle"},
            {"name": "after", "type": "work", "parents": ["long", "idle"]},
            {"name": "below", "type": "work", "parents": ["after"], "when": "success"}
        ]}"#,
    )
    .unwrap();
    let ok = |args: &[&str]| {
        let out = hourglass_on(&server, args);
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    ok(&["graph", "submit", "flow", "c", file.to_str().unwrap()]);
    let rt = crate::support::tokio_runtime();
    let s = rt.block_on(store(&server));
    crate::support::wait_for("the long node to run", WAIT, || {
        rt.block_on(s.show(&ty("work"), b"c/long")).unwrap().running.map(|_| ())
    });

    // Its progress: long reported 50 of 100, the others nothing yet.
    crate::support::wait_for("long to report its progress", WAIT, || {
        c.hexists::<_, _, bool>(key("work", "progress"), "c/long").unwrap().then_some(())
    });
    let shown: serde_json::Value = serde_json::from_str(&ok(&["graph", "show", "flow", "c", "--json"])).unwrap();
    assert_eq!(shown["progress"], serde_json::json!({"percent": 12.5, "scheduled_read": 2, "reporting": 1}));
    let text = ok(&["graph", "show", "flow", "c"]);
    assert!(text.contains("progress  12% done (1 of 2 scheduled nodes read have reported)"), "{text}");

    let said = ok(&["graph", "cancel", "flow", "c"]);
    assert!(
        said.contains("2 waiting nodes skipped; of the nodes scheduled, 1 removed before they ran, 1 running asked to stop, 0 ended already"),
        "{said}"
    );
    let v = crate::support::wait_for("the graph to be done", WAIT, || {
        rt.block_on(s.graph_show(&ty("flow"), &gid("c"))).unwrap().filter(|v| v.state == "done")
    });
    let states: Vec<(&str, &str, Option<&str>)> =
        v.nodes.iter().map(|n| (n.name.as_str(), n.state.as_str(), n.reason.as_deref())).collect();
    assert_eq!(
        states,
        [
            ("long", "cancelled", None),
            ("idle", "cancelled", None),
            ("after", "skipped", Some("graph cancelled")),
            ("below", "skipped", Some("graph cancelled")),
        ]
    );
    assert!(v.cancelled_ms.is_some());
    assert_eq!((stat(&mut c, "flow", "graphs_completed"), stat(&mut c, "flow", "graphs_failed")), (1, 1));
    assert_eq!(c.zcard::<_, u64>(key("idle", "due")).unwrap(), 0, "the waiting root was removed");
    let log = host.log();
    assert!(!log.contains("task_id=c/after ") && !log.contains("task_id=c/below "), "a skipped node ran:\n{log}");
    let shown = ok(&["graph", "show", "flow", "c"]);
    assert!(shown.contains("  cancelled ") && shown.contains("(graph cancelled)"), "{shown}");
    let stats = ok(&["stats"]);
    assert!(
        stats.contains("GRAPHS flow: 0 running, 1 done (1 with a node that did not succeed), 1 declared"),
        "{stats}"
    );

    assert!(ok(&["graph", "cancel", "flow", "c"]).contains("is done already"));
    let unknown = hourglass_on(&server, &["graph", "cancel", "flow", "nope"]);
    assert_eq!(unknown.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("no graph flow/nope"));
}
