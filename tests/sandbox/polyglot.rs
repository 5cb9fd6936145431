//! Handlers written in Python (componentize-py) and JavaScript (on QuickJS-ng through
//! componentize-qjs, the default, and on StarlingMonkey through componentize-js)
//! run as real tasks through a real `hourglass run`, under the default limits.
//!
//! The examples (`plugins/python/echo`, `plugins/js/echo`, the latter built as
//! `js.echo` and `js-sm.echo`) echo every task they
//! acknowledge as a follow-up of type `<type>.out` with the same id and payload,
//! fail their first N attempts on `{"fail_times": N}` and dead-letter on
//! `{"permanent": "..."}`; the tests check each end to end through Redis.
//!
//! The plugins are built by `plugins/build-polyglot.sh` (toolchains installed on
//! first use). They are dropped into a running host rather than present at
//! start, since a cold compile of megabytes of interpreter can outlast the
//! harness' start-up wait; the restart at the end then loads them from the
//! on-disk compile cache.
//!
//! `cargo test -p hourglass --test sandbox -- --ignored --nocapture polyglot::measure`
//! prints the numbers in BENCHMARKS.md ("Polyglot plugins").

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::{Host, RedisServer, RunNow, now_ms, polyglot_plugin, stat, wait_for};
use redis::Commands;

/// Generous: the first run compiles the interpreter (tens of seconds on a busy machine).
const LONG: Duration = Duration::from_secs(600);

/// Retries quickly, dead-letters after 3 attempts; every other limit (timeout, memory_limit, ...) is the default.
/// Each echo may schedule its `<type>.out` follow-ups (as runner.toml's examples do), and
/// fan out to children of its own type under a group whose callback is of type `<type>.done`.
const CONFIG: &str = "[defaults]\nbackoff_base = \"20ms\"\nbackoff_cap = \"100ms\"\nmax_attempts = 3\n\
                      [types.\"py.echo\"]\nmay_schedule = [\"py.echo.out\", \"py.echo\", \"py.echo.done\"]\n\
                      [types.\"js.echo\"]\nmay_schedule = [\"js.echo.out\", \"js.echo\", \"js.echo.done\"]\n\
                      [types.\"js-sm.echo\"]\nmay_schedule = [\"js-sm.echo.out\", \"js-sm.echo\", \"js-sm.echo.done\"]\n";

/// Children of the fan-out task's workflow group.
const KIDS: [&str; 3] = ["kid-0", "kid-1", "kid-2"];

fn schedule(conn: &mut redis::Connection, task_type: &str, id: &[u8], payload: &[u8]) {
    let _: () = redis::pipe()
        .atomic()
        .hset(format!("hourglass:{{{task_type}}}:payload"), id, payload)
        .zadd(format!("hourglass:{{{task_type}}}:due"), id, now_ms())
        .query(conn)
        .unwrap();
}

/// The payload of the follow-up the echo handler scheduled for `id`, once delivered.
fn echoed(conn: &mut redis::Connection, task_type: &str, id: &[u8]) -> Option<Vec<u8>> {
    let out = format!("{task_type}.out");
    let due: Option<f64> = conn.zscore(format!("hourglass:{{{out}}}:due"), id).unwrap();
    due?;
    // No payload entry would mean an empty payload.
    let payload: Option<Vec<u8>> = conn.hget(format!("hourglass:{{{out}}}:payload"), id).unwrap();
    Some(payload.unwrap_or_default())
}

