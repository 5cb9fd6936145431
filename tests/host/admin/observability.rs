//! What the admin server and the CLI show of a real run: metrics and completion events after a known run, the events cap, JSON logs, the backlog gauges, and `stats --watch`.

use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::{ADMIN, KillOnDrop, LONG};
use crate::support::{
    Host, RedisServer, admin_addr, get, now_ms, plugin, sample, schedule_now as schedule, stat, test_plugin, wait_for,
    zcard,
};
use redis::Commands;
use serde_json::Value;

#[test]
fn metrics_and_events_match_a_known_run() {
    let redis = RedisServer::start();
    let host = Host::start(
        &redis,
        &[("noop", plugin("noop")), ("bad", test_plugin("chaos"))],
        &format!(
            "{ADMIN}[defaults]\nevents = true\nbackoff_base = \"20ms\"\nbackoff_cap = \"50ms\"\n\
             [types.bad]\nmax_attempts = 2\nevents_maxlen = 1000\n"
        ),
    );
    let addr = admin_addr(&host);
    let mut conn = redis.client();
    let before = now_ms();
    for i in 0..5 {
        schedule(&mut conn, "noop", &format!("ok-{i}"), "");
    }
    for i in 0..2 {
        schedule(&mut conn, "bad", &format!("bad-{i}"), "error:boom");
    }
    wait_for("the run", LONG, || {
        (stat(&mut conn, "noop", "succeeded") == 5 && zcard(&mut conn, "hourglass:{bad}:dead") == 2).then_some(())
    });

    let expected: &[(&str, &[&str], f64)] = &[
        ("hourglass_tasks_claimed_total", &["type=\"noop\""], 5.0),
        ("hourglass_tasks_succeeded_total", &["type=\"noop\""], 5.0),
        ("hourglass_tasks_claimed_total", &["type=\"bad\""], 4.0),
        ("hourglass_tasks_failed_total", &["type=\"bad\""], 4.0),
        ("hourglass_tasks_retried_total", &["type=\"bad\""], 2.0),
        ("hourglass_tasks_dead_total", &["type=\"bad\""], 2.0),
        ("hourglass_tasks_in_flight", &["type=\"noop\""], 0.0),
        ("hourglass_tasks_in_flight", &["type=\"bad\""], 0.0),
        ("hourglass_task_lateness_seconds_count", &["type=\"noop\""], 5.0),
        ("hourglass_task_duration_seconds_count", &["type=\"noop\""], 5.0),
        ("hourglass_task_duration_seconds_count", &["type=\"bad\""], 4.0),
        ("hourglass_plugin_loads_total", &["plugin=\"noop\""], 1.0),
        ("hourglass_plugin_loads_total", &["plugin=\"bad\""], 1.0),
    ];
    // The counters follow the settle by a moment; wait for them, then check each.
    let deadline = Instant::now() + LONG;
    let mut metrics = get(&addr, "/metrics").body;
    while Instant::now() < deadline && !expected.iter().all(|(n, l, v)| sample(&metrics, n, l) == Some(*v)) {
        std::thread::sleep(Duration::from_millis(50));
        metrics = get(&addr, "/metrics").body;
    }
    for (n, l, v) in expected {
        assert_eq!(sample(&metrics, n, l), Some(*v), "{n}{l:?}\n{metrics}");
    }
    // Every counter of a served type exists from the start (at 0), so rate() works from the first scrape.
    assert_eq!(sample(&metrics, "hourglass_tasks_succeeded_total", &["type=\"bad\""]), Some(0.0));
    assert_eq!(sample(&metrics, "hourglass_tasks_fenced_total", &["type=\"noop\""]), Some(0.0));
    assert_eq!(sample(&metrics, "hourglass_redis_errors_total", &[]).unwrap_or(0.0), 0.0);
    let noop_hash = hash_of(&crate::support::plugin("noop"));
    assert_eq!(
        sample(&metrics, "hourglass_plugin_info", &["plugin=\"noop\"", &format!("hash=\"{noop_hash}\"")]),
        Some(1.0)
    );
    assert!(sample(&metrics, "hourglass_task_lateness_seconds_bucket", &["type=\"noop\"", "le=\"+Inf\""]) == Some(5.0));

    // Events: one entry per outcome, in the order they were committed.
    let after = now_ms();
    let noop_events = events(&mut conn, "noop");
    assert_eq!(noop_events.len(), 5, "{noop_events:?}");
    for e in &noop_events {
        assert_eq!(e["outcome"], "succeeded");
        assert_eq!(e["attempt"], "1");
        assert!(e["id"].starts_with("ok-"));
        assert!(!e.contains_key("error"));
        let (due, started, finished) = (ms(e, "due_ms"), ms(e, "started_ms"), ms(e, "finished_ms"));
        assert!(before <= due && due <= started && started <= finished && finished <= after, "{e:?}");
    }
    let bad_events = events(&mut conn, "bad");
    let outcomes: Vec<(&str, &str, &str)> =
        bad_events.iter().map(|e| (e["id"].as_str(), e["outcome"].as_str(), e["attempt"].as_str())).collect();
    for id in ["bad-0", "bad-1"] {
        let mine: Vec<_> = outcomes.iter().filter(|(i, _, _)| *i == id).map(|(_, o, a)| (*o, *a)).collect();
        assert_eq!(mine, [("retried", "1"), ("dead", "2")], "{bad_events:?}");
    }
    for e in &bad_events {
        assert_eq!(e["error"], "boom");
        if e["outcome"] == "retried" {
            assert!(ms(e, "retry_at_ms") >= ms(e, "finished_ms"), "{e:?}");
        }
    }
    // A type without events writes no stream.
    let exists: bool = conn.exists("hourglass:{other}:events").unwrap();
    assert!(!exists);
}

