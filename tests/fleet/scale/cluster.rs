//! Redis Cluster: the test harness, every master's tasks run once, a workflow group and a graph
//! across masters, a manual failover and a master killed by SIGKILL.

use std::collections::HashMap;
use std::process::Command;
use std::time::{Duration, Instant};

mod killed_mid_load;

use super::tls::Certs;
use super::{LONG, hourglass, left, runs};
use crate::support::{Host, now_ms, plugin, stat, test_plugin, wait_for};
use redis::Commands;

/// Redis Cluster nodes on loopback (plain TCP or TLS only), each also on a
/// unix socket the test itself uses; killed on drop.
pub(super) struct Cluster {
    nodes: Vec<(u16, hourglass::redis_server::RedisServer)>,
    masters: usize,
    /// The nodes speak TLS only (`rediss+cluster://`).
    tls: bool,
    dir: tempfile::TempDir,
}

pub(super) fn free_port_pair() -> u16 {
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        // The cluster bus listens on port + 10000.
        if port < 55_000 && std::net::TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

impl Cluster {
    /// Six nodes: 3 masters with a replica each, plain TCP.
    pub(super) fn start() -> Cluster {
        Cluster::start_with(3, 1, None)
    }

    /// `masters` masters with `replicas` replicas each; with `certs`, TLS only (clients, bus and replication).
    pub(super) fn start_with(masters: usize, replicas: usize, certs: Option<&Certs>) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let mut nodes = Vec::new();
        let mut ports = Vec::new();
        while ports.len() < masters * (1 + replicas) {
            let p = free_port_pair();
            if !ports.contains(&p) {
                ports.push(p);
            }
        }
        for &port in &ports {
            let mut args: Vec<String> = Vec::new();
            let tcp_port = match certs {
                Some(certs) => {
                    let tls = [
                        "--tls-port",
                        &port.to_string(),
                        "--tls-cluster",
                        "yes",
                        "--tls-replication",
                        "yes",
                        "--bind",
                        "127.0.0.1",
                    ];
                    args.extend(tls.map(String::from));
                    args.extend(certs.server_args());
                    None
                }
                None => Some(port),
            };
            let cluster = [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                &format!("nodes-{port}.conf"),
                // Long enough that a node stalled by a loaded machine (fsync on every
                // write) is not failed over by itself in the middle of a test.
                "--cluster-node-timeout",
                "5000",
            ];
            args.extend(cluster.map(String::from));
            args.extend(
                ["--appendfilename", &format!("aof-{port}"), "--appenddirname", &format!("aof-{port}")]
                    .map(String::from),
            );
            let spec = hourglass::redis_server::ServerSpec {
                dir: dir.path().to_owned(),
                port: tcp_port,
                socket: Some(format!("{port}.sock")),
                appendfsync: Some("always"),
                args,
                ..Default::default()
            };
            let node = hourglass::redis_server::RedisServer::spawn(spec, "the cluster tests")
                .unwrap_or_else(|e| panic!("{e:#}"));
            nodes.push((port, node));
        }
        let cluster = Cluster { nodes, masters, tls: certs.is_some(), dir };
        for &port in &ports {
            wait_for("cluster node", LONG, || (cluster.cli(port, &["PING"]).trim() == "PONG").then_some(()));
        }
        let mut create = Command::new("redis-cli");
        if let Some(certs) = certs {
            create.args(["--tls", "--cacert", &certs.ca()]);
        }
        create.args(["--cluster", "create"]).args(ports.iter().map(|p| format!("127.0.0.1:{p}")));
        create.args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"]);
        let out = create.output().unwrap();
        assert!(out.status.success(), "cluster create: {}", String::from_utf8_lossy(&out.stdout));
        cluster.wait_ok();
        cluster
    }

    fn wait_ok(&self) {
        wait_for("cluster_state:ok on every live node, with every master", LONG, || {
            self.nodes
                .iter()
                .filter(|(p, _)| self.cli(*p, &["PING"]).trim() == "PONG")
                .all(|(p, _)| self.cli(*p, &["CLUSTER", "INFO"]).contains("cluster_state:ok"))
                .then_some(())
                .filter(|()| self.masters().len() == self.masters)
        });
    }

    /// Seeds of the masters at the start, as one `redis+cluster://` (or `rediss+cluster://`) URL.
    pub(super) fn url(&self) -> String {
        let seeds: Vec<String> = self.nodes.iter().take(self.masters).map(|(p, _)| format!("127.0.0.1:{p}")).collect();
        format!("{}+cluster://{}", if self.tls { "rediss" } else { "redis" }, seeds.join(","))
    }

    /// A cluster connection over TCP (plain clusters only).
    pub(super) fn client(&self) -> redis::cluster::ClusterConnection {
        assert!(!self.tls, "use node_conn on a TLS cluster");
        let seeds: Vec<String> = self.nodes.iter().map(|(p, _)| format!("redis://127.0.0.1:{p}")).collect();
        redis::cluster::ClusterClient::new(seeds).unwrap().get_connection().unwrap()
    }

    /// A connection to the node at `port` over its unix socket (no TLS, no redirections).
    pub(super) fn node_conn(&self, port: u16) -> redis::Connection {
        let url = format!("redis+unix://{}", self.socket(port).display());
        redis::Client::open(url).unwrap().get_connection().unwrap()
    }

    /// `redis-cli` against the node at `port`, over its unix socket; its stdout.
    fn cli(&self, port: u16, args: &[&str]) -> String {
        let out = Command::new("redis-cli").arg("-s").arg(self.socket(port)).args(args).output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn socket(&self, port: u16) -> std::path::PathBuf {
        self.dir.path().join(format!("{port}.sock"))
    }

    /// Kills the node at `port` with SIGKILL: no goodbye, no last write to disk or replica.
    fn kill(&mut self, port: u16) {
        let (_, node) = self.nodes.iter_mut().find(|(p, _)| *p == port).expect("a node of this cluster");
        node.kill();
    }

    /// Masters (port, slot ranges), from `CLUSTER NODES` of a live node.
    fn masters(&self) -> Vec<(u16, Vec<(u16, u16)>)> {
        let live = self.nodes.iter().map(|(p, _)| *p).find(|p| self.cli(*p, &["PING"]).trim() == "PONG").unwrap();
        let text = self.cli(live, &["CLUSTER", "NODES"]);
        hourglass::store::parse_cluster_nodes(&text)
            .into_iter()
            .filter(|n| n.master && !n.slots.is_empty())
            .map(|n| (n.port, n.slots.iter().map(|r| (*r.start(), *r.end())).collect()))
            .collect()
    }

    pub(super) fn master_of(&self, key: &str) -> u16 {
        self.serving(key).unwrap_or_else(|| panic!("no live master serves {key}"))
    }

    /// The live master serving `key`'s slot, if any (none between a master's death and its replica's promotion).
    fn serving(&self, key: &str) -> Option<u16> {
        let live = self.nodes.iter().map(|(p, _)| *p).find(|p| self.cli(*p, &["PING"]).trim() == "PONG").unwrap();
        let slot: u16 = self.cli(live, &["CLUSTER", "KEYSLOT", key]).trim().parse().unwrap();
        self.masters().into_iter().find(|(_, r)| r.iter().any(|(a, b)| (*a..=*b).contains(&slot))).map(|m| m.0)
    }

    /// Promotes `replica` with `CLUSTER FAILOVER` and waits until it serves `key`.
    ///
    /// A manual failover only completes once the replica has every write of its
    /// master, so no acked work can be lost; but Redis gives it 5 s and then
    /// quietly aborts, which a loaded machine (fsync on every write) can exceed.
    /// So the failover is asked for again after each attempt has surely ended.
    fn manual_failover(&self, replica: u16, key: &str) {
        let deadline = Instant::now() + LONG;
        loop {
            let reply = self.cli(replica, &["CLUSTER", "FAILOVER"]);
            // Not OK only if the previous attempt completed just now.
            assert!(reply.trim() == "OK" || self.serving(key) == Some(replica), "CLUSTER FAILOVER: {reply}");
            let attempt_over = Instant::now() + Duration::from_secs(15);
            while Instant::now() < attempt_over {
                if self.serving(key) == Some(replica) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            assert!(Instant::now() < deadline, "timed out waiting for {replica} to take over {key}");
        }
    }

    /// The replica of `master`, once the master's view of the cluster (gossip) lists it.
    fn replica_of(&self, master: u16) -> u16 {
        wait_for("the master to know its replica", LONG, || {
            let text = self.cli(master, &["CLUSTER", "NODES"]);
            let id = text.lines().find(|l| l.contains("myself"))?.split(' ').next()?.to_owned();
            let line = text.lines().find(|l| l.split_whitespace().nth(3) == Some(id.as_str()))?;
            line.split_whitespace().nth(1)?.split(['@', ':']).nth(1)?.parse().ok()
        })
    }
}

pub(super) fn cstat(conn: &mut redis::cluster::ClusterConnection, task_type: &str) -> i64 {
    conn.hget::<_, _, Option<i64>>(format!("hourglass:{{{task_type}}}:stats"), "succeeded").unwrap().unwrap_or(0)
}

/// Types whose keys land on every master of the cluster.
pub(super) fn spread_types(cluster: &Cluster) -> Vec<String> {
    let mut by_master: HashMap<u16, String> = HashMap::new();
    for i in 0.. {
        let t = format!("c{i}");
        by_master.entry(cluster.master_of(&format!("hourglass:{{{t}}}:due"))).or_insert(t);
        if by_master.len() == 3 {
            break;
        }
    }
    let mut types: Vec<String> = by_master.into_values().collect();
    types.sort();
    types
}

#[test]
fn cluster_runs_every_task_on_every_master_with_follow_ups_across_slots() {
    let cluster = Cluster::start();
    let types = spread_types(&cluster);
    let mut plugins: Vec<(&str, std::path::PathBuf)> = types.iter().map(|t| (t.as_str(), plugin("noop"))).collect();
    plugins.push(("device.offline", plugin("device.offline")));
    plugins.push(("device.alert", plugin("device.alert")));
    let url = cluster.url();
    let hosts: Vec<Host> = (1..=2)
        .map(|i| {
            Host::start_at(&url, &plugins, &format!("[runner]\nhost_id = \"c{i}\"\n{}", crate::support::DEVICE_GRANTS))
        })
        .collect();
    for host in &hosts {
        host.wait_log("keyspace notifications on every cluster master", LONG);
    }
    let mut conn = cluster.client();
    let now = now_ms();
    for t in &types {
        for i in 0..300 {
            let _: () = conn.zadd(format!("hourglass:{{{t}}}:due"), format!("{t}-{i}"), now + i64::from(i)).unwrap();
        }
    }
    let _: () = conn.zadd("hourglass:{device.offline}:due", "sensor-9", now).unwrap();
    for t in &types {
        wait_for("every task of the type", LONG, || (cstat(&mut conn, t) == 300).then_some(()));
    }
    wait_for("the follow-up in another slot", LONG, || (cstat(&mut conn, "device.alert") == 1).then_some(()));
    let refs: Vec<&Host> = hosts.iter().collect();
    for t in &types {
        let runs = runs(&refs, t);
        assert_eq!(runs.len(), 300);
        assert!(runs.values().all(|&n| n == 1), "a {t} task ran twice");
    }
    // The CLI scans every master for types and sees both hosts.
    let (ok, out, err) = hourglass(&hosts[0].dir.path().join("runner.toml"), &["stats"], &[]);
    assert!(ok, "{err}");
    for t in types.iter().map(String::as_str).chain(["device.offline", "device.alert"]) {
        assert!(out.contains(t), "{t} missing from stats:\n{out}");
    }
}

/// A workflow group whose callback type and children's types live on three
/// different masters, driven by the CLI: each child's end crosses to the
/// group's slot through the outbox, and the callback fires once.
#[test]
fn cluster_group_with_children_on_other_masters_fires_its_callback_once() {
    let cluster = Cluster::start();
    let types = spread_types(&cluster);
    let (callback_type, kids) = (types[0].as_str(), &types[1..]);
    let plugins: Vec<(&str, std::path::PathBuf)> = kids.iter().map(|t| (t.as_str(), plugin("noop"))).collect();
    let host = Host::start_at(&cluster.url(), &plugins, "[runner]\nhost_id = \"w1\"\n");
    host.wait_log("keyspace notifications on every cluster master", LONG);
    let config = host.dir.path().join("runner.toml");
    let cli = |args: &[&str]| {
        let (ok, out, err) = hourglass(&config, args, &[]);
        assert!(ok, "{args:?}: {err}");
        out
    };
    cli(&["group", "open", callback_type, "g-1", "--payload", "spread"]);
    for t in kids {
        let ids: Vec<String> = (0..200).map(|i| format!("{t}-{i}")).collect();
        let mut args = vec!["group", "add", callback_type, "g-1", t.as_str()];
        args.extend(ids.iter().map(String::as_str));
        cli(&args);
    }
    cli(&["group", "seal", callback_type, "g-1"]);
    let mut conn = cluster.client();
    let summary: String = wait_for("the callback", LONG, || {
        let due: Option<f64> = conn.zscore(format!("hourglass:{{{callback_type}}}:due"), "g-1").unwrap();
        due.and_then(|_| conn.hget(format!("hourglass:{{{callback_type}}}:payload"), "g-1").unwrap())
    });
    let summary: serde_json::Value = serde_json::from_str(&summary).unwrap();
    assert_eq!((summary["added"].as_u64(), summary["succeeded"].as_u64()), (Some(400), Some(400)), "{summary}");
    assert_eq!(summary["payload"], "spread");
    let completed: Option<i64> = conn.hget(format!("hourglass:{{{callback_type}}}:stats"), "groups_completed").unwrap();
    assert_eq!(completed, Some(1));
    for t in kids {
        let runs = runs(&[&host], t);
        assert_eq!(runs.len(), 200);
        assert!(runs.values().all(|&n| n == 1), "a {t} child ran twice");
    }
    let shown = cli(&["group", "show", callback_type, "g-1"]);
    assert!(shown.contains(&format!("group {callback_type}/g-1: done")), "{shown}");
}

/// A workflow graph whose home type and nodes' types live on three
/// different masters, declared and shown by the CLI: every script touches
/// one slot (a node's schedule and its end cross through the outboxes), each
/// node runs once, and the graph is done once.
#[test]
fn cluster_graph_with_nodes_on_other_masters_runs_each_node_once() {
    const LAYERS: usize = 3;
    const WIDTH: usize = 10;
    let cluster = Cluster::start();
    let types = spread_types(&cluster);
    let plugins: Vec<(&str, std::path::PathBuf)> = types.iter().map(|t| (t.as_str(), plugin("noop"))).collect();
    let host = Host::start_at(&cluster.url(), &plugins, "[runner]\nhost_id = \"w1\"\n");
    host.wait_log("keyspace notifications on every cluster master", LONG);
    let (home, kinds) = (types[0].as_str(), &types[1..]);
    let nodes: Vec<serde_json::Value> = (0..LAYERS * WIDTH)
        .map(|i| {
            let (layer, at) = (i / WIDTH, i % WIDTH);
            let parents: Vec<String> = if layer == 0 {
                vec![]
            } else {
                vec![format!("n{}", i - WIDTH), format!("n{}", (layer - 1) * WIDTH + (at + 3) % WIDTH)]
            };
            serde_json::json!({"name": format!("n{i}"), "type": kinds[i % 2], "parents": parents, "when": "success"})
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("graph.json");
    std::fs::write(&file, serde_json::json!({ "nodes": nodes }).to_string()).unwrap();
    let config = host.dir.path().join("runner.toml");
    let cli = |args: &[&str]| {
        let (ok, out, err) = hourglass(&config, args, &[]);
        assert!(ok, "{args:?}: {err}");
        out
    };
    cli(&["graph", "submit", home, "g-1", file.to_str().unwrap()]);
    let shown = wait_for("the graph to be done", LONG, || {
        let v: serde_json::Value = serde_json::from_str(&cli(&["graph", "show", home, "g-1", "--json"])).unwrap();
        (v["state"] == "done").then_some(v)
    });
    assert_eq!(shown["counts"]["succeeded"], (LAYERS * WIDTH) as u64, "{shown}");
    let mut conn = cluster.client();
    let completed: Option<i64> = conn.hget(format!("hourglass:{{{home}}}:stats"), "graphs_completed").unwrap();
    assert_eq!(completed, Some(1));
    for t in kinds {
        let runs = runs(&[&host], t);
        assert_eq!(runs.len(), LAYERS * WIDTH / 2, "{t}");
        assert!(runs.values().all(|&n| n == 1), "a {t} node ran twice");
    }
}

#[test]
fn cluster_failover_loses_no_acked_work_and_the_runner_carries_on() {
    let cluster = Cluster::start();
    let types = spread_types(&cluster);
    let t = types[0].clone();
    // Tasks that take a moment (chaos sleep:20), so that some are leased when the master changes.
    let plugins: Vec<(&str, std::path::PathBuf)> = vec![(t.as_str(), test_plugin("chaos"))];
    let host = Host::start_at(
        &cluster.url(),
        &plugins,
        &format!("[runner]\nhost_id = \"f1\"\nlease = \"5s\"\n[types.{t}]\nconcurrency = 16\n"),
    );
    host.wait_log("keyspace notifications on every cluster master", LONG);
    let mut conn = cluster.client();
    let now = now_ms();
    let due = format!("hourglass:{{{t}}}:due");
    let payload = format!("hourglass:{{{t}}}:payload");
    for i in 0..2000 {
        let _: () = conn.hset(&payload, format!("a{i}"), "sleep:20").unwrap();
        let _: () = conn.zadd(&due, format!("a{i}"), now + i64::from(i) * 2).unwrap();
    }
    wait_for("some done", LONG, || (cstat(&mut conn, &t) > 200).then_some(()));
    let acked_before: i64 = cstat(&mut conn, &t);
    // Fail the type's master over to its replica, mid-stream, with tasks leased.
    let held = crate::support::leases(&mut conn, &t);
    let cut = Instant::now();
    let master = cluster.master_of(&due);
    let replica = cluster.replica_of(master);
    cluster.manual_failover(replica, &due);
    cluster.wait_ok();
    let promoted = cstat(&mut cluster.client(), &t);
    let mut recovered = None;
    // Work scheduled after the failover runs too, without any help.
    let mut conn = cluster.client();
    for i in 0..200 {
        let _: () = conn.zadd(&due, format!("b{i}"), now_ms()).unwrap();
    }
    let deadline = Instant::now() + LONG;
    loop {
        let (done, remaining) = (cstat(&mut conn, &t), left(&mut conn, &t));
        if recovered.is_none() && done > promoted {
            // The first commit on the promoted master (to within this loop's 100 ms).
            recovered = Some(cut.elapsed().as_millis());
        }
        if remaining == 0 && done >= 2200 {
            break;
        }
        assert!(Instant::now() < deadline, "stuck after failover: {done} done, {remaining} left\n{}", host.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(cstat(&mut conn, &t) >= acked_before, "acked work was lost");
    let runs = runs(&[&host], &t);
    let ids: Vec<String> = (0..2000).map(|i| format!("a{i}")).chain((0..200).map(|i| format!("b{i}"))).collect();
    let lost = ids.iter().filter(|id| !runs.contains_key(*id)).count();
    let twice: Vec<&String> = runs.iter().filter(|(_, n)| **n > 1).map(|(id, _)| id).collect();
    // The line docs/correctness.md quotes, as tests/fleet/faults.rs prints for its faults.
    eprintln!(
        "FAULT cluster failover mid-stream: scheduled {}, completed {}, lost {lost}, run twice {} (held by faulted host {}), recovery {} ms",
        ids.len(),
        ids.len() - lost,
        twice.len(),
        held.len(),
        recovered.map_or(-1, |ms| ms as i64)
    );
    assert_eq!(lost, 0, "tasks never ran: {:?}", ids.iter().filter(|id| !runs.contains_key(*id)).collect::<Vec<_>>());
    assert!(twice.iter().all(|id| held.contains_key(*id)), "tasks not leased at the failover ran twice: {twice:?}");
    // Its wake-up listener followed the new master: by its topology check, or
    // by a reconnect when the old master closed the subscription first.
    wait_for("a keyspace subscription on the promoted master", LONG, || {
        cluster.cli(replica, &["CLIENT", "LIST"]).contains("psub=1").then_some(())
    });
    let log = host.log();
    assert!(
        log.contains("cluster masters changed") || log.contains("re-subscribed after a reconnect"),
        "the listener never said it followed the failover:\n{log}"
    );
}

#[test]
fn cluster_master_killed_its_replica_takes_over_with_the_acked_work_and_the_runner_carries_on() {
    let mut cluster = Cluster::start();
    let types = spread_types(&cluster);
    let t = types[0].clone();
    let plugins: Vec<(&str, std::path::PathBuf)> = vec![(t.as_str(), plugin("noop"))];
    let host = Host::start_at(&cluster.url(), &plugins, "[runner]\nhost_id = \"k1\"\nlease = \"5s\"\n");
    host.wait_log("keyspace notifications on every cluster master", LONG);
    let due = format!("hourglass:{{{t}}}:due");
    let master = cluster.master_of(&due);
    let replica = cluster.replica_of(master);
    let mut conn = cluster.client();
    let now = now_ms();
    for i in 0..500 {
        let _: () = conn.zadd(&due, format!("a{i}"), now + i64::from(i)).unwrap();
    }
    wait_for("the first wave done", LONG, || (cstat(&mut conn, &t) == 500 && left(&mut conn, &t) == 0).then_some(()));
    // Replication is asynchronous: an ack the master took in its last moments may
    // die with it. Only what reached the replica is acked work; wait until it all has.
    let mut on_replica = cluster.node_conn(replica);
    redis::cmd("READONLY").query::<()>(&mut on_replica).unwrap();
    let deadline = Instant::now() + LONG;
    while !(stat(&mut on_replica, &t, "succeeded") == 500 && left(&mut on_replica, &t) == 0) {
        assert!(
            Instant::now() < deadline,
            "the first wave never reached the replica: {} succeeded, {} left on it\nmaster {master}:\n{}\nreplica {replica}:\n{}\nnodes:\n{}",
            stat(&mut on_replica, &t, "succeeded"),
            left(&mut on_replica, &t),
            cluster.cli(master, &["INFO", "replication"]),
            cluster.cli(replica, &["INFO", "replication"]),
            cluster.cli(replica, &["CLUSTER", "NODES"]),
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    cluster.kill(master);
    wait_for("the replica promoted by the cluster", LONG, || (cluster.serving(&due) == Some(replica)).then_some(()));
    cluster.wait_ok();
    let mut conn = cluster.client();
    assert_eq!(cstat(&mut conn, &t), 500, "the new master lost acked work");
    assert_eq!(left(&mut conn, &t), 0, "acked tasks are due again on the new master");
    // The same host process runs new work on the promoted master by itself.
    for i in 0..200 {
        let _: () = conn.zadd(&due, format!("b{i}"), now_ms()).unwrap();
    }
    let deadline = Instant::now() + LONG;
    loop {
        let (done, remaining) = (cstat(&mut conn, &t), left(&mut conn, &t));
        if remaining == 0 && done >= 700 {
            break;
        }
        assert!(Instant::now() < deadline, "stuck after the kill: {done} done, {remaining} left\n{}", host.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    host.signal("0"); // still the first process: it was never restarted
    // Its wake-up listener followed too: it subscribes on the promoted replica.
    wait_for("a keyspace subscription on the promoted master", LONG, || {
        cluster.cli(replica, &["CLIENT", "LIST"]).contains("psub=1").then_some(())
    });
    let runs = runs(&[&host], &t);
    for id in (0..500).map(|i| format!("a{i}")) {
        assert_eq!(runs.get(&id).copied(), Some(1), "{id}, acked and replicated before the kill, ran again");
    }
    for id in (0..200).map(|i| format!("b{i}")) {
        assert!(runs.get(&id).copied().unwrap_or(0) >= 1, "{id}, scheduled after the promotion, never ran");
    }
}
