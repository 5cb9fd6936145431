//! Hostile plugins against a running host, with a stream of ordinary tasks beside them.
//!
//! Each test is written the way a careless or malicious plugin author would
//! try to get out of the sandbox through what the host holds on the guest's
//! behalf: blocked host calls, host memory outside `memory_limit`, log
//! floods and forged log lines, oversized errors, workflow graphs shaped to
//! swell when parsed, allow-list bypasses, and shutdown while handlers hang.
//! (What a plugin can do to the host while it is compiled is `compile.rs`.)
//! Every test asserts that the ordinary `noop` tasks running beside all
//! succeed, and the memory tests that the host's memory stays under the
//! bound docs/sandbox.md documents, during a hostile run and after compiling
//! an interpreter-sized plugin.

use std::io::Read;
use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::{Host, RedisServer, now_ms, plugin, stat, test_plugin, wait_for};
use redis::Commands;

const LONG: Duration = Duration::from_secs(120);

/// Schedules `n` noop tasks due over the next `spread_ms`.
pub(super) fn noop_stream(conn: &mut redis::Connection, n: usize, spread_ms: i64) {
    let now = now_ms();
    let mut pipe = redis::pipe();
    for i in 0..n {
        pipe.zadd("hourglass:{noop}:due", format!("n{i}"), now + spread_ms * i as i64 / n as i64).ignore();
    }
    let _: () = pipe.query(conn).unwrap();
}

/// Schedules one chaos task per (id, command) pair, due now.
pub(super) fn hostile(conn: &mut redis::Connection, tasks: &[(String, String)]) {
    let now = now_ms();
    let mut pipe = redis::pipe();
    for (id, command) in tasks {
        pipe.hset("hourglass:{chaos}:payload", id, command).ignore();
        pipe.zadd("hourglass:{chaos}:due", id, now).ignore();
    }
    let _: () = pipe.query(conn).unwrap();
}

/// Waits until every noop task succeeded and every chaos task is dead (max_attempts = 1).
pub(super) fn wait_all_settled(conn: &mut redis::Connection, noops: usize, chaos: usize) {
    wait_for("every ordinary task to succeed and every hostile one to die", LONG, || {
        let ok = stat(conn, "noop", "succeeded") as usize;
        let dead = crate::support::zcard(conn, "hourglass:{chaos}:dead");
        (ok >= noops && dead >= chaos).then_some(())
    });
    assert_eq!(stat(conn, "noop", "succeeded") as usize, noops, "an ordinary task ran twice or failed");
    assert_eq!(stat(conn, "noop", "failed"), 0, "an ordinary task failed beside the hostile ones");
}

/// The error stored for a dead chaos task.
fn error_of(conn: &mut redis::Connection, id: &str) -> String {
    conn.hget::<_, _, Option<String>>("hourglass:{chaos}:errors", id).unwrap().unwrap_or_default()
}

/// A TCP server that accepts connections and never answers; counts them.
fn silent_server() -> (u16, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = accepted.clone();
    let held = Arc::new(Mutex::new(Vec::new()));
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            counter.fetch_add(1, Ordering::SeqCst);
            let held = held.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while matches!(stream.read(&mut buf), Ok(n) if n > 0) {}
                held.lock().unwrap().push(stream);
            });
        }
    });
    (port, accepted)
}

