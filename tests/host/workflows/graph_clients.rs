//! Graphs declared by Python, Node and the CLI, run by two hosts, one killed with SIGKILL mid-graph: every node ran once, after all its parents; the skips are right; progress was visible while nodes ran.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::WAIT;
use super::clients::{node, python};
use crate::support::{Host, RedisServer, hourglass_on, stat, test_plugin, wait_for};
use redis::Commands;
use serde_json::{Value, json};

const LAYERS: usize = 4;
const WIDTH: usize = 6;

/// One graph file (the CLI's format, which the clients' programs read too):
/// layers of diamonds (each node waits for two of the layer above, every
/// other one only if both succeeded), a node that dead-letters with a child
/// that needs success, that child's child, and one that runs anyway, and a
/// leaf that reports progress and runs on for a while so it can be watched.
fn graph_file() -> Value {
    let name = |layer: usize, i: usize| format!("n{layer}-{i}");
    let mut nodes = Vec::new();
    for layer in 0..LAYERS {
        for i in 0..WIDTH {
            let parents: Vec<String> =
                if layer == 0 { vec![] } else { vec![name(layer - 1, i), name(layer - 1, (i + 1) % WIDTH)] };
            let when = if i % 2 == 1 { "success" } else { "all" };
            nodes.push(json!({"name": name(layer, i), "type": "work", "payload": "sleep:400", "when": when, "parents": parents}));
        }
    }
    nodes.push(json!({"name": "bad", "type": "work", "payload": "permanent:card declined"}));
    nodes.push(json!({"name": "needs", "type": "work", "when": "success", "parents": ["bad", "n0-0"]}));
    nodes.push(json!({"name": "below", "type": "work", "when": "success", "parents": ["needs"]}));
    nodes.push(json!({"name": "anyway", "type": "work", "parents": ["bad", "n1-2"]}));
    nodes.push(json!({"name": "watched", "type": "work", "payload": "progress:40:8000", "parents": ["n0-1", "n0-2"]}));
    json!({ "nodes": nodes })
}

/// Successes of work, summed over its three shards (each keeps its own counters).
fn succeeded(c: &mut redis::Connection) -> i64 {
    let keys: Vec<String> = c.keys("hourglass:{work*}:stats").unwrap();
    keys.iter().map(|k| c.hget::<_, _, Option<i64>>(k, "succeeded").unwrap().unwrap_or(0)).sum()
}

