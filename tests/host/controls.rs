//! Operator controls on running hosts: pause and resume a type on every host,
//! and cancel a task, scheduled or running on another host.

use std::process::Output;
use std::time::Duration;

use crate::support::{Host, RedisServer, admin_addr, get, leases, now_ms, plugin, stat, test_plugin, wait_for, zcard};
use redis::Commands;

const LONG: Duration = Duration::from_secs(90);

fn hourglass(redis: &RedisServer, args: &[&str]) -> Output {
    crate::support::hourglass_on(redis, args)
}

fn text(out: &[u8]) -> String {
    String::from_utf8_lossy(out).into_owned()
}

#[test]
fn a_pause_holds_every_host_and_a_resume_runs_everything_once() {
    let redis = RedisServer::start();
    let hosts: Vec<Host> = (1..=2)
        .map(|i| Host::start(&redis, &[("mail", plugin("noop"))], &format!("[runner]\nhost_id = \"h{i}\"\n")))
        .collect();
    let out = hourglass(&redis, &["pause", "mail"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("paused mail on every host until 'hourglass resume mail'"));
    for host in &hosts {
        host.wait_log("type paused: no claims until it is resumed", LONG);
    }
    let mut conn = redis.client();
    let now = now_ms();
    for i in 0..200 {
        let _: () = conn.zadd("hourglass:{mail}:due", format!("m{i}"), now).unwrap();
    }
    // The hosts keep looking (once a second each) and take nothing.
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(zcard(&mut conn, "hourglass:{mail}:due"), 200, "a paused type's tasks were claimed");
    assert_eq!(stat(&mut conn, "mail", "succeeded"), 0);
    let stats = text(&hourglass(&redis, &["stats"]).stdout);
    assert!(stats.contains("PAUSED mail: until resumed (200 due now wait)"), "{stats}");

    let out = hourglass(&redis, &["resume", "mail"]);
    assert!(out.status.success());
    wait_for("all 200 after the resume", LONG, || (stat(&mut conn, "mail", "succeeded") == 200).then_some(()));
    let refs: Vec<&Host> = hosts.iter().collect();
    let mut runs = 0;
    for host in &refs {
        runs += host.log().lines().filter(|l| l.contains("succeeded") && l.contains("task_type=mail ")).count();
    }
    assert_eq!(runs, 200, "each task ran once");
    let out = hourglass(&redis, &["resume", "mail"]);
    assert_eq!(out.status.code(), Some(1), "resuming a type that is not paused is an error");

    // A pause given a length ends by itself.
    let out = hourglass(&redis, &["pause", "mail", "--for", "1s"]);
    assert!(text(&out.stdout).contains("then it resumes by itself"), "{}", text(&out.stdout));
    let _: () = conn.zadd("hourglass:{mail}:due", "after", now_ms()).unwrap();
    wait_for("the task after the pause ended", LONG, || (stat(&mut conn, "mail", "succeeded") == 201).then_some(()));
    let exists: bool = conn.exists("hourglass:{mail}:paused").unwrap();
    assert!(!exists);
}

#[test]
fn cancel_stops_a_handler_running_on_another_host_and_removes_a_scheduled_task() {
    let redis = RedisServer::start();
    let config = |i: usize| format!("[runner]\nhost_id = \"h{i}\"\n[types.job]\ntimeout = \"120s\"\nevents = true\n");
    let hosts: Vec<Host> = (1..=2).map(|i| Host::start(&redis, &[("job", test_plugin("chaos"))], &config(i))).collect();
    let mut conn = redis.client();
    // A handler spinning in a loop until its (long) deadline.
    let _: () = conn.hset("hourglass:{job}:payload", "spin", "loop").unwrap();
    let _: () = conn.zadd("hourglass:{job}:due", "spin", now_ms()).unwrap();
    let holder = wait_for("the loop to run", LONG, || leases(&mut conn, "job").remove("spin"));

    let out = hourglass(&redis, &["cancel", "job", "spin"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let said = text(&out.stdout);
    assert!(
        said.contains(&format!("cancelled running task job/spin: host {holder} stopped its handler")),
        "the CLI did not see the run end: {said}"
    );
    assert!(leases(&mut conn, "job").is_empty());
    assert_eq!(zcard(&mut conn, "hourglass:{job}:due"), 0, "a cancelled run was retried");
    assert_eq!(stat(&mut conn, "job", "cancelled"), 1);
    assert_eq!(stat(&mut conn, "job", "failed"), 0);
    let events: redis::streams::StreamRangeReply = conn.xrange_all("hourglass:{job}:events").unwrap();
    let outcomes: Vec<String> = events.ids.iter().filter_map(|e| e.get("outcome")).collect();
    assert_eq!(outcomes, ["cancelled"]);
    let host = hosts.iter().find(|h| h.log().contains("cancelled while running")).expect("a host stopped it");
    assert!(host.log().contains(&format!("host_id={holder}")) || host.log().contains(&holder));

    // A scheduled task is removed.
    let _: () = conn.zadd("hourglass:{job}:due", "later", now_ms() + 3_600_000).unwrap();
    let out = hourglass(&redis, &["cancel", "job", "later"]);
    assert_eq!(text(&out.stdout).trim(), "cancelled scheduled task job/later");
    let out = hourglass(&redis, &["cancel", "job", "nothing"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("job/nothing is neither scheduled nor running"));
}

/// One run of an id at a time, as a user sees it: a task runs for 2 s; while
/// it runs, a client `ZADD`s the same id due now (a retry button, a second
/// producer). Two hosts with room to spare could start it at once; instead
/// the new schedule waits, runs right after the first run ended, and runs
/// exactly once. The events stream has both runs' start and finish times.
#[test]
fn a_task_scheduled_again_while_it_runs_runs_again_only_after_the_run_ended_and_once() {
    let redis = RedisServer::start();
    let config = |i: usize| format!("[runner]\nhost_id = \"h{i}\"\n[types.job]\nevents = true\n");
    let _hosts: Vec<Host> =
        (1..=2).map(|i| Host::start(&redis, &[("job", test_plugin("chaos"))], &config(i))).collect();
    let mut conn = redis.client();
    let _: () = conn.hset("hourglass:{job}:payload", "order-7", "sleep:2000").unwrap();
    let _: () = conn.zadd("hourglass:{job}:due", "order-7", now_ms()).unwrap();
    wait_for("the first run to start", LONG, || leases(&mut conn, "job").remove("order-7"));

    // The client schedules the running id again, due now, as any Redis client can.
    let again = now_ms();
    let _: () = conn.zadd("hourglass:{job}:due", "order-7", again).unwrap();
    // A claim holds it back; `show` gives the time the client wrote, not the lease's end.
    wait_for("a claim to hold it back", LONG, || {
        (conn.hlen::<_, usize>("hourglass:{job}:held").unwrap() == 1).then_some(())
    });
    let shown = hourglass(&redis, &["show", "job", "order-7", "--json"]);
    let shown: serde_json::Value = serde_json::from_slice(&shown.stdout).expect("show --json");
    assert_eq!(shown["state"], "running", "{shown}");
    assert_eq!(shown["due_ms"], again, "{shown}");
    wait_for("both runs", LONG, || (stat(&mut conn, "job", "succeeded") == 2).then_some(()));
    // Time for a third run to show up, if the schedule were kept twice.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(stat(&mut conn, "job", "succeeded"), 2, "the id ran more than twice");
    assert_eq!(zcard(&mut conn, "hourglass:{job}:due"), 0);
    assert_eq!(conn.hlen::<_, usize>("hourglass:{job}:held").unwrap(), 0, "a held schedule was left behind");

    let events: redis::streams::StreamRangeReply = conn.xrange_all("hourglass:{job}:events").unwrap();
    let field = |e: &redis::streams::StreamId, f: &str| -> i64 {
        e.get::<String>(f).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("event without {f}: {e:?}"))
    };
    let runs: Vec<(i64, i64)> = events
        .ids
        .iter()
        .filter(|e| e.get::<String>("id").as_deref() == Some("order-7"))
        .map(|e| (field(e, "started_ms"), field(e, "finished_ms")))
        .collect();
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert!(runs[1].0 >= runs[0].1, "the second run started at {} before the first ended at {}", runs[1].0, runs[0].1);
}

/// A host stops a run whose lease it lost, and writes nothing for it. The
/// lease is taken away in Redis as a reap does (no claim holds the task any
/// more) while the handler spins towards a deadline an hour away. The next
/// renewal learns it: the run ends where it is, its slot comes back (with
/// `concurrency = 1` the next task can run only then), one line names it,
/// `hourglass_runs_abandoned_total` counts it, and no outcome is written for
/// it (nothing fenced, nothing failed).
#[test]
fn a_run_whose_lease_was_lost_is_stopped_and_writes_nothing() {
    let redis = RedisServer::start();
    let (host, mut conn) = spinning(&redis, "concurrency = 1\n");

    let _: () =
        redis::cmd("DEL").arg("hourglass:{job}:claimed").arg("hourglass:{job}:claims").query(&mut conn).unwrap();
    host.wait_log("lease lost while running", LONG);
    let _: () = conn.zadd("hourglass:{job}:due", "next", now_ms()).unwrap();
    wait_for("the next task, in the slot the stopped run freed", LONG, || {
        (stat(&mut conn, "job", "succeeded") == 1).then_some(())
    });

    let metrics = get(&admin_addr(&host), "/metrics").body;
    assert!(metrics.contains("hourglass_runs_abandoned_total{type=\"job\"} 1"), "{metrics}");
    assert!(
        metrics.contains("hourglass_tasks_fenced_total{type=\"job\"} 0")
            || !metrics.contains("hourglass_tasks_fenced_total{type=\"job\"}"),
        "{metrics}"
    );
    assert_eq!((stat(&mut conn, "job", "failed"), stat(&mut conn, "job", "cancelled")), (0, 0));
    let log = host.log();
    assert_eq!(log.matches("lease lost while running").count(), 1, "{log}");
    assert!(log.contains("ids=spin"), "{log}");
}

/// Redis stops answering for longer than the lease (every client paused):
/// the host cannot renew, and stops the run before the lease runs out rather
/// than let it go on while another host may take the task (which then runs
/// again once the lease lapses, as at-least-once says).
#[test]
fn a_run_is_stopped_when_no_renewal_reaches_redis_before_its_lease_runs_out() {
    let redis = RedisServer::start();
    let (host, mut conn) = spinning(&redis, "");

    let _: () = redis::cmd("CLIENT").arg("PAUSE").arg(6000).arg("ALL").query(&mut conn).unwrap();
    host.wait_log("no lease renewal reached Redis in time", LONG);
    // The run counts itself as it ends, just after the watch's line.
    wait_for("the stopped run to be counted", LONG, || {
        get(&admin_addr(&host), "/metrics")
            .body
            .contains("hourglass_runs_abandoned_total{type=\"job\"} 1")
            .then_some(())
    });
    assert!(host.log().contains("ids=spin"), "{}", host.log());
}

/// A host serving `job` (chaos) with a 3 s lease, the admin server on and
/// `extra` in `[types.job]`, running task `spin`, whose handler loops towards
/// a deadline an hour away; returns once `spin` is leased.
fn spinning(redis: &RedisServer, extra: &str) -> (Host, redis::Connection) {
    let config = format!(
        "[admin]\nenabled = true\nlisten = \"127.0.0.1:0\"\n[runner]\nlease = \"3s\"\n[types.job]\ntimeout = \"1h\"\n{extra}"
    );
    let host = Host::start(redis, &[("job", test_plugin("chaos"))], &config);
    let mut conn = redis.client();
    let _: () = conn.hset("hourglass:{job}:payload", "spin", "loop").unwrap();
    let _: () = conn.zadd("hourglass:{job}:due", "spin", now_ms()).unwrap();
    wait_for("the loop to run", LONG, || leases(&mut conn, "job").remove("spin"));
    (host, conn)
}
