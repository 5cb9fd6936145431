//! Sharded types: a 3-shard type on a 3-master cluster, a shard left by a lowered
//! `shards` drained, and tasks in the old shard tags run once after an upgrade.

use std::collections::HashSet;

use super::cluster::{Cluster, cstat};
use super::{LONG, hourglass, runs};
use crate::support::{Host, RedisServer, now_ms, plugin, stat, wait_for};
use redis::Commands;

/// The hash tags of the `n` shards of `task_type`, shard 0 first.
fn tags(task_type: &str, n: u16) -> Vec<String> {
    hourglass::task_type::shard_tags(&task_type.parse().unwrap(), n).iter().map(ToString::to_string).collect()
}

/// `shards = 3` spreads one type over three hash tags, on three masters even
/// for a name whose `{hot}`, `{hot#1}`, `{hot#2}` share one: clients pick the
/// shard with `CLUSTER KEYSLOT <id>` mod 3 (the server's own hash, as
/// docs/scaling.md tells them), two hosts claim every shard, and the CLI
/// finds each task in its shard: schedule, show, cancel; pause and resume
/// hold for every shard; a recurring schedule of the type fires (in shard 0)
/// and its runs count.
#[test]
fn cluster_sharded_type_runs_every_shard_and_the_cli_finds_each_task() {
    let cluster = Cluster::start();
    let tags = tags("hot", 3);
    let due = |shard: u16| format!("hourglass:{{{}}}:due", tags[usize::from(shard)]);
    // Where the server puts them: three masters, shard 0 keeps `{hot}`.
    assert_eq!(tags[0], "hot");
    let masters: HashSet<u16> = (0..3).map(|i| cluster.master_of(&due(i))).collect();
    assert_eq!(masters.len(), 3, "the shards {tags:?} share a master");
    let plugins = [("hot", plugin("noop"))];
    let config = "[types.hot]\nshards = 3\nmax_running = 6\n";
    let hosts: Vec<Host> = (1..=2)
        .map(|i| Host::start_at(&cluster.url(), &plugins, &format!("[runner]\nhost_id = \"s{i}\"\n{config}")))
        .collect();
    for host in &hosts {
        host.wait_log("keyspace notifications on every cluster master", LONG);
    }
    let mut conn = cluster.client();
    let shard_of = |conn: &mut redis::cluster::ClusterConnection, id: &str| -> u16 {
        let slot: u16 = redis::cmd("CLUSTER").arg("KEYSLOT").arg(id).query(conn).unwrap();
        slot % 3
    };
    let now = now_ms();
    let mut per_shard = [0usize; 3];
    for i in 0..300 {
        let id = format!("o-{i}");
        let shard = shard_of(&mut conn, &id);
        per_shard[usize::from(shard)] += 1;
        let _: () = conn.zadd(due(shard), &id, now + i64::from(i)).unwrap();
    }
    assert!(per_shard.iter().all(|&n| n > 50), "ids spread over the shards: {per_shard:?}");
    let succeeded =
        |conn: &mut redis::cluster::ClusterConnection| -> Vec<i64> { tags.iter().map(|t| cstat(conn, t)).collect() };
    wait_for("every task", LONG, || (succeeded(&mut conn).iter().sum::<i64>() == 300).then_some(()));
    let by_shard = succeeded(&mut conn);
    assert_eq!(by_shard, per_shard.map(|n| n as i64).to_vec(), "each shard ran its own tasks");
    let refs: Vec<&Host> = hosts.iter().collect();
    let ran = runs(&refs, "hot");
    assert_eq!(ran.len(), 300);
    assert!(ran.values().all(|&n| n == 1), "a task ran twice");

    let toml = hosts[0].dir.path().join("runner.toml");
    let cli = |args: &[&str]| {
        let (ok, out, err) = hourglass(&toml, args, &[]);
        assert!(ok, "{args:?}: {err}");
        out
    };
    // The CLI writes into the id's shard, and show and cancel find it there.
    let later: Vec<String> = (0..6).map(|i| format!("later-{i}")).collect();
    for id in &later {
        cli(&["schedule", "hot", id, "--in", "1h", "--payload", "p"]);
        let shard = shard_of(&mut conn, id);
        let score: Option<f64> = conn.zscore(due(shard), id).unwrap();
        assert!(score.is_some(), "{id} is not in shard {shard}");
        let shown: serde_json::Value = serde_json::from_str(&cli(&["show", "hot", id, "--json"])).unwrap();
        assert_eq!((&shown["state"], &shown["shard"]), (&"scheduled".into(), &shard.into()), "{shown}");
        let text = cli(&["show", "hot", id]);
        let tag = &tags[usize::from(shard)];
        assert!(text.contains(&format!("shard: {shard} (keys {{{tag}}})")), "{text}");
    }
    let stats: serde_json::Value = serde_json::from_str(&cli(&["stats", "--json"])).unwrap();
    let hot = &stats["hot"];
    assert_eq!((hot["scheduled_later"].as_u64(), hot["succeeded"].as_u64()), (Some(6), Some(300)), "{stats}");
    for id in &later {
        assert!(cli(&["cancel", "hot", id]).contains("cancelled"), "{id}");
        let shard = shard_of(&mut conn, id);
        let score: Option<f64> = conn.zscore(due(shard), id).unwrap();
        assert!(score.is_none(), "{id} still scheduled");
    }

    // A pause holds on every shard; tasks written meanwhile wait, then run on resume.
    cli(&["pause", "hot"]);
    for shard in 0..3u16 {
        let key = due(shard).replace(":due", ":paused");
        let paused: bool = conn.exists(&key).unwrap();
        assert!(paused, "{key} not set");
    }
    for i in 0..30 {
        let id = format!("p-{i}");
        let shard = shard_of(&mut conn, &id);
        let _: () = conn.zadd(due(shard), &id, now_ms()).unwrap();
    }
    for host in &hosts {
        host.wait_log("type paused", LONG);
    }
    assert_eq!(succeeded(&mut conn).iter().sum::<i64>(), 300, "a paused shard ran a task");
    cli(&["resume", "hot"]);
    wait_for("the tasks held by the pause", LONG, || (succeeded(&mut conn).iter().sum::<i64>() == 330).then_some(()));

    // A recurring schedule of a sharded type fires into shard 0, where hosts claim it.
    let before = cstat(&mut conn, "hot");
    cli(&["every", "tick", "hot", "1s"]);
    wait_for("two occurrences", LONG, || {
        let ticks: Vec<usize> =
            runs(&refs, "hot").into_iter().filter(|(id, _)| id.starts_with("tick@")).map(|(_, n)| n).collect();
        (ticks.len() >= 2).then_some(ticks)
    })
    .iter()
    .for_each(|&n| assert_eq!(n, 1, "an occurrence ran twice"));
    // The run is logged before its settle counts it: wait for the count.
    wait_for("the occurrences counted in shard 0", LONG, || (cstat(&mut conn, "hot") >= before + 2).then_some(()));
}

