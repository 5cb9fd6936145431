//! Scale out: many hosts on one Redis and a restricted ACL user; a Redis Cluster
//! with failover (`cluster`), sharded types (`shards`) and TLS (`tls`) in the child
//! modules. Real `hourglass run` processes, real redis-servers.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::support::{Host, RedisServer, now_ms, plugin, stat, test_plugin, wait_for};
use redis::Commands;

mod cluster;
mod shards;
mod tls;

const LONG: Duration = Duration::from_secs(90);

/// Succeeded runs per task id of `task_type`, summed over the hosts' logs.
fn runs(hosts: &[&Host], task_type: &str) -> HashMap<String, usize> {
    let mut runs: HashMap<String, usize> = HashMap::new();
    // A shard's runs are logged under its name (`hot#2`): they are the type's.
    let (needle, shard) = (format!("task_type={task_type} "), format!("task_type={task_type}#"));
    for host in hosts {
        for line in
            host.log().lines().filter(|l| l.contains("succeeded") && (l.contains(&needle) || l.contains(&shard)))
        {
            if let Some(id) = line.split("task_id=").nth(1).and_then(|r| r.split(' ').next()) {
                *runs.entry(id.to_owned()).or_default() += 1;
            }
        }
    }
    runs
}

/// `hourglass <args>` with the host's config; returns (success, stdout, stderr).
fn hourglass(config: &Path, args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hourglass"));
    cmd.arg("--config").arg(config).args(args).env_remove("HOURGLASS_REDIS_URL").env("NO_COLOR", "1");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `hourglass stats --hosts --json` as (id → state, id → {type → count}).
fn host_states(host: &Host) -> (HashMap<String, String>, HashMap<String, HashMap<String, u64>>) {
    let (ok, out, err) = hourglass(&host.dir.path().join("runner.toml"), &["stats", "--hosts", "--json"], &[]);
    assert!(ok, "stats --hosts failed: {err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let mut states = HashMap::new();
    let mut holds = HashMap::new();
    for h in v.as_array().unwrap() {
        let id = h["id"].as_str().unwrap().to_owned();
        states.insert(id.clone(), h["state"].as_str().unwrap().to_owned());
        let per_type = h["holds"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(t, held)| (t.clone(), held["count"].as_u64().unwrap()))
            .collect();
        holds.insert(id, per_type);
    }
    (states, holds)
}

/// Ids of `task_type` whose lease `host_id` holds now.
fn held_by(conn: &mut impl redis::ConnectionLike, task_type: &str, host_id: &str) -> HashSet<String> {
    crate::support::leases(conn, task_type)
        .into_iter()
        .filter(|(_, holder)| holder == host_id)
        .map(|(id, _)| id)
        .collect()
}

fn left(conn: &mut impl redis::ConnectionLike, task_type: &str) -> usize {
    let due: usize = redis::cmd("ZCARD").arg(format!("hourglass:{{{task_type}}}:due")).query(conn).unwrap();
    due + crate::support::leases(conn, task_type).len()
}

// ---------------------------------------------------------------- many hosts

#[test]
fn three_hosts_share_the_work_and_run_each_task_once() {
    let redis = RedisServer::start();
    let hosts: Vec<Host> = (1..=3)
        .map(|i| Host::start(&redis, &[("share", plugin("noop"))], &format!("[runner]\nhost_id = \"h{i}\"\n")))
        .collect();
    let mut conn = redis.client();
    let now = now_ms();
    let mut pipe = redis::pipe();
    for i in 0..3000 {
        // Spread over ~1.5s so every host wakes up for some of them.
        pipe.zadd("hourglass:{share}:due", format!("s{i}"), now + i64::from(i) / 2).ignore();
    }
    let _: () = pipe.query(&mut conn).unwrap();
    wait_for("all 3000 done", LONG, || (stat(&mut conn, "share", "succeeded") == 3000).then_some(()));
    let refs: Vec<&Host> = hosts.iter().collect();
    let runs = runs(&refs, "share");
    assert_eq!(runs.len(), 3000, "some tasks never ran");
    let twice: Vec<_> = runs.iter().filter(|(_, n)| **n != 1).collect();
    assert!(twice.is_empty(), "tasks ran more than once while their leases held: {twice:?}");
    for (i, host) in hosts.iter().enumerate() {
        let ran = host.log().lines().filter(|l| l.contains("succeeded") && l.contains("task_type=share ")).count();
        assert!(ran > 0, "host h{} ran nothing: the work was not shared", i + 1);
    }
    let (states, _) = host_states(&hosts[0]);
    for id in ["h1", "h2", "h3"] {
        assert_eq!(states.get(id).map(String::as_str), Some("alive"), "{states:?}");
    }
}

#[test]
fn kill_9_of_one_host_the_others_finish_its_tasks() {
    let redis = RedisServer::start();
    let config = |i: usize| format!("[runner]\nhost_id = \"h{i}\"\nlease = \"1s\"\n[types.work]\nconcurrency = 8\n");
    let mut hosts: Vec<Host> =
        (1..=3).map(|i| Host::start(&redis, &[("work", test_plugin("chaos"))], &config(i))).collect();
    let mut conn = redis.client();
    let now = now_ms();
    // 300 runs of 200 ms on 24 slots: about 2.5 s of work, so h1 holds
    // leases long enough to be seen doing so on a loaded machine.
    for i in 0..300 {
        let _: () = conn.hset("hourglass:{work}:payload", format!("w{i}"), "sleep:200").unwrap();
        let _: () = conn.zadd("hourglass:{work}:due", format!("w{i}"), now).unwrap();
    }
    // Kill h1 while it holds leases; `stats` shows them as its own.
    wait_for("h1 to hold leases", LONG, || {
        let held = host_states(&hosts[0]).1.get("h1").and_then(|t| t.get("work").copied()).unwrap_or(0);
        (held > 0 && stat(&mut conn, "work", "succeeded") >= 20).then_some(())
    });
    hosts[0].signal("KILL");
    hosts[0].wait_exit(LONG);
    let in_flight = held_by(&mut conn, "work", "h1");
    wait_for("all done by h2 and h3", LONG, || (left(&mut conn, "work") == 0).then_some(()));
    let refs: Vec<&Host> = hosts.iter().collect();
    let runs = runs(&refs, "work");
    for i in 0..300 {
        let id = format!("w{i}");
        let n = runs.get(&id).copied().unwrap_or(0);
        assert!(n >= 1, "{id} never ran");
        assert!(n == 1 || in_flight.contains(&id), "{id} ran {n} times but h1 did not hold it at the kill");
    }
    // The dead host is shown as gone once its heartbeats stop; the others stay alive.
    wait_for("h1 shown as gone", LONG, || {
        let (states, _) = host_states(&hosts[1]);
        (states.get("h1").map(String::as_str) == Some("gone")).then_some(())
    });
    let (states, holds) = host_states(&hosts[1]);
    assert_eq!(states["h2"], "alive");
    assert_eq!(states["h3"], "alive");
    assert!(holds["h1"].values().all(|&n| n == 0), "h1 still holds leases: {holds:?}");
    // A graceful exit is shown as such.
    hosts[1].signal("TERM");
    assert_eq!(hosts[1].wait_exit(LONG), Some(0));
    assert_eq!(host_states(&hosts[2]).0["h2"], "stopped");
}

#[test]
fn graceful_shutdown_hands_leases_to_the_other_hosts_at_once() {
    let redis = RedisServer::start();
    // Leases far longer than the test: only a hand-back can move the tasks.
    let config = |i: usize| {
        format!(
            "[runner]\nhost_id = \"h{i}\"\nlease = \"10m\"\ngrace_period = \"300ms\"\n[types.long]\nconcurrency = 2\ntimeout = \"60s\"\n"
        )
    };
    let mut hosts: Vec<Host> =
        (1..=3).map(|i| Host::start(&redis, &[("long", test_plugin("chaos"))], &config(i))).collect();
    let mut conn = redis.client();
    // As many tasks as slots (3 hosts x 2): no host can take more than 2, so h1 surely holds some.
    for i in 0..6 {
        let _: () = conn.hset("hourglass:{long}:payload", format!("l{i}"), "sleep:4000").unwrap();
        let _: () = conn.zadd("hourglass:{long}:due", format!("l{i}"), now_ms()).unwrap();
    }
    let held = wait_for("h1 to hold a task", LONG, || Some(held_by(&mut conn, "long", "h1")).filter(|h| !h.is_empty()));
    hosts[0].signal("TERM");
    assert_eq!(hosts[0].wait_exit(LONG), Some(0));
    assert!(hosts[0].log().contains("handed back"), "{}", hosts[0].log());
    assert!(held_by(&mut conn, "long", "h1").is_empty(), "h1 kept leases after its exit");
    wait_for("all done", LONG, || (stat(&mut conn, "long", "succeeded") == 6).then_some(()));
    let others = runs(&[&hosts[1], &hosts[2]], "long");
    for id in held {
        assert_eq!(others.get(&id), Some(&1), "{id}, handed back by h1, was not run by another host");
    }
}

// ---------------------------------------------------------------- ACL user

/// The minimum a runner user needs, as the README documents it.
const RUNNER_ACL: &[&str] = &[
    "resetkeys",
    "~hourglass:*",
    "resetchannels",
    "&__keyspace@*__:hourglass:{*}:due",
    "&hourglass:cancel",
    "-@all",
    // connection (`+client|setinfo` too on Redis 7.2+, where it exists)
    "+ping",
    // scripts (and what they run; TYPE checks every key before a script writes)
    "+evalsha",
    "+script|load",
    "+time",
    "+type",
    "+exists",
    "+get",
    "+set",
    "+del",
    "+incrby",
    "+pttl",
    "+pexpire",
    "+publish",
    "+zincrby",
    "+zadd",
    "+zrem",
    "+zrange",
    "+zrangebyscore",
    "+zremrangebyrank",
    "+zrevrangebyscore",
    "+zscore",
    "+zmscore",
    "+zcard",
    "+zcount",
    "+hget",
    "+hmget",
    "+hset",
    "+hdel",
    "+hexists",
    "+hgetall",
    "+hlen",
    "+hincrby",
    "+hstrlen",
    "+xadd",
    // outside scripts: outbox, stats, wake-ups, recurring schedules' index, schedule --wait-replicas
    "+hscan",
    "+scan",
    "+psubscribe",
    "+punsubscribe",
    "+subscribe",
    "+unsubscribe",
    "+smembers",
    "+srem",
    "+sadd",
    "+wait",
];

#[test]
fn a_restricted_acl_user_runs_everything_and_its_password_never_shows() {
    // The operator turns keyspace notifications on: the runner user may not run CONFIG.
    let redis = RedisServer::start_with(&["--notify-keyspace-events", "Kz"]);
    let password = "pw-3f9a1c77e2";
    let mut setuser = vec!["ACL", "SETUSER", "runner", "reset", "on"];
    let pass_rule = format!(">{password}");
    setuser.push(&pass_rule);
    setuser.extend_from_slice(RUNNER_ACL);
    assert_eq!(redis.cli(&setuser).trim(), "OK");
    let host = Host::start(
        &redis,
        &[
            ("noop", plugin("noop")),
            ("device.offline", plugin("device.offline")),
            ("device.alert", plugin("device.alert")),
        ],
        &format!(
            "username = \"runner\"\npassword = \"{password}\"\n[runner]\nwakeup = \"notify\"\nhost_id = \"restricted\"\n{}",
            crate::support::DEVICE_GRANTS
        ),
    );
    let mut conn = redis.client();
    zadd_now(&mut conn, "noop", "n1");
    zadd_now(&mut conn, "device.offline", "sensor-1");
    wait_for("the follow-up alert", LONG, || (stat(&mut conn, "device.alert", "succeeded") == 1).then_some(()));
    wait_for("noop", LONG, || (stat(&mut conn, "noop", "succeeded") == 1).then_some(()));
    let config = host.dir.path().join("runner.toml");
    // The CLI under the same user: schedule, stats (SCAN + scripts), hosts.
    let (ok, _, err) = hourglass(&config, &["schedule", "noop", "n2", "--in", "0s"], &[]);
    assert!(ok, "{err}");
    wait_for("n2", LONG, || (stat(&mut conn, "noop", "succeeded") == 2).then_some(()));
    let (ok, out, err) = hourglass(&config, &["stats"], &[]);
    assert!(ok, "{err}");
    assert!(out.contains("device.alert") && out.contains("restricted"), "{out}");
    // A workflow group through the CLI and the host: join, schedule children, cancel one, report, seal, show.
    for args in [
        &["group", "open", "acl.done", "g-1"][..],
        &["group", "add", "acl.done", "g-1", "noop", "k1", "k2"],
        &["group", "add", "acl.done", "g-1", "noop", "k3", "--in", "1h"],
        &["cancel", "noop", "k3"],
        &["group", "seal", "acl.done", "g-1"],
    ] {
        let (ok, _, err) = hourglass(&config, args, &[]);
        assert!(ok, "{args:?}: {err}");
    }
    wait_for("the group's callback", LONG, || {
        conn.zscore::<_, _, Option<f64>>("hourglass:{acl.done}:due", "g-1").unwrap()
    });
    let (ok, out, err) = hourglass(&config, &["group", "show", "acl.done", "g-1"], &[]);
    assert!(ok && out.contains("2 succeeded, 0 dead, 1 cancelled"), "{out}{err}");
    // Nothing the host or the CLI did was refused, but for the CONFIG GET it tries
    // before trusting the operator's notify-keyspace-events.
    let log_lines: Vec<String> = redis.cli(&["ACL", "LOG"]).lines().map(str::to_owned).collect();
    let denied: Vec<&String> =
        log_lines.windows(2).filter(|w| w[0] == "object").map(|w| &w[1]).filter(|o| *o != "config|get").collect();
    assert!(denied.is_empty(), "ACL denials: {denied:?}");
    let log = host.log();
    assert!(log.contains("wake-up mode: keyspace notifications"), "{log}");
    // A wrong password from the environment fails with a one-line error that does not show it.
    let (ok, _, err) = hourglass(&config, &["stats"], &[("HOURGLASS_REDIS_PASSWORD", "wrong-pw-7d1e")]);
    assert!(!ok);
    assert!(!err.contains("wrong-pw-7d1e"), "{err}");
    assert!(!log.contains(password) && !err.contains(password), "the password was printed");
}

fn zadd_now(conn: &mut redis::Connection, task_type: &str, id: &str) {
    let _: () = conn.zadd(format!("hourglass:{{{task_type}}}:due"), id, now_ms()).unwrap();
}