#[test]
fn handlers_blocked_in_host_calls_end_at_their_deadline_and_hold_only_their_own_slots() {
    let redis = RedisServer::start();
    let (port, _) = silent_server();
    let host = Host::start(
        &redis,
        &[("noop", plugin("noop")), ("chaos", test_plugin("chaos"))],
        &format!(
            "[runner]\nconcurrency = 24\n[defaults]\nconcurrency = 16\n\
             [types.chaos]\nconcurrency = 4\ntimeout = \"1s\"\nmax_attempts = 1\nhttp_timeout = \"600s\"\n\
             allowed_outbound_hosts = [\"http://127.0.0.1:{port}\"]\n"
        ),
    );
    let mut conn = redis.client();
    // Blocked in a clock wait, and in an HTTP request to a server that never answers:
    // both are host calls, where the epoch deadline alone cannot stop a guest.
    let mut tasks = Vec::new();
    for i in 0..30 {
        tasks.push((format!("sleep-{i}"), "sleep:600000".to_owned()));
        tasks.push((format!("hang-{i}"), format!("http-get:http://127.0.0.1:{port}/hang")));
    }
    hostile(&mut conn, &tasks);
    noop_stream(&mut conn, 3000, 5000);
    wait_all_settled(&mut conn, 3000, tasks.len());
    for (id, _) in &tasks {
        assert_eq!(error_of(&mut conn, id), "deadline of 1s exceeded", "{id}");
    }
    let log = host.log();
    assert!(!log.contains("maximum concurrent limit"), "the instance pool ran out:\n{log}");
    // Every run ended: no handler is left in flight, and no thread was left blocked behind one.
    wait_for("no handler in flight", LONG, || crate::support::leases(&mut conn, "chaos").is_empty().then_some(()));
    let threads = host.proc_status("Threads:");
    assert!(threads < 30, "{threads} threads: blocked runs kept their threads");
}

#[test]
fn host_memory_a_plugin_asks_for_is_bounded_and_charged_to_its_run() {
    let redis = RedisServer::start();
    // 8 runs at once, each with 16 MiB of linear memory and 4 MiB of host memory.
    let host = Host::start(
        &redis,
        &[("noop", plugin("noop")), ("chaos", test_plugin("chaos"))],
        "[runner]\nconcurrency = 8\n[defaults]\nconcurrency = 4\nmemory_limit = \"16MiB\"\nhost_memory_limit = \"4MiB\"\n\
         [types.chaos]\ntimeout = \"20s\"\nmax_attempts = 1\nevents = true\nmay_schedule = [\"noop\"]\n",
    );
    let mut conn = redis.client();
    noop_stream(&mut conn, 200, 0);
    wait_all_settled(&mut conn, 200, 0);
    let rss_before = host.proc_status("VmRSS:");
    let log_before = host.log().len();

    let mut tasks = Vec::new();
    for i in 0..4 {
        // 100,000 header fields of 100 KB each: 10 GB if the host kept them all;
        // and 100,000 of 1 KB, each under the per-fields cap.
        tasks.push((format!("fields-{i}"), "fields:100000:102400".to_owned()));
        tasks.push((format!("many-fields-{i}"), "fields:100000:1000".to_owned()));
        // 100,000 request bodies written until the host stops taking bytes.
        tasks.push((format!("bodies-{i}"), "bodies:100000".to_owned()));
        // 1,000 follow-ups of 1 MiB: 1 GiB of buffered follow-ups.
        tasks.push((format!("followups-{i}"), "followups-big:1000".to_owned()));
        // 64 MiB of log lines, and a 10 MiB error text.
        tasks.push((format!("logs-{i}"), "log-flood:67108864".to_owned()));
        tasks.push((format!("error-{i}"), "error-huge:10485760".to_owned()));
    }
    hostile(&mut conn, &tasks);
    let total = 200 + 2000;
    noop_stream(&mut conn, 2000, 3000);
    wait_for("the hostile tasks", LONG, || {
        let dead = crate::support::zcard(&mut conn, "hourglass:{chaos}:dead");
        let ok = stat(&mut conn, "chaos", "succeeded");
        (dead + ok as usize >= tasks.len()).then_some(())
    });
    wait_all_settled(&mut conn, total, 0);

    for i in 0..4 {
        let fields = error_of(&mut conn, &format!("fields-{i}"));
        assert!(
            fields.starts_with("host memory budget exceeded: a header fields resource over 4.0 KiB"),
            "fields-{i}: {fields}"
        );
        let many = error_of(&mut conn, &format!("many-fields-{i}"));
        assert!(
            many.starts_with("host memory budget exceeded: more than 512 live resources"),
            "many-fields-{i}: {many}"
        );
        let bodies = error_of(&mut conn, &format!("bodies-{i}"));
        assert!(
            bodies.starts_with("host memory budget exceeded: more than 512 live resources"),
            "bodies-{i}: {bodies}"
        );
        let followups = error_of(&mut conn, &format!("followups-{i}"));
        assert!(followups.starts_with("host memory budget exceeded: follow-ups"), "followups-{i}: {followups}");
        let error = error_of(&mut conn, &format!("error-{i}"));
        assert!(error.len() <= 4096 + 64 && error.ends_with("more bytes cut)"), "error-{i}: {} bytes", error.len());
        // The log flood succeeds: its lines past the cap are dropped, not the task.
    }
    assert_eq!(stat(&mut conn, "chaos", "succeeded"), 4, "only the log floods succeed");
    let outbox: usize = conn.hlen("hourglass:{chaos}:outbox").unwrap();
    assert_eq!(outbox, 0, "a run over its budget committed follow-ups");
    assert_eq!(crate::support::zcard(&mut conn, "hourglass:{noop}:due"), 0);

    // What the events stream keeps of an error is capped like the errors hash.
    let events: redis::streams::StreamRangeReply = conn.xrange_all("hourglass:{chaos}:events").unwrap();
    for entry in &events.ids {
        if let Some(redis::Value::BulkString(text)) = entry.map.get("error") {
            assert!(text.len() <= 4096 + 64, "an event kept {} bytes of error", text.len());
        }
    }

    // 4 × 64 MiB of log lines asked for; each run may emit 64 KiB.
    let logged = host.log().len() - log_before;
    assert!(logged < 4 << 20, "the host logged {logged} bytes");

    // The documented bound: concurrency × (memory_limit + host_memory_limit),
    // plus the transient copy of one host-call argument per run (at most its
    // own linear memory): 8 × (16 + 4 + 16) MiB.
    let peak = host.proc_status("VmHWM:");
    let bound_kb = 8 * (16 + 4 + 16) * 1024;
    assert!(
        peak < rss_before + bound_kb,
        "peak RSS {peak} kB, {rss_before} kB before: over the bound of {bound_kb} kB"
    );
    eprintln!("RSS before {rss_before} kB, peak {peak} kB, now {} kB", host.proc_status("VmRSS:"));
}

