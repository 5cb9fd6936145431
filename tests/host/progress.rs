//! Progress from outside: a handler's reports seen while it runs (`hourglass show`, the events stream),
//! kept across a retry, gone once the task ends or is cancelled, and refused when malformed.

use std::process::Output;
use std::time::Duration;

use crate::support::{Host, RedisServer, leases, now_ms, stat, test_plugin, wait_for};
use redis::Commands;

const LONG: Duration = Duration::from_secs(90);

fn hourglass(redis: &RedisServer, args: &[&str]) -> Output {
    crate::support::hourglass_on(redis, args)
}

/// `hourglass show job <id> --json`, parsed.
fn show(redis: &RedisServer, id: &str) -> serde_json::Value {
    let out = hourglass(redis, &["show", "job", id, "--json"]);
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("show {id}: {e}: {out:?}"))
}

fn schedule(conn: &mut redis::Connection, id: &str, command: &str) {
    let _: () = conn.hset("hourglass:{job}:payload", id, command).unwrap();
    let _: () = conn.zadd("hourglass:{job}:due", id, now_ms()).unwrap();
}

#[test]
fn progress_shows_while_a_task_runs_is_kept_across_a_retry_and_goes_when_it_ends() {
    let redis = RedisServer::start();
    let _host =
        Host::start(&redis, &[("job", test_plugin("chaos"))], "[types.job]\ntimeout = \"60s\"\nevents = true\n");
    let mut conn = redis.client();

    // Reports 40 %, then runs on for 3 s: watched while it runs.
    schedule(&mut conn, "copy", "progress:40:3000");
    let seen = wait_for("the progress of the running task", LONG, || {
        let view = show(&redis, "copy");
        (view["state"] == "running" && view["progress"]["percent"] == 40).then_some(view)
    });
    assert_eq!(seen["progress"]["detail"], serde_json::json!({"step": "chaos", "at": 40}));
    assert_eq!(seen["progress"]["attempt"], 1);
    let text = String::from_utf8_lossy(&hourglass(&redis, &["show", "job", "copy"]).stdout).into_owned();
    let line = text.lines().find(|l| l.starts_with("  progress: 40% {")).unwrap_or_else(|| panic!("{text}"));
    assert!(line.contains(r#""step":"chaos""#) && line.contains("(attempt 1, reported"), "{line}");
    wait_for("the task to end", LONG, || (stat(&mut conn, "job", "succeeded") == 1).then_some(()));
    let kept: bool = conn.hexists("hourglass:{job}:progress", "copy").unwrap();
    assert!(!kept, "an ended task kept its progress");
    assert!(show(&redis, "copy").get("progress").is_none());
    // The report was an event, and clients waiting for the end skip it.
    let events: redis::streams::StreamRangeReply = conn.xrange_all("hourglass:{job}:events").unwrap();
    let outcomes: Vec<(String, String)> =
        events.ids.iter().filter_map(|e| Some((e.get::<String>("id")?, e.get::<String>("outcome")?))).collect();
    assert_eq!(outcomes, [("copy".into(), "progress".into()), ("copy".into(), "succeeded".into())]);
    assert_eq!(events.ids[0].get::<String>("percent").as_deref(), Some("40"));

    // Reports 70 %, then fails to be retried in a minute: the next attempt's
    // watchers see where it got to, even if the settle beat the writer.
    schedule(&mut conn, "import", "progress-retry:70");
    wait_for("the first attempt to fail", LONG, || (stat(&mut conn, "job", "retried") == 1).then_some(()));
    let view = show(&redis, "import");
    assert_eq!(view["state"], "scheduled");
    assert_eq!(view["progress"]["percent"], 70);
    assert_eq!(view["progress"]["attempt"], 1);
    assert_eq!(view["progress"]["detail"], serde_json::json!({"step": "before the retry"}));
    // A cancel of the waiting task takes its progress with it.
    assert!(hourglass(&redis, &["cancel", "job", "import"]).status.success());
    let kept: bool = conn.hexists("hourglass:{job}:progress", "import").unwrap();
    assert!(!kept, "a cancelled task kept its progress");
    assert!(leases(&mut conn, "job").is_empty());
}

#[test]
fn a_malformed_report_is_refused_with_its_reason_and_stores_nothing() {
    let redis = RedisServer::start();
    let _host = Host::start(&redis, &[("job", test_plugin("chaos"))], "[types.job]\nmax_attempts = 1\n");
    let mut conn = redis.client();
    schedule(&mut conn, "bad", "progress-bad");
    wait_for("the task to die", LONG, || (crate::support::zcard(&mut conn, "hourglass:{job}:dead") == 1).then_some(()));
    let error: String = conn.hget("hourglass:{job}:errors", "bad").unwrap();
    let refusals: Vec<&str> = error.split(" | ").collect();
    assert_eq!(refusals.len(), 3, "{error}");
    assert_eq!(refusals[0], "progress of 101% is over 100");
    assert!(refusals[1].starts_with("progress detail is not JSON: "), "{error}");
    assert_eq!(refusals[2], "progress detail of 2002 bytes is over the 1024 bytes allowed");
    let stored: usize = conn.hlen("hourglass:{job}:progress").unwrap();
    assert_eq!(stored, 0);
}

#[test]
fn a_groups_progress_counts_its_ended_children_in_full_and_its_pending_ones_as_far_as_they_reported() {
    let redis = RedisServer::start();
    let host = Host::start(
        &redis,
        &[("job", test_plugin("chaos"))],
        "[admin]\nenabled = true\nlisten = \"127.0.0.1:0\"\n[types.job]\ntimeout = \"60s\"\n",
    );
    let mut conn = redis.client();
    let cli = |args: &[&str]| {
        let out = hourglass(&redis, args);
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        out
    };
    cli(&["group", "open", "report", "week-48"]);
    cli(&["group", "add", "report", "week-48", "job", "c-ok", "--payload", "ok"]);
    cli(&["group", "add", "report", "week-48", "job", "c-run", "--payload", "progress:50:6000"]);
    cli(&["group", "add", "report", "week-48", "job", "c-later", "--in", "1h", "--payload", "ok"]);
    wait_for("one child ended and one reported", LONG, || {
        let done = stat(&mut conn, "job", "succeeded") == 1;
        let reported: bool = conn.hexists("hourglass:{job}:progress", "c-run").unwrap();
        (done && reported).then_some(())
    });
    let out = cli(&["group", "show", "report", "week-48", "--json"]);
    let view: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // (1 ended × 100 + 50 + 0) / 3 children.
    assert_eq!(view["progress"]["percent"], 50.0, "{view}");
    assert_eq!((view["progress"]["pending_read"].as_u64(), view["progress"]["reporting"].as_u64()), (Some(2), Some(1)));
    let text = String::from_utf8_lossy(&cli(&["group", "show", "report", "week-48"]).stdout).into_owned();
    assert!(text.contains("  progress  50% done (1 of 2 pending children read have reported)"), "{text}");
    // The group's page draws the reported share inside the pending part of its bar.
    let page = crate::support::get(&crate::support::admin_addr(&host), "/group?type=report&group=week-48");
    assert!(page.body.contains("<span class=reported data-reported=\"0.50\""), "{}", page.body);
    assert!(page.body.contains("50% done: each ended child counts in full"), "{}", page.body);
}

/// A host killed mid-run: its run's last report stays with the task while the
/// lease runs out, and the next attempt, on the host that takes it over,
/// replaces it with its own; once that attempt ends, nothing is left.
#[test]
fn a_killed_hosts_last_report_stays_until_the_next_attempt_reports_its_own() {
    let redis = RedisServer::start();
    let config = |id: &str| format!("[runner]\nhost_id = \"{id}\"\nlease = \"2s\"\n[types.job]\ntimeout = \"60s\"\n");
    let mut first = Host::start(&redis, &[("job", test_plugin("chaos"))], &config("h1"));
    let mut conn = redis.client();
    schedule(&mut conn, "long", "progress:40:4000");
    let reported = wait_for("attempt 1 to report", LONG, || {
        let view = show(&redis, "long");
        (view["progress"]["attempt"] == 1).then_some(view)
    });
    assert_eq!(reported["running"]["host"], "h1");
    first.signal("KILL");
    first.wait_exit(LONG);
    let view = show(&redis, "long");
    assert_eq!((view["progress"]["percent"].as_u64(), view["progress"]["attempt"].as_u64()), (Some(40), Some(1)));

    let _second = Host::start(&redis, &[("job", test_plugin("chaos"))], &config("h2"));
    wait_for("attempt 2 to report on h2", LONG, || {
        let view = show(&redis, "long");
        (view["progress"]["attempt"] == 2 && view["running"]["host"] == "h2").then_some(())
    });
    wait_for("attempt 2 to end", LONG, || (stat(&mut conn, "job", "succeeded") == 1).then_some(()));
    let left: usize = conn.hlen("hourglass:{job}:progress").unwrap();
    assert_eq!(left, 0);
}
