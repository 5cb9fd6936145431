//! A host's wall clock an hour ahead, then stepped an hour back while it runs (libfaketime).

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use super::{Commit, LONG, TYPE, Wrapped, check, commits, config, schedule_at, tasks, wait_all_done};
use crate::support::{RedisServer, redis_now, wait_for};

/// libfaketime's multi-threaded library (the host runs many threads).
fn libfaketime() -> PathBuf {
    let listed = Command::new("dpkg").args(["-L", "libfaketime"]).output().map(|o| o.stdout).unwrap_or_default();
    String::from_utf8_lossy(&listed)
        .lines()
        .map(PathBuf::from)
        .chain(
            ["/usr/lib/x86_64-linux-gnu/faketime", "/usr/lib/faketime", "/usr/local/lib/faketime"]
                .map(|d| PathBuf::from(d).join("libfaketimeMT.so.1")),
        )
        .find(|p| p.ends_with("libfaketimeMT.so.1") && p.exists())
        .expect("libfaketime is not installed: apt-get install faketime (.ci/setup does)")
}

/// Redis TIME and how many tasks are still due after it, in one step.
const DUE_LATER: &str = r#"
    local t = redis.call('TIME')
    local ms = t[1] * 1000 + math.floor(t[2] / 1000)
    return { tostring(ms), redis.call('ZCOUNT', KEYS[1], '(' .. ms, '+inf') }"#;

/// Schedules `ids` due from 1.5 s ahead by Redis's clock and watches, by
/// Redis's clock, that none leaves `due` before its time; then waits for them all.
/// Returns the commits of these ids.
fn run_on_time(conn: &mut redis::Connection, ids: &[String], done_before: usize) -> Vec<(String, Commit)> {
    let start = redis_now(conn) + 1500;
    let due: Vec<i64> = (0..ids.len() as i64).map(|i| start + i * 10).collect();
    schedule_at(conn, ids.iter().cloned().zip(due.iter().copied()), 20);
    let last = *due.last().unwrap();
    loop {
        let (now, later): (String, usize) =
            redis::Script::new(DUE_LATER).key(crate::support::key(TYPE, "due")).invoke(conn).unwrap();
        let now: i64 = now.parse().unwrap();
        let expected = due.iter().filter(|&&d| d > now).count();
        assert!(
            later >= expected,
            "at {now} (Redis clock) only {later} tasks wait for a later time, {expected} should"
        );
        if now > last {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    wait_all_done(conn, done_before + ids.len());
    let mut commits = commits(conn);
    ids.iter().map(|id| (id.clone(), commits.remove(id).and_then(|mut c| c.pop()).expect("a commit"))).collect()
}

#[test]
fn a_host_clock_step_changes_nothing_it_runs_by_redis_time() {
    let n = tasks();
    let redis = RedisServer::start();
    let mut conn = redis.client();
    // The host's wall clock, an hour ahead at first; libfaketime reads the file
    // again at most a second after it changes: a step while it runs.
    let clock = tempfile::tempdir().unwrap();
    let offset = clock.path().join("offset");
    std::fs::write(&offset, "+1h\n").unwrap();
    let lib = libfaketime();
    let env = [
        ("LD_PRELOAD", lib.to_str().unwrap()),
        ("FAKETIME_TIMESTAMP_FILE", offset.to_str().unwrap()),
        ("FAKETIME_CACHE_DURATION", "1"),
        // Timers and leases run on the monotonic clock, which a wall-clock step leaves alone.
        ("DONT_FAKE_MONOTONIC", "1"),
    ];
    let host = Wrapped::start(&redis.url(), &config("h1", n), &[], &env);
    const HOUR: i64 = 3_600_000;
    let ids: Vec<String> = (0..n).map(|i| format!("w{i}")).collect();
    let (ahead, behind) = ids.split_at(n / 2);
    let first = run_on_time(&mut conn, ahead, 0);
    // The host really saw the fake time: its started_ms leads Redis's commit time by about an hour.
    let skewed = |c: &Commit, by: i64| (c.started_ms - c.at_ms - by).abs() < 10 * 60_000;
    assert!(first.iter().all(|(_, c)| skewed(c, HOUR)), "the host's clock was not an hour ahead");
    // Step it two hours back, live; a probe task shows when the host sees it.
    std::fs::write(&offset, "-1h\n").unwrap();
    let stepped_ms = redis_now(&mut conn);
    let mut probes = 0;
    wait_for("the host to see its clock stepped back", LONG, || {
        probes += 1;
        // Probes are tasks like the others, numbered on from the last.
        let probe = format!("w{}", n + probes - 1);
        let c = run_on_time(&mut conn, std::slice::from_ref(&probe), n / 2 + probes - 1).pop().unwrap().1;
        skewed(&c, -HOUR).then_some(())
    });
    let second = run_on_time(&mut conn, behind, n / 2 + probes);
    let all: Vec<&(String, Commit)> = first.iter().chain(&second).collect();
    let early: Vec<&String> = all.iter().filter(|(_, c)| c.at_ms < c.due_ms).map(|(id, _)| id).collect();
    assert!(early.is_empty(), "committed before they were due by Redis's clock: {early:?}");
    // Recovery here: the latest any task committed after its due time, by
    // Redis's clock (an hour if the host went by its own clock).
    let recovery_ms = all.iter().map(|(_, c)| c.at_ms - c.due_ms).max().unwrap();
    eprintln!("  (clock stepped at {stepped_ms} ms; the host saw it after {probes} probe tasks)");
    let logs = HashMap::from([("h1", host.log())]);
    let name = "host clock an hour ahead, then stepped to an hour behind while running";
    let report = check(name, &mut conn, n + probes, &HashMap::new(), &logs, recovery_ms);
    assert_eq!(report.twice, 0);
}