fn ms(e: &HashMap<String, String>, field: &str) -> i64 {
    e.get(field).unwrap_or_else(|| panic!("no {field} in {e:?}")).parse().unwrap()
}

/// Every entry of `hourglass:{T}:events`, oldest first.
fn events(conn: &mut redis::Connection, task_type: &str) -> Vec<HashMap<String, String>> {
    let reply: redis::streams::StreamRangeReply = conn.xrange_all(format!("hourglass:{{{task_type}}}:events")).unwrap();
    reply
        .ids
        .into_iter()
        .map(|entry| entry.map.into_iter().map(|(k, v)| (k, redis::from_redis_value::<String>(v).unwrap())).collect())
        .collect()
}

/// The short version hash the host gives a plugin file (first 12 hex digits of SHA-256).
fn hash_of(file: &Path) -> String {
    hourglass::runtime::short_hash(&std::fs::read(file).unwrap())
}

#[test]
fn events_are_capped_by_events_maxlen() {
    let redis = RedisServer::start();
    let _host = Host::start(&redis, &[("noop", plugin("noop"))], "[types.noop]\nevents = true\nevents_maxlen = 10\n");
    let mut conn = redis.client();
    let now = now_ms();
    let mut pipe = redis::pipe();
    for i in 0..500 {
        pipe.zadd("hourglass:{noop}:due", format!("t{i}"), now).ignore();
    }
    let _: () = pipe.query(&mut conn).unwrap();
    wait_for("all done", LONG, || (stat(&mut conn, "noop", "succeeded") == 500).then_some(()));
    let len: usize = conn.xlen("hourglass:{noop}:events").unwrap();
    // MAXLEN ~ trims whole radix-tree nodes (100 entries by default), never below the cap.
    assert!((10..=200).contains(&len), "{len} entries kept");
}