/// Graphs declared by a handler are parsed within its run's budget: 24 MB
/// of JSON of 2-byte parents, thousands of tiny nodes, and long payloads, 20
/// calls a run, four runs at once, beside ordinary tasks. (A host that parsed
/// the text into a `serde_json::Value` first went over the bound here:
/// 762 MiB above its idle size, against 656.)
#[test]
fn graphs_a_plugin_floods_the_host_with_are_parsed_within_its_budget() {
    let redis = RedisServer::start();
    let host = Host::start(
        &redis,
        &[("noop", plugin("noop")), ("chaos", test_plugin("chaos"))],
        "[runner]\nconcurrency = 8\n[defaults]\nconcurrency = 4\nmemory_limit = \"16MiB\"\nhost_memory_limit = \"4MiB\"\n\
         [types.chaos]\nmemory_limit = \"32MiB\"\nhost_memory_limit = \"64MiB\"\ntimeout = \"60s\"\nmax_attempts = 1\n\
         may_schedule = [\"noop\", \"chaos\"]\n",
    );
    let mut conn = redis.client();
    noop_stream(&mut conn, 200, 0);
    wait_all_settled(&mut conn, 200, 0);
    let rss_before = host.proc_status("VmRSS:");

    let mut tasks = Vec::new();
    for i in 0..4 {
        tasks.push((format!("parents-{i}"), "graph-flood:parents:24000000".to_owned()));
        tasks.push((format!("nodes-{i}"), "graph-flood:nodes:0".to_owned()));
        tasks.push((format!("payloads-{i}"), "graph-flood:payloads:20000000".to_owned()));
    }
    hostile(&mut conn, &tasks);
    noop_stream(&mut conn, 2000, 3000);
    wait_for("the hostile tasks", LONG, || {
        let dead = crate::support::zcard(&mut conn, "hourglass:{chaos}:dead");
        let ok = stat(&mut conn, "chaos", "succeeded");
        (dead + ok as usize >= tasks.len()).then_some(())
    });
    wait_all_settled(&mut conn, 2200, 0);

    // The parents stop being read at the edge limit: every call refused, the run's own success stands.
    assert_eq!(stat(&mut conn, "chaos", "succeeded"), 4, "only the 2-byte parents' runs succeed");
    for i in 0..4 {
        for shape in ["nodes", "payloads"] {
            let error = error_of(&mut conn, &format!("{shape}-{i}"));
            assert!(error.starts_with("host memory budget exceeded: graphs would hold"), "{shape}-{i}: {error}");
        }
    }
    // A run over its budget declared nothing.
    assert_eq!(crate::support::zcard(&mut conn, "hourglass:{chaos}:graphs"), 0);
    let outbox: usize = conn.hlen("hourglass:{chaos}:outbox").unwrap();
    assert_eq!(outbox, 0, "a run over its budget committed a graph");

    // The documented bound, as above: for each run at once, 2 × memory_limit + host_memory_limit.
    let peak = host.proc_status("VmHWM:");
    let bound_kb = (4 * (2 * 32 + 64) + 4 * (2 * 16 + 4)) * 1024;
    assert!(
        peak < rss_before + bound_kb,
        "peak RSS {peak} kB, {rss_before} kB before: over the bound of {bound_kb} kB"
    );
    eprintln!("RSS before {rss_before} kB, peak {peak} kB, now {} kB", host.proc_status("VmRSS:"));
}