/// Lowering `shards` (3 to 2) strands nothing: a host finds the shards that
/// are not among the 2 current ones and still hold tasks, and drains them
/// beside the others.
#[test]
fn a_shard_left_by_a_lowered_shards_is_drained() {
    let redis = RedisServer::start();
    let mut conn = redis.client();
    let (three, two) = (tags("hot", 3), tags("hot", 2));
    let left: Vec<&String> = three.iter().filter(|t| !two.contains(t)).collect();
    assert!(!left.is_empty(), "{three:?} {two:?}");
    let now = now_ms();
    for i in 0..40 {
        let _: () = conn.zadd(format!("hourglass:{{{}}}:due", three[i % 3]), format!("r-{i}"), now).unwrap();
    }
    let host = Host::start(&redis, &[("hot", plugin("noop"))], "[types.hot]\nshards = 2\n");
    host.wait_log("draining them", LONG);
    let done = |conn: &mut redis::Connection| -> i64 { three.iter().map(|t| stat(conn, t, "succeeded")).sum() };
    wait_for("every task, the drained shard's too", LONG, || (done(&mut conn) == 40).then_some(()));
    for t in left {
        assert!(host.log().contains(t.as_str()), "the log names the drained shard {t}:\n{}", host.log());
    }
    let ran = runs(&[&host], "hot");
    assert_eq!(ran.len(), 40);
    assert!(ran.values().all(|&n| n == 1), "a task ran twice");
}

/// Tasks that an earlier version (or a client not yet updated) put in the old
/// tags of `shards = 3` (`{hot#1}`, `{hot#2}`: shard i in `T#i`) still run,
/// once each, on a host with the current tags (`{hot#3}`, `{hot#4}`): it
/// drains the old tags beside its shards; `show` and `cancel` find a task
/// there.
#[test]
fn tasks_in_the_old_shard_tags_run_once_after_an_upgrade() {
    let redis = RedisServer::start();
    let mut conn = redis.client();
    let current = tags("hot", 3);
    assert!(!current.contains(&"hot#1".into()) && !current.contains(&"hot#2".into()), "{current:?}");
    let old = |id: &str| match hourglass::task_type::shard_of(id.as_bytes(), 3) {
        0 => "hot".to_owned(),
        i => format!("hot#{i}"),
    };
    let now = now_ms();
    for i in 0..60 {
        let id = format!("m-{i}");
        let _: () = conn.zadd(format!("hourglass:{{{}}}:due", old(&id)), &id, now).unwrap();
    }
    let later = ["later-0", "later-1", "later-2", "later-3"].into_iter().find(|id| old(id) != "hot").unwrap();
    let _: () = conn.zadd(format!("hourglass:{{{}}}:due", old(later)), later, now + 3_600_000).unwrap();
    let host = Host::start(&redis, &[("hot", plugin("noop"))], "[types.hot]\nshards = 3\n");
    host.wait_log("draining them", LONG);
    let all: Vec<String> = current.iter().cloned().chain(["hot#1".into(), "hot#2".into()]).collect();
    let done = |conn: &mut redis::Connection| -> i64 { all.iter().map(|t| stat(conn, t, "succeeded")).sum() };
    wait_for("every task of the old tags", LONG, || (done(&mut conn) == 60).then_some(()));
    assert!(stat(&mut conn, "hot#1", "succeeded") + stat(&mut conn, "hot#2", "succeeded") > 0, "nothing was drained");
    let ran = runs(&[&host], "hot");
    assert_eq!(ran.len(), 60);
    assert!(ran.values().all(|&n| n == 1), "a task ran twice");
    // The CLI finds the task still waiting in an old tag, and cancels it there.
    let toml = host.dir.path().join("runner.toml");
    let (ok, out, err) = hourglass(&toml, &["show", "hot", later], &[]);
    assert!(ok && out.contains("scheduled") && out.contains(&format!("keys {{{}}}", old(later))), "{out}{err}");
    let (ok, out, err) = hourglass(&toml, &["cancel", "hot", later], &[]);
    assert!(ok && out.contains("cancelled"), "{out}{err}");
    let left: Option<f64> = conn.zscore(format!("hourglass:{{{}}}:due", old(later)), later).unwrap();
    assert_eq!(left, None);
}