/// A host creates the (empty) events stream of each type with events on as it starts, and no
/// other: clients waiting for a task's end tell "no event yet" from "no events" by it.
#[test]
fn a_host_opens_the_events_stream_of_types_with_events_on() {
    let redis = RedisServer::start();
    let mut conn = redis.client();
    // An entry written before the host starts is kept: the stream is only created when missing.
    let _: String = conn.xadd("hourglass:{kept}:events", "*", &[("id", "old"), ("outcome", "succeeded")]).unwrap();
    let _host = Host::start(
        &redis,
        &[("noop", plugin("noop")), ("quiet", plugin("noop")), ("kept", plugin("noop"))],
        "[types.noop]\nevents = true\n[types.kept]\nevents = true\n",
    );
    let present =
        |conn: &mut redis::Connection, t: &str| -> bool { conn.exists(format!("hourglass:{{{t}}}:events")).unwrap() };
    wait_for("the stream", LONG, || present(&mut conn, "noop").then_some(()));
    let len: usize = conn.xlen("hourglass:{noop}:events").unwrap();
    let groups: Vec<redis::Value> =
        redis::cmd("XINFO").arg("GROUPS").arg("hourglass:{noop}:events").query(&mut conn).unwrap();
    assert_eq!((len, groups.len()), (0, 0), "created empty, with no consumer group left behind");
    assert!(!present(&mut conn, "quiet"), "a type with events off gets no stream");
    assert_eq!(events(&mut conn, "kept").len(), 1, "an existing stream is left as it was");
}

#[test]
fn json_logs_carry_task_and_plugin_fields() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("plugins")).unwrap();
    std::fs::copy(test_plugin("chaos"), dir.path().join("plugins/talk.wasm")).unwrap();
    let config = dir.path().join("runner.toml");
    let cache = crate::support::workspace_root().join("target/test-plugin-cache");
    std::fs::write(
        &config,
        format!("[redis]\nurl = \"{}\"\n[runner]\ncache_dir = \"{}\"\n", redis.url(), cache.display()),
    )
    .unwrap();
    let log = dir.path().join("host.log");
    let mut child = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_hourglass"))
            .args(["--log-format", "json", "--config"])
            .arg(&config)
            .arg("run")
            .env("HOURGLASS_LOG", "info,hourglass=debug")
            .env_remove("HOURGLASS_REDIS_URL")
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    let read = || std::fs::read_to_string(&log).unwrap_or_default();
    wait_for("host start", LONG, || read().contains("hourglass is running").then_some(()));
    let mut conn = redis.client();
    schedule(&mut conn, "talk", "t-1", "stdout");
    wait_for("t-1 done", LONG, || (stat(&mut conn, "talk", "succeeded") == 1).then_some(()));
    wait_for("its log line", LONG, || read().contains("\"message\":\"succeeded\"").then_some(()));
    let _ = child.0.kill();
    let lines: Vec<Value> = read()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}")))
        .collect();
    let done = lines.iter().find(|l| l["message"] == "succeeded").unwrap();
    assert_eq!(
        (done["task_type"].as_str(), done["task_id"].as_str(), done["attempt"].as_u64()),
        (Some("talk"), Some("t-1"), Some(1))
    );
    assert_eq!(done["level"], "DEBUG");
    assert!(done["timestamp"].is_string());
    let said = lines.iter().find(|l| l["message"] == "hello from stdout").expect("the plugin's output line");
    assert_eq!(said["plugin"], "talk");
    assert_eq!(said["plugin_hash"], hash_of(&test_plugin("chaos")).as_str());
    assert_eq!((said["task_id"].as_str(), said["attempt"].as_u64()), (Some("t-1"), Some(1)));
}

#[test]
fn stats_watch_redraws_every_second_until_ctrl_c() {
    let redis = RedisServer::start();
    let mut conn = redis.client();
    schedule(&mut conn, "noop", "later-1", "");
    let out = tempfile::NamedTempFile::new().unwrap();
    let mut child = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_hourglass"))
            .args(["--redis", &redis.url(), "stats", "--watch"])
            .stdout(out.reopen().unwrap())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let frames = || std::fs::read_to_string(out.path()).unwrap_or_default().matches("\x1b[2J\x1b[H").count();
    wait_for("two frames", LONG, || (frames() >= 2).then_some(()));
    let text = std::fs::read_to_string(out.path()).unwrap();
    assert!(text.contains("DUE-NOW") && text.contains("noop"), "{text}");
    let status = Command::new("kill").args(["-INT", &child.0.id().to_string()]).status().unwrap();
    assert!(status.success());
    let code = wait_for("exit on Ctrl-C", LONG, || child.0.try_wait().unwrap()).code();
    assert_eq!(code, Some(0));
    assert!(
        Command::new(env!("CARGO_BIN_EXE_hourglass"))
            .args(["stats", "--watch", "--json"])
            .output()
            .unwrap()
            .status
            .code()
            == Some(2)
    );
}