/// One plugin must not reach another type's tasks unless runner.toml says
/// so: a type without a grant can neither re-schedule a waiting task of
/// another type (which would silently move or cancel it) nor create one
/// there (a confused deputy). A granted type creates new tasks but, unless
/// `may_replace` says so, leaves existing ones as they are.
#[test]
fn a_type_reaches_another_types_tasks_only_where_runner_toml_grants_it() {
    let redis = RedisServer::start();
    let host = Host::start(
        &redis,
        &[
            ("noop", plugin("noop")),
            ("victim", plugin("noop")),
            ("chaos", test_plugin("chaos")),
            ("relay", test_plugin("chaos")),
        ],
        "[types.chaos]\nmax_attempts = 1\n[types.relay]\nmax_attempts = 1\nmay_schedule = [\"victim\"]\n",
    );
    let mut conn = redis.client();
    let due = now_ms() + 8000;
    for id in ["v-1", "v-2"] {
        crate::support::payload(&mut conn, "victim", id, "original");
        crate::support::zadd(&mut conn, "victim", id, due);
    }
    noop_stream(&mut conn, 1000, 3000);
    hostile(
        &mut conn,
        &[
            ("move-it".to_owned(), "schedule:victim:v-1".to_owned()),
            ("plant".to_owned(), "schedule:victim:new-1".to_owned()),
        ],
    );
    let now = now_ms();
    let mut pipe = redis::pipe();
    for (id, command) in [("keep", "schedule:victim:v-2"), ("create", "schedule:victim:fresh")] {
        pipe.hset("hourglass:{relay}:payload", id, command).ignore();
        pipe.zadd("hourglass:{relay}:due", id, now).ignore();
    }
    let _: () = pipe.query(&mut conn).unwrap();

    wait_for("the fresh follow-up to run", LONG, || (stat(&mut conn, "victim", "succeeded") == 1).then_some(()));
    wait_for("the refused runs to die", LONG, || {
        (crate::support::zcard(&mut conn, "hourglass:{chaos}:dead") == 2).then_some(())
    });
    assert_eq!(stat(&mut conn, "relay", "succeeded"), 2, "the granted runs succeed");
    for id in ["move-it", "plant"] {
        let error = error_of(&mut conn, id);
        assert!(error.contains("type \"chaos\" may not schedule \"victim\" tasks"), "{id}: {error}");
    }
    // The waiting tasks were not moved, and their payloads are their own.
    for id in ["v-1", "v-2"] {
        let score: Option<i64> = conn.zscore("hourglass:{victim}:due", id).unwrap();
        assert_eq!(score, Some(due), "{id} was moved");
        let body: Option<String> = conn.hget("hourglass:{victim}:payload", id).unwrap();
        assert_eq!(body.as_deref(), Some("original"), "{id}'s payload was replaced");
    }
    let planted: Option<i64> = conn.zscore("hourglass:{victim}:due", "new-1").unwrap();
    assert_eq!(planted, None, "a refused follow-up was delivered");
    // Each refused run says so once; the kept one is named too.
    let log = host.log();
    assert_eq!(log.matches("follow-up refused").count(), 2, "{log}");
    assert!(log.contains("follow-up not delivered: a victim task with its id is waiting or dead-lettered"), "{log}");

    wait_all_settled(&mut conn, 1000, 2);
    wait_for("the victims at their time", LONG, || (stat(&mut conn, "victim", "succeeded") == 3).then_some(()));
    let log = host.log();
    for id in ["v-1", "v-2", "fresh"] {
        assert_eq!(host.runs_of(&log, "victim", id), 1, "{id}");
    }
}