/// Payloads and ids that must come back byte for byte.
fn round_trip_cases() -> Vec<(Vec<u8>, Vec<u8>)> {
    let all_bytes: Vec<u8> = (0..=255u8).collect();
    // 256 KiB of pseudo-random bytes (xorshift), full of invalid UTF-8.
    let mut x: u32 = 0x9E37_79B9;
    let big: Vec<u8> = (0..256 * 1024)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect();
    vec![
        (b"ascii".to_vec(), br#"{"order_id": 42, "amount": 19.9}"#.to_vec()),
        ("ünï-😀".as_bytes().to_vec(), "héllo wörld — 日本語, Ελληνικά, emoji 🎉\u{0}tail".as_bytes().to_vec()),
        (b"bin-\x00\xff\xfe\x80".to_vec(), all_bytes),
        (b"big".to_vec(), big),
        (b"empty".to_vec(), Vec::new()),
        (b"not-utf8".to_vec(), b"\xc3\x28 {\"fail_times\": 5} \xff".to_vec()),
    ]
}

/// Runs every scenario against one language's echo plugin.
fn echo_plugin_end_to_end(task_type: &str) {
    let wasm = polyglot_plugin(task_type);
    let redis = RedisServer::start();
    let mut host = Host::start(&redis, &[], CONFIG);
    let mut conn = redis.client();

    let cases = round_trip_cases();
    for (id, payload) in &cases {
        schedule(&mut conn, task_type, id, payload);
    }
    schedule(&mut conn, task_type, b"flaky", br#"{"fail_times": 2}"#);
    schedule(&mut conn, task_type, b"doomed", r#"{"permanent": "no such order — ø"}"#.as_bytes());
    schedule(&mut conn, task_type, b"crash", r#"{"crash": "boom ✗"}"#.as_bytes());
    let fanout = serde_json::json!({"fanout": {"callback": format!("{task_type}.done"), "group": "g-1",
                                               "type": task_type, "ids": KIDS}});
    schedule(&mut conn, task_type, b"fanout", fanout.to_string().as_bytes());
    let graph = serde_json::json!({"graph": {"home": format!("{task_type}.done"), "id": "gr-1", "nodes": [
        {"name": "a", "type": task_type, "payload": "{}"},
        {"name": "b", "type": task_type, "payload": "{}", "parents": ["a"]}]}});
    schedule(&mut conn, task_type, b"graph", graph.to_string().as_bytes());
    // The tasks wait in Redis until a plugin serves their type.
    host.drop_in(task_type, &wasm);

    // Success, with the payload and id round-tripped byte for byte.
    for (id, payload) in &cases {
        let got = wait_for(&format!("the echo of {}", String::from_utf8_lossy(id)), LONG, || {
            echoed(&mut conn, task_type, id)
        });
        assert!(
            got == *payload,
            "{task_type}: payload of {:?} changed: {} bytes in, {} out",
            id,
            payload.len(),
            got.len()
        );
    }

    // Failure with retry, then success: two failed attempts, two retries, one echo.
    let echo = wait_for("the flaky task to succeed", LONG, || echoed(&mut conn, task_type, b"flaky"));
    assert_eq!(echo, br#"{"fail_times": 2}"#);
    let log = host.log();
    for attempt in 1..=2 {
        let line = format!("failing on purpose (attempt {attempt} of 2 planned failures)");
        assert!(log.contains(&line), "{task_type}: no {line:?} in the log:\n{log}");
    }

    // A permanent failure is dead-lettered at once, with the handler's reason (non-ASCII too).
    wait_for("the doomed task to be dead-lettered", LONG, || {
        conn.zscore::<_, _, Option<f64>>(format!("hourglass:{{{task_type}}}:dead"), "doomed").unwrap()
    });
    let error: String = conn.hget(format!("hourglass:{{{task_type}}}:errors"), "doomed").unwrap();
    assert!(error.contains("no such order — ø"), "{error}");

    // An uncaught exception fails the attempt like a trap; its message reaches the log.
    wait_for("the crashing task to be dead-lettered", LONG, || {
        conn.zscore::<_, _, Option<f64>>(format!("hourglass:{{{task_type}}}:dead"), "crash").unwrap()
    });
    let error: String = conn.hget(format!("hourglass:{{{task_type}}}:errors"), "crash").unwrap();
    eprintln!("{task_type}: an uncaught exception is recorded as: {error}");
    assert!(host.log().contains("boom ✗"), "the exception's message is not in the log:\n{}", host.log());

    // The workflow bindings: the fan-out's group ran its three children, then scheduled its callback once.
    let done = format!("hourglass:{{{task_type}.done}}");
    let summary: Vec<u8> = wait_for("the group's callback", LONG, || {
        let due: Option<f64> = conn.zscore(format!("{done}:due"), "g-1").unwrap();
        due.and_then(|_| conn.hget(format!("{done}:payload"), "g-1").unwrap())
    });
    let summary: serde_json::Value = serde_json::from_slice(&summary).unwrap();
    assert_eq!((summary["added"].as_u64(), summary["succeeded"].as_u64()), (Some(3), Some(3)), "{summary}");
    for kid in KIDS {
        assert_eq!(echoed(&mut conn, task_type, kid.as_bytes()).as_deref(), Some(&b"{}"[..]), "{kid} did not run");
    }
    assert_eq!(stat(&mut conn, &format!("{task_type}.done"), "groups_completed"), 1);
    // The graph the handler declared: its two nodes ran, b after a, and it is done.
    wait_for("the handler's graph to be done", LONG, || {
        let state: Option<String> = conn.hget(format!("{done}:graph:gr-1"), "state").unwrap();
        (state.as_deref() == Some("done")).then_some(())
    });
    let succeeded: Option<i64> = conn.hget(format!("{done}:graph:gr-1"), "succeeded").unwrap();
    assert_eq!(succeeded, Some(2));

    // The round trips, flaky, the fan-out and its three children, the graph and its two nodes.
    wait_for("the counters", LONG, || {
        (stat(&mut conn, task_type, "succeeded") == cases.len() as i64 + 8).then_some(())
    });
    assert_eq!(stat(&mut conn, task_type, "retried"), 2 + 2, "flaky twice, crash twice");
    assert_eq!(stat(&mut conn, task_type, "failed"), 2 + 1 + 3, "flaky, doomed, crash");
    assert_eq!(stat(&mut conn, task_type, "dead"), 2);
    // The handler's own log line reaches the host's log.
    assert!(host.log().contains("echoing 262144 bytes"), "no handler log line:\n{}", host.log());

    // A restart finds the plugin in its folder and loads it from the compile
    // cache (Host::spawn allows 60 s to start), then runs tasks as before.
    host.signal("TERM");
    assert_eq!(host.wait_exit(Duration::from_secs(60)), Some(0));
    host.spawn();
    schedule(&mut conn, task_type, b"after-restart", "again ✓".as_bytes());
    let got = wait_for("a task after the restart", LONG, || echoed(&mut conn, task_type, b"after-restart"));
    assert_eq!(got, "again ✓".as_bytes());
}

/// A Python module global and a JavaScript module variable (`{"remember": ...}`)
/// do not reach the next task with the shipped defaults: each task is a fresh
/// instance. Under `instance_reuse` the same recall finds it, so the probe can fail.
/// A handler of echo plugin `task_type` (granted its `<type>.out` follow-ups), run without Redis.
fn echo_handler(
    component: &hourglass::runtime::Component,
    task_type: &str,
    reuse: u32,
    reset: bool,
) -> hourglass::runtime::Handler {
    let policy = hourglass::config::TypePolicy {
        may_schedule: vec![format!("{task_type}.out").parse().unwrap()],
        instance_reuse: reuse,
        instance_reset: reset,
        ..Default::default()
    };
    hourglass::runtime::Handler::new(component.clone(), task_type, &policy.sandbox(), Arc::new(BTreeMap::new()))
}

/// Task `id` of `task_type` with `payload`, on its first attempt.
fn echo_task(task_type: &str, id: &str, payload: &str) -> hourglass::task::ClaimedTask {
    hourglass::task::ClaimedTask {
        task_type: task_type.parse().unwrap(),
        id: id.as_bytes().to_vec(),
        payload: payload.as_bytes().to_vec(),
        attempt: 1,
        due_ms: 1_700_000_000_000,
        token: 1,
        claim: 1,
    }
}

fn module_state_stays_with_its_task(task_type: &str) {
    let component = crate::runtime::runtime().load(&polyglot_plugin(task_type)).unwrap();
    let handler = |reuse: u32, reset: bool| echo_handler(&component, task_type, reuse, reset);
    let task = |payload: &str| echo_task(task_type, "probe", payload);
    // The default (a kept instance reset after each task), then a new instance per task.
    for reset in [true, false] {
        let isolated = handler(0, reset);
        for round in 0..3 {
            let remember = format!(r#"{{"remember": "secret-{round}"}}"#);
            assert_eq!(isolated.run_now(&task(&remember)).result, Ok(()));
            let recall = isolated.run_now(&task(r#"{"recall": true}"#));
            assert_eq!(
                recall.result,
                Ok(()),
                "{task_type} (instance_reset = {reset}): a task recalled an earlier task's module state"
            );
        }
    }
    assert!(component.reset_refused().is_none(), "{task_type}: {:?}", component.reset_refused());
    let kept = handler(8, false);
    assert_eq!(kept.run_now(&task(r#"{"remember": "kept"}"#)).result, Ok(()));
    match kept.run_now(&task(r#"{"recall": true}"#)).result {
        Err(hourglass::runtime::Failure::Permanent(e)) => assert!(e.contains("kept"), "{e}"),
        other => panic!("{task_type}: the recall missed state kept on purpose: {other:?}"),
    }
}

/// `{"progress": N}` reports through the generated bindings; the run's last
/// report comes back with its result (a retry keeps it with the task).
fn progress_reaches_the_host(task_type: &str) {
    let component = crate::runtime::runtime().load(&polyglot_plugin(task_type)).unwrap();
    let handler = echo_handler(&component, task_type, 0, true);
    let task = |payload: &str| echo_task(task_type, "watched", payload);
    let run = handler.run_now(&task(r#"{"progress": 35, "fail_times": 1}"#));
    assert!(run.result.is_err(), "{task_type}: the first attempt should fail");
    let progress = run.progress.unwrap_or_else(|| panic!("{task_type}: no progress came back"));
    assert_eq!(progress.percent, 35);
    let detail: serde_json::Value = serde_json::from_str(&progress.detail).unwrap();
    assert_eq!(detail, serde_json::json!({"echo": 35}));
    // A percentage over 100 is refused, and the handler dead-letters on it.
    match handler.run_now(&task(r#"{"progress": 120}"#)).result {
        Err(hourglass::runtime::Failure::Permanent(e)) => assert!(e.contains("progress of 120% is over 100"), "{e}"),
        other => panic!("{task_type}: {other:?}"),
    }
}

#[test]
fn python_progress_reaches_the_host() {
    progress_reaches_the_host("py.echo");
}

#[test]
fn javascript_progress_reaches_the_host() {
    progress_reaches_the_host("js.echo");
}

#[test]
fn javascript_progress_reaches_the_host_on_starlingmonkey() {
    progress_reaches_the_host("js-sm.echo");
}

#[test]
fn python_module_globals_do_not_reach_the_next_task() {
    module_state_stays_with_its_task("py.echo");
}

#[test]
fn javascript_module_variables_do_not_reach_the_next_task() {
    module_state_stays_with_its_task("js.echo");
}

#[test]
fn javascript_module_variables_do_not_reach_the_next_task_on_starlingmonkey() {
    module_state_stays_with_its_task("js-sm.echo");
}

#[test]
fn python_handler_succeeds_retries_dead_letters_and_round_trips_payloads() {
    echo_plugin_end_to_end("py.echo");
}

#[test]
fn javascript_handler_succeeds_retries_dead_letters_and_round_trips_payloads() {
    echo_plugin_end_to_end("js.echo");
}

#[test]
fn javascript_handler_succeeds_retries_dead_letters_and_round_trips_payloads_on_starlingmonkey() {
    echo_plugin_end_to_end("js-sm.echo");
}

// ---------------------------------------------------------------------------
// Measurements for BENCHMARKS.md (ignored: numbers, not assertions).

mod measure {
    use std::path::Path;

    use super::*;
    use bytesize::ByteSize;
    use hourglass::config::TypePolicy;
    use hourglass::runtime::{Handler, Runtime, RuntimeOptions};
    use hourglass::task::ClaimedTask;

    fn runtime(cache: &Path) -> Runtime {
        // A 64-instance pool (the runner sizes it by runner.concurrency) and the default 64 MiB memory_limit.
        Runtime::new(RuntimeOptions {
            cache_dir: Some(cache.to_owned()),
            max_instances: 64,
            max_memory: ByteSize::mib(64).as_u64(),
            ..RuntimeOptions::new(crate::support::compiler())
        })
        .unwrap()
    }

    fn task(task_type: &str, payload: &[u8]) -> ClaimedTask {
        ClaimedTask {
            task_type: task_type.parse().unwrap(),
            id: b"bench".to_vec(),
            payload: payload.to_vec(),
            attempt: 1,
            due_ms: 1_700_000_000_000,
            token: 1,
            claim: 1,
        }
    }

    fn handler(rt: &Runtime, path: &Path, task_type: &str, memory: ByteSize) -> Handler {
        let component = rt.load(path).unwrap();
        let policy = TypePolicy {
            memory_limit: memory,
            may_schedule: vec![format!("{task_type}.out").parse().unwrap()],
            ..TypePolicy::default()
        };
        Handler::new(component, task_type, &policy.sandbox(), Arc::new(BTreeMap::new()))
    }

    /// The smallest memory_limit (MiB) under which one task succeeds.
    fn min_memory(rt: &Runtime, path: &Path, task_type: &str, payload: &[u8]) -> u64 {
        let (mut lo, mut hi) = (1u64, 64u64); // lo fails (or untested), hi succeeds
        assert!(handler(rt, path, task_type, ByteSize::mib(hi)).run_now(&task(task_type, payload)).result.is_ok());
        while hi - lo > 1 {
            let mid = (lo + hi) / 2;
            let ok = handler(rt, path, task_type, ByteSize::mib(mid)).run_now(&task(task_type, payload)).result.is_ok();
            if ok { hi = mid } else { lo = mid }
        }
        hi
    }

    #[test]
    #[ignore = "benchmark: prints the numbers in BENCHMARKS.md"]
    fn measure() {
        let cases: Vec<(&str, std::path::PathBuf, &[u8])> = vec![
            ("noop", crate::support::plugin("noop"), b""),
            ("flaky", crate::support::plugin("flaky"), br#"{"fail_times": 0}"#),
            ("py.echo", polyglot_plugin("py.echo"), br#"{"fail_times": 0}"#),
            ("js.echo", polyglot_plugin("js.echo"), br#"{"fail_times": 0}"#),
            ("js-sm.echo", polyglot_plugin("js-sm.echo"), br#"{"fail_times": 0}"#),
        ];
        let runs: u32 = std::env::var("POLYGLOT_RUNS").ok().and_then(|s| s.parse().ok()).unwrap_or(200);
        let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        println!("load average before: {}", load.trim());
        println!(
            "| plugin | .wasm size | compile, cold | load from cache | instantiate + call (mean of {runs}) | min memory_limit |"
        );
        println!("|---|---|---|---|---|---|");
        for (task_type, path, payload) in cases {
            let size = std::fs::metadata(&path).unwrap().len();
            let cache = tempfile::tempdir().unwrap();
            let t = Instant::now();
            runtime(cache.path()).load(&path).unwrap();
            let cold = t.elapsed();
            // A new engine on the same cache folder: what a restarted host does.
            let rt = runtime(cache.path());
            let t = Instant::now();
            let component = rt.load(&path).unwrap();
            let cached = t.elapsed();
            let h = Handler::new(component, task_type, &TypePolicy::default().sandbox(), Arc::new(BTreeMap::new()));
            let task = task(task_type, payload);
            assert!(h.run_now(&task).result.is_ok(), "{task_type} failed");
            let t = Instant::now();
            for _ in 0..runs {
                assert!(h.run_now(&task).result.is_ok());
            }
            let per_task = t.elapsed() / runs;
            let mem = min_memory(&rt, &path, task_type, payload);
            println!(
                "| {task_type} | {} | {:.2} s | {:.0} ms | {:.2} ms | {mem} MiB |",
                ByteSize::b(size),
                cold.as_secs_f64(),
                cached.as_secs_f64() * 1e3,
                per_task.as_secs_f64() * 1e3
            );
        }
        let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        println!("load average after: {}", load.trim());
    }
}