/// The backlog gauges follow the due set of a type no host serves (so nothing
/// claims its tasks): each sample matches `ZCOUNT` within one sampling period.
#[test]
fn backlog_gauges_follow_the_due_set() {
    let redis = RedisServer::start();
    let host = Host::start(&redis, &[("noop", plugin("noop"))], ADMIN);
    let addr = admin_addr(&host);
    let mut conn = redis.client();
    let now = now_ms();
    for i in 0..3 {
        crate::support::zadd(&mut conn, "report", &format!("late-{i}"), now - 60_000 - i);
    }
    for i in 0..2 {
        crate::support::zadd(&mut conn, "report", &format!("later-{i}"), now + 3_600_000);
    }
    let gauges = |metrics: &str| {
        let g = |name| sample(metrics, name, &["type=\"report\""]);
        (g("hourglass_tasks_due"), g("hourglass_tasks_scheduled"), g("hourglass_oldest_due_age_seconds"))
    };
    let count = |conn: &mut redis::Connection, min: &str, max: &str| -> f64 {
        let n: u64 = redis::cmd("ZCOUNT").arg("hourglass:{report}:due").arg(min).arg(max).query(conn).unwrap();
        n as f64
    };
    assert_eq!((count(&mut conn, "-inf", &now.to_string()), count(&mut conn, &format!("({now}"), "+inf")), (3.0, 2.0));
    let (_, _, age) = wait_for("the gauges to match the due set", LONG, || {
        let (due, later, age) = gauges(&get(&addr, "/metrics").body);
        (due == Some(3.0) && later == Some(2.0)).then(|| (due, later, age.expect("the age gauge with the others")))
    });
    // The oldest is 60.002 s old when written, and only gets older.
    assert!(age >= 60.0, "oldest due age {age}");

    // The next samples see a change: two more due, one scheduled one brought forward, then all gone.
    crate::support::zadd(&mut conn, "report", "late-3", now_ms());
    crate::support::zadd(&mut conn, "report", "later-0", now_ms());
    wait_for("the gauges to follow", LONG, || {
        let (due, later, _) = gauges(&get(&addr, "/metrics").body);
        (due == Some(5.0) && later == Some(1.0)).then_some(())
    });
    let _: () = redis::cmd("DEL").arg("hourglass:{report}:due").query(&mut conn).unwrap();
    wait_for("the gauges to drop to 0", LONG, || {
        (gauges(&get(&addr, "/metrics").body) == (Some(0.0), Some(0.0), Some(0.0))).then_some(())
    });
    // A served type's gauges exist too (its tasks are claimed at once: nothing waits).
    let metrics = get(&addr, "/metrics").body;
    assert_eq!(sample(&metrics, "hourglass_tasks_due", &["type=\"noop\""]), Some(0.0), "{metrics}");
    assert!(metrics.contains("# TYPE hourglass_oldest_due_age_seconds gauge"), "{metrics}");

    // Every metric the Kubernetes files and their README name is one this host serves.
    let deploy = crate::support::workspace_root().join("deploy");
    let mut named = Vec::new();
    for file in ["keda-scaledobject.yaml", "servicemonitor.yaml", "hourglass.yaml", "README.md"] {
        let text = std::fs::read_to_string(deploy.join(file)).unwrap();
        for (at, _) in text.match_indices("hourglass_") {
            let name: String = text[at..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            // `hourglass_*` names them all, not one.
            if !name.ends_with('_') {
                named.push((file, name));
            }
        }
    }
    assert!(named.iter().any(|(f, n)| *f == "keda-scaledobject.yaml" && n == "hourglass_tasks_due"), "{named:?}");
    for (file, name) in named {
        assert!(
            metrics.contains(&format!("# TYPE {name} ")),
            "deploy/{file} names {name}, which /metrics does not serve"
        );
    }
}