#[test]
fn guest_text_cannot_forge_log_lines_or_flood_refusals() {
    let redis = RedisServer::start();
    let host = Host::start(
        &redis,
        &[("noop", plugin("noop")), ("chaos", test_plugin("chaos"))],
        "[types.chaos]\nmax_attempts = 1\nallowed_outbound_hosts = [\"https://allowed.example\"]\n",
    );
    let mut conn = redis.client();
    hostile(
        &mut conn,
        &[("forge".to_owned(), "log-forge".to_owned()), ("refused".to_owned(), "refused-flood:20000".to_owned())],
    );
    // A task id is any bytes a client writes: a newline in it must not forge a line either.
    let _: () =
        conn.zadd("hourglass:{noop}:due", "evil\n2030-01-01T00:00:00.000000Z  INFO forged id", now_ms()).unwrap();
    noop_stream(&mut conn, 500, 1000);
    wait_for("the hostile tasks", LONG, || (stat(&mut conn, "chaos", "succeeded") == 2).then_some(()));
    wait_all_settled(&mut conn, 501, 0);
    let log = host.log();
    let forged: Vec<&str> = log.lines().filter(|l| l.starts_with("2030-01-01")).collect();
    assert!(forged.is_empty(), "forged lines: {forged:?}");
    assert!(log.contains("innocent\\n2030-01-01"), "the escaped text is shown");
    let refusals = log.lines().filter(|l| l.contains("outbound HTTP request refused")).count();
    assert!(refusals <= 3, "{refusals} refusals logged for one run");
    assert!(log.contains("further refused outbound requests of this run are not logged"));
}

#[test]
fn shutdown_past_the_grace_period_stops_hung_handlers_and_hands_their_leases_back() {
    let redis = RedisServer::start();
    let mut host = Host::start(
        &redis,
        &[("noop", plugin("noop")), ("chaos", test_plugin("chaos"))],
        "[runner]\ngrace_period = \"1s\"\n[types.chaos]\ntimeout = \"600s\"\n",
    );
    let mut conn = redis.client();
    let tasks: Vec<(String, String)> = (0..50).map(|i| (format!("hung-{i}"), "sleep:600000".to_owned())).collect();
    hostile(&mut conn, &tasks);
    noop_stream(&mut conn, 500, 500);
    wait_for("the hung tasks to run", LONG, || (crate::support::leases(&mut conn, "chaos").len() == 50).then_some(()));
    wait_all_settled(&mut conn, 500, 0);
    host.signal("TERM");
    assert_eq!(host.wait_exit(Duration::from_secs(30)), Some(0));
    let log = host.log();
    assert!(!log.contains("panicked"), "{log}");
    let after_stop = log.split_once("INFO hourglass::host: stopped").map(|(_, rest)| rest.trim()).unwrap_or("missing");
    assert!(after_stop.is_empty(), "lines after \"stopped\": {after_stop}");
    assert!(!log.contains("failed: "), "a stopped run was reported as failed:\n{log}");
    assert_eq!(crate::support::leases(&mut conn, "chaos").len(), 0, "leases not handed back");
    assert_eq!(crate::support::zcard(&mut conn, "hourglass:{chaos}:due"), 50, "the hung tasks are due again");
    assert_eq!(stat(&mut conn, "chaos", "failed"), 0);
}