/// Issue 54's check from outside the project.
#[test]
fn graphs_from_python_node_and_the_cli_run_each_node_once_through_a_killed_host() {
    let server = RedisServer::start();
    let mut c = server.client();
    // At most 4 runs at a time on each host, so both hosts have nodes running when one is killed.
    let config = "[runner]\nlease = \"2s\"\n[types.work]\nshards = 3\nevents = true\nconcurrency = 4\n";
    let plugins = [("work", test_plugin("chaos")), ("flow", test_plugin("chaos"))];
    let mut hosts: Vec<Host> = (0..2).map(|_| Host::start(&server, &plugins, config)).collect();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("graph.json");
    let spec = graph_file();
    std::fs::write(&file, spec.to_string()).unwrap();
    let path = file.to_str().unwrap();

    let py = python(
        &server,
        &format!(
            "import json\nspec = json.load(open({path:?}))['nodes']\n\
             nodes = [hg.Node(n['name'], n['type'], payload=n.get('payload'), when=n.get('when', 'all'), parents=n.get('parents', [])) for n in spec]\n\
             d = c.graph_submit('flow', 'py', nodes)\nprint(d.nodes, d.edges, d.roots)"
        ),
    );
    let js = node(
        &server,
        &format!(
            "const spec = JSON.parse(require('fs').readFileSync({path:?}, 'utf8')).nodes;\n\
             const d = await c.graphSubmit('flow', 'js', spec.map((n) => ({{ name: n.name, taskType: n.type, payload: n.payload, when: n.when, parents: n.parents }})));\n\
             console.log(d.nodes, d.edges, d.roots);"
        ),
    );
    let host_config = hosts[0].dir.path().join("runner.toml");
    let out =
        hourglass_on(&server, &["--config", host_config.to_str().unwrap(), "graph", "submit", "flow", "cli", path]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let nodes = LAYERS * WIDTH + 5;
    let edges = (LAYERS - 1) * WIDTH * 2 + 2 + 1 + 2 + 2;
    let roots = WIDTH + 1;
    assert_eq!(py, format!("{nodes} {edges} {roots}"));
    assert_eq!(js, py, "both clients declare the same graph");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&format!("{nodes} nodes, {edges} edges, {roots} scheduled now"))
    );

    // Kill one host once both have run nodes and a third of the three graphs' nodes succeeded.
    wait_for("a third of the nodes to succeed", WAIT, || (succeeded(&mut c) > nodes as i64).then_some(()));
    let log = hosts[1].log();
    assert!(log.contains("task_type=work") && log.contains("succeeded"), "the host to kill runs nodes too:\n{log}");
    hosts[1].signal("KILL");
    hosts[1].wait_exit(Duration::from_secs(10));

    // Progress, while the watched nodes run (8 s, again from the start if the killed host ran one):
    // Node sees Python's, Python sees the CLI's.
    let seen = wait_for("Node to see py/watched's progress", WAIT, || {
        let out = node(
            &server,
            "const v = await c.show('work', 'py/watched'); console.log(v.progress && v.state === 'running' ? `${v.state} ${v.progress.percent} ${v.graph}` : '');",
        );
        (!out.is_empty()).then_some(out)
    });
    assert_eq!(seen, "running 40 flow/py");
    let seen = wait_for("Python to see cli/watched's progress", WAIT, || {
        let out = python(
            &server,
            "v = c.show('work', 'cli/watched')\nprint(f'{v.state} {v.progress.percent} {v.graph}' if v.progress and v.state == 'running' else '')",
        );
        (!out.is_empty()).then_some(out)
    });
    assert_eq!(seen, "running 40 flow/cli");

    // Every graph done, read through each interface.
    for (graph, read) in [("py", "node"), ("js", "python"), ("cli", "cli")] {
        let states = wait_for(&format!("graph {graph} to be done"), Duration::from_secs(180), || {
            let out = match read {
                "node" => node(
                    &server,
                    &format!(
                        "const v = await c.graphShow('flow', '{graph}'); if (v.state === 'done') for (const n of v.nodes) console.log(n.name, n.state, n.reason ?? '');"
                    ),
                ),
                "python" => python(
                    &server,
                    &format!(
                        "v = c.graph_show('flow', '{graph}')\nif v.state == 'done':\n  for n in v.nodes: print(n.name, n.state, n.reason or '')"
                    ),
                ),
                _ => {
                    let out = hourglass_on(&server, &["graph", "show", "flow", graph, "--json"]);
                    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
                    let nodes = v["nodes"].as_array().unwrap();
                    if v["state"] != "done" {
                        String::new()
                    } else {
                        let line = |n: &Value| {
                            format!(
                                "{} {} {}",
                                n["name"].as_str().unwrap(),
                                n["state"].as_str().unwrap(),
                                n["reason"].as_str().unwrap_or("")
                            )
                        };
                        nodes.iter().map(line).collect::<Vec<_>>().join("\n")
                    }
                }
            };
            (!out.is_empty()).then_some(out)
        });
        let states: BTreeMap<String, String> = states
            .lines()
            .map(|l| {
                let (name, rest) = l.split_once(' ').unwrap();
                (name.to_owned(), rest.trim().to_owned())
            })
            .collect();
        assert_eq!(states.len(), nodes, "{graph}: {states:?}");
        for (name, state) in &states {
            let want = match name.as_str() {
                "bad" => "dead",
                "needs" => "skipped parent bad dead",
                "below" => "skipped parent needs skipped",
                _ => "succeeded",
            };
            assert_eq!(state, want, "graph {graph}, node {name}");
        }
    }
    assert_eq!(stat(&mut c, "flow", "graphs_completed"), 3, "each graph done exactly once");

    // One success per node in the events of work's three shards, each started after its parents finished.
    let mut runs: BTreeMap<String, (i64, i64)> = BTreeMap::new();
    let streams: Vec<String> = c.keys("hourglass:{work*}:events").unwrap();
    assert_eq!(streams.len(), 3, "{streams:?}");
    for stream in &streams {
        let events: redis::streams::StreamRangeReply = c.xrange_all(stream).unwrap();
        for e in &events.ids {
            let field = |f: &str| e.get::<String>(f).unwrap_or_default();
            if field("outcome") != "succeeded" {
                continue;
            }
            let id = field("id");
            assert_eq!(Some(field("graph").as_str()), id.split('/').next(), "{id}'s event names its graph");
            let times = (field("started_ms").parse().unwrap(), field("finished_ms").parse().unwrap());
            assert!(runs.insert(id.clone(), times).is_none(), "{id} succeeded twice");
        }
    }
    assert_eq!(runs.len(), 3 * (nodes - 3), "every node but bad, needs and below succeeded once");
    let mut checked = BTreeSet::new();
    for graph in ["py", "js", "cli"] {
        for n in spec["nodes"].as_array().unwrap() {
            let id = format!("{graph}/{}", n["name"].as_str().unwrap());
            let Some(&(started, _)) = runs.get(&id) else { continue };
            for p in n["parents"].as_array().into_iter().flatten() {
                let parent = format!("{graph}/{}", p.as_str().unwrap());
                // bad dead-lettered: its end is in the dead set, not a success event.
                if let Some(&(_, finished)) = runs.get(&parent) {
                    assert!(
                        finished <= started,
                        "{id} started at {started}, before its parent {parent} finished at {finished}"
                    );
                }
            }
            checked.insert(id);
        }
    }
    assert_eq!(checked.len(), runs.len());
    let log: String = hosts.iter().map(|h| h.log()).collect();
    for skipped in ["needs", "below"] {
        for graph in ["py", "js", "cli"] {
            assert!(!log.contains(&format!("task_id={graph}/{skipped} ")), "{graph}/{skipped} was skipped, yet ran");
        }
    }
    drop(hosts);
}
