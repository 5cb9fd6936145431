//! The wasmtime sandbox against real compiled plugins: outcomes, crashes, limits, isolation, logs.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crate::support::{RunNow, capture_logs};
use bytesize::ByteSize;
use hourglass::config::TypePolicy;
use hourglass::runtime::{Component, Failure, Handler, Runtime, RuntimeOptions, TaskRun};
use hourglass::task::ClaimedTask;

/// One runtime for most tests, as in the host: many handlers, one engine (isolation.rs shares it).
pub(crate) fn runtime() -> &'static Runtime {
    static RT: OnceLock<Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        Runtime::new(RuntimeOptions {
            cache_dir: Some(crate::support::workspace_root().join("target/hourglass-test-cache")),
            max_instances: 64,
            max_memory: ByteSize::mib(64).as_u64(),
            ..RuntimeOptions::new(crate::support::compiler())
        })
        .expect("runtime")
    })
}

pub(crate) fn chaos() -> Component {
    static C: OnceLock<Component> = OnceLock::new();
    C.get_or_init(|| runtime().load(&crate::support::test_plugin("chaos")).expect("load chaos")).clone()
}

/// The chaos tests' policy: follow-ups may go to `device.alert` and `noop` (create-only).
fn policy(timeout: Duration, memory: ByteSize) -> TypePolicy {
    TypePolicy {
        timeout,
        memory_limit: memory,
        may_schedule: vec!["device.alert".parse().unwrap(), "noop".parse().unwrap()],
        ..TypePolicy::default()
    }
}

fn task(task_type: &str, id: &[u8], payload: &str) -> ClaimedTask {
    ClaimedTask {
        task_type: task_type.parse().unwrap(),
        id: id.to_vec(),
        payload: payload.as_bytes().to_vec(),
        attempt: 1,
        due_ms: 1_700_000_000_000,
        token: 1,
        claim: 1,
    }
}

fn handler_with(component: Component, policy: &TypePolicy, config: &[(&str, &str)]) -> Handler {
    let config: BTreeMap<String, String> = config.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    Handler::new(component, "chaos", &policy.sandbox(), Arc::new(config))
}

/// Runs chaos with `payload` under a 10s deadline and 64 MiB.
fn run_chaos(payload: &str) -> TaskRun {
    let h = handler_with(chaos(), &policy(Duration::from_secs(10), ByteSize::mib(64)), &[]);
    h.run_now(&task("chaos", b"t-1", payload))
}

fn error_of(run: &TaskRun) -> String {
    match &run.result {
        Err(Failure::Error(m)) => {
            eprintln!("error: {m}");
            m.clone()
        }
        other => panic!("expected Failure::Error, got {other:?}"),
    }
}

#[test]
fn noop_succeeds() {
    let component = runtime().load(&crate::support::plugin("noop")).unwrap();
    assert_eq!(component.hash().len(), 12);
    assert_eq!(component.path(), crate::support::plugin("noop"));
    let h = Handler::new(component, "noop", &TypePolicy::default().sandbox(), Arc::default());
    let run = h.run_now(&task("noop", b"n-1", ""));
    assert_eq!(run.result, Ok(()));
    assert!(run.followups.is_empty());
}

#[test]
fn returned_failures_map_one_to_one() {
    assert_eq!(run_chaos("ok").result, Ok(()));
    assert_eq!(run_chaos("retry-after:1500").result, Err(Failure::RetryAfter(Duration::from_millis(1500))));
    assert_eq!(run_chaos("permanent:bad order").result, Err(Failure::Permanent("bad order".into())));
    assert_eq!(run_chaos("error:try later").result, Err(Failure::Error("try later".into())));
}

#[test]
fn task_fields_reach_the_guest() {
    let msg = error_of(&run_chaos("task"));
    assert_eq!(msg, "task type=chaos id=\"t-1\" attempt=1 due=1700000000000");
}

#[test]
fn trap_is_an_error_and_the_runtime_keeps_working() {
    let msg = error_of(&run_chaos("trap"));
    assert!(msg.contains("unreachable") || msg.contains("abort"), "{msg}");
    assert!(!msg.contains('\n'), "{msg}");
    assert_eq!(run_chaos("ok").result, Ok(()));
}

#[test]
fn panic_is_an_error_with_its_message() {
    let msg = error_of(&run_chaos("panic:boom"));
    assert!(msg.contains("panicked") && msg.contains("chaos panic: boom"), "{msg}");
    assert!(!msg.contains('\n'), "{msg}");
    assert_eq!(run_chaos("ok").result, Ok(()));
}

#[test]
fn infinite_loop_is_stopped_at_the_deadline() {
    let h = handler_with(chaos(), &policy(Duration::from_secs(1), ByteSize::mib(64)), &[]);
    let started = Instant::now();
    let run = h.run_now(&task("chaos", b"t-loop", "loop"));
    let took = started.elapsed();
    let msg = error_of(&run);
    assert_eq!(msg, "deadline of 1s exceeded");
    assert!(took >= Duration::from_millis(900), "stopped too early: {took:?}");
    assert!(took < Duration::from_secs(10), "stopped too late: {took:?}");
    assert_eq!(run_chaos("ok").result, Ok(()));
}

#[test]
fn memory_bomb_is_stopped_at_the_cap() {
    let h = handler_with(chaos(), &policy(Duration::from_secs(10), ByteSize::mib(16)), &[]);
    let msg = error_of(&h.run_now(&task("chaos", b"t-mem", "membomb")));
    assert!(msg.contains("memory limit of 16.0 MiB exceeded"), "{msg}");
    assert!(!msg.contains('\n'), "{msg}");
    assert_eq!(run_chaos("ok").result, Ok(()));
}

#[test]
fn stack_overflow_is_an_error() {
    let msg = error_of(&run_chaos("stackoverflow"));
    assert_eq!(msg, "stack overflow (wasm trap: call stack exhausted)");
    assert_eq!(run_chaos("ok").result, Ok(()));
}

#[test]
fn sandbox_grants_no_files_env_or_network() {
    let msg = error_of(&run_chaos("readfile"));
    assert!(msg.starts_with("readfile failed"), "{msg}");
    let msg = error_of(&run_chaos("env"));
    assert_eq!(msg, "env: vars=0 path=false args=0");
    let msg = error_of(&run_chaos("socket"));
    assert!(msg.starts_with("socket failed"), "{msg}");
}

#[test]
fn stdout_and_stderr_become_log_lines() {
    let (run, logs) = capture_logs(|| run_chaos("stdout"));
    assert_eq!(run.result, Ok(()));
    for needle in ["hello from stdout", "second line", "hello from stderr", "stream=\"stdout\"", "stream=\"stderr\""] {
        assert!(logs.contains(needle), "{needle} missing in:\n{logs}");
    }
    // Over the cap: truncated and reported, and the handler still succeeds.
    let (run, logs) = capture_logs(|| run_chaos("bigstdout"));
    assert_eq!(run.result, Ok(()));
    assert!(logs.contains("was dropped"), "{}", &logs[logs.len().saturating_sub(500)..]);
}

#[test]
fn guest_logs_keep_level_and_fields() {
    let h = handler_with(chaos(), &policy(Duration::from_secs(10), ByteSize::mib(64)), &[]);
    let mut t = task("chaos", b"order-42", "log");
    t.attempt = 3;
    let (run, logs) = capture_logs(|| h.run_now(&t));
    assert_eq!(run.result, Ok(()));
    for level in ["TRACE", "DEBUG", "INFO", "WARN", "ERROR"] {
        let line = logs
            .lines()
            .find(|l| l.contains(&format!("chaos log at {}", level.to_lowercase())))
            .unwrap_or_else(|| panic!("no {level} line in:\n{logs}"));
        assert!(line.contains(level), "{line}");
        assert!(line.contains("hourglass::plugin"), "{line}");
        assert!(line.contains("plugin=chaos"), "{line}");
        assert!(line.contains("task_id=order-42"), "{line}");
        assert!(line.contains("attempt=3"), "{line}");
    }
}

#[test]
fn followups_are_kept_only_on_success() {
    let run = run_chaos("schedule:device.alert:dev-7");
    assert_eq!(run.result, Ok(()));
    assert_eq!(run.followups.len(), 1);
    let f = &run.followups[0];
    assert_eq!(f.task_type.as_str(), "device.alert");
    assert_eq!(f.id, b"dev-7");
    assert_eq!(f.payload, b"from chaos");
    assert!(f.due_ms > 1_700_000_000_000);

    let run = run_chaos("schedule-then-fail");
    assert_eq!(run.result, Err(Failure::Error("failed after scheduling".into())));
    assert!(run.followups.is_empty());
}

#[test]
fn followups_go_only_to_the_types_runner_toml_grants() {
    let granted = |schedule: &[&str], replace: &[&str]| TypePolicy {
        may_schedule: schedule.iter().map(|t| t.parse().unwrap()).collect(),
        may_replace: replace.iter().map(|t| t.parse().unwrap()).collect(),
        ..TypePolicy::default()
    };
    let run = |policy: &TypePolicy, payload: &str| {
        let h = handler_with(chaos(), policy, &[]);
        capture_logs(|| h.run_now(&task("chaos", b"t-1", payload)))
    };

    // Nothing granted: refused, the run fails (chaos passes the error on), one log line says why.
    let (denied, logs) = run(&granted(&[], &[]), "schedule:order.timeout:o-1");
    let msg = error_of(&denied);
    assert!(msg.contains("type \"chaos\" may not schedule \"order.timeout\" tasks"), "{msg}");
    assert!(msg.contains("may_schedule in [types.\"chaos\"]"), "{msg}");
    assert!(denied.followups.is_empty());
    assert_eq!(logs.matches("follow-up refused").count(), 1, "{logs}");

    // Its own type is no exception: it is granted only when listed.
    let (own, _) = run(&granted(&["noop"], &[]), "schedule:chaos:again");
    assert!(error_of(&own).contains("may not schedule \"chaos\""), "{:?}", own.result);

    // Granted: create-only, unless may_replace lists the type too.
    let (created, logs) = run(&granted(&["order.timeout"], &[]), "schedule:order.timeout:o-1");
    assert_eq!(created.result, Ok(()));
    assert!(!created.followups[0].replace);
    assert!(!logs.contains("follow-up refused"), "{logs}");
    let (replacing, _) = run(&granted(&[], &["order.timeout"]), "schedule:order.timeout:o-1");
    assert_eq!(replacing.result, Ok(()), "may_replace implies may_schedule");
    assert!(replacing.followups[0].replace);
}

#[test]
fn followups_are_validated() {
    let msg = error_of(&run_chaos("schedule-invalid"));
    assert!(msg.contains("invalid task type"), "{msg}");
    let msg = error_of(&run_chaos("schedule-many"));
    assert!(msg.contains("follow-up 1000 refused") && msg.contains("at most 1000"), "{msg}");
}

#[test]
fn device_offline_schedules_an_alert() {
    let component = runtime().load(&crate::support::plugin("device.offline")).unwrap();
    let may_alert = TypePolicy { may_schedule: vec!["device.alert".parse().unwrap()], ..TypePolicy::default() };
    let h = Handler::new(component, "device.offline", &may_alert.sandbox(), Arc::default());
    let (run, logs) = capture_logs(|| h.run_now(&task("device.offline", b"sensor-9", "")));
    assert_eq!(run.result, Ok(()));
    assert!(logs.contains("WARN") && logs.contains("sensor-9"), "{logs}");
    assert_eq!(run.followups.len(), 1);
    assert_eq!(run.followups[0].task_type.as_str(), "device.alert");
    assert_eq!(run.followups[0].id, b"sensor-9");

    let alert = runtime().load(&crate::support::plugin("device.alert")).unwrap();
    let h = Handler::new(alert, "device.alert", &TypePolicy::default().sandbox(), Arc::default());
    let mut t = task("device.alert", b"sensor-9", "");
    t.payload = run.followups[0].payload.clone();
    assert_eq!(h.run_now(&t).result, Ok(()));
}

#[test]
fn order_timeout_and_flaky_examples() {
    let component = runtime().load(&crate::support::plugin("order.timeout")).unwrap();
    let h = Handler::new(component, "order.timeout", &TypePolicy::default().sandbox(), Arc::default());
    let (run, logs) = capture_logs(|| h.run_now(&task("order.timeout", b"o-1", r#"{"order_id":"A17","amount":12.5}"#)));
    assert_eq!(run.result, Ok(()));
    assert!(logs.contains("A17") && logs.contains("cancelled"), "{logs}");
    match h.run_now(&task("order.timeout", b"o-2", "not json")).result {
        Err(Failure::Permanent(m)) => assert!(m.contains("invalid JSON"), "{m}"),
        other => panic!("{other:?}"),
    }

    let component = runtime().load(&crate::support::plugin("flaky")).unwrap();
    let h = Handler::new(component, "flaky", &TypePolicy::default().sandbox(), Arc::default());
    let mut t = task("flaky", b"f-1", r#"{"fail_times":2}"#);
    for attempt in 1..=2 {
        t.attempt = attempt;
        assert!(matches!(h.run_now(&t).result, Err(Failure::Error(_))));
    }
    t.attempt = 3;
    assert_eq!(h.run_now(&t).result, Ok(()));
}

#[test]
fn config_values_reach_the_plugin() {
    let h = handler_with(chaos(), &TypePolicy::default(), &[("webhook", "http://example.test/hook")]);
    let msg = error_of(&h.run_now(&task("chaos", b"c", "config:webhook")));
    assert_eq!(msg, r#"config webhook=Some("http://example.test/hook")"#);
    let msg = error_of(&h.run_now(&task("chaos", b"c", "config:missing")));
    assert_eq!(msg, "config missing=None");
}

#[test]
fn oversized_payload_fails_permanently_without_running() {
    let p = TypePolicy { max_payload: ByteSize::b(8), ..TypePolicy::default() };
    let h = handler_with(chaos(), &p, &[]);
    match h.run_now(&task("chaos", b"big", "ok but far too long")).result {
        Err(Failure::Permanent(m)) => assert!(m.contains("max_payload"), "{m}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn invalid_files_are_rejected_with_one_clear_line() {
    let dir = tempfile::tempdir().unwrap();
    let random = dir.path().join("random.wasm");
    std::fs::write(&random, b"this is not wasm at all, just some bytes").unwrap();
    let err = format!("{:#}", runtime().load(&random).unwrap_err());
    assert!(err.starts_with(&random.display().to_string()), "{err}");
    assert!(err.contains("not a WebAssembly file"), "{err}");
    assert!(!err.contains('\n'), "{err}");

    // A core module (the header of one), e.g. built for wasm32-unknown-unknown.
    let core = dir.path().join("core.wasm");
    std::fs::write(&core, b"\0asm\x01\0\0\0").unwrap();
    let err = format!("{:#}", runtime().load(&core).unwrap_err());
    assert!(err.contains("not a WebAssembly component") && err.contains("wasm32-wasip2"), "{err}");

    // A component header with garbage after it.
    let broken = dir.path().join("broken.wasm");
    std::fs::write(&broken, b"\0asm\x0d\0\x01\0garbage").unwrap();
    let err = format!("{:#}", runtime().load(&broken).unwrap_err());
    assert!(err.contains("invalid WebAssembly component"), "{err}");
    assert!(!err.contains('\n'), "{err}");
}

#[test]
fn wrong_world_is_rejected_naming_what_it_is() {
    let path = crate::support::test_plugin("wrong-world");
    let err = format!("{:#}", runtime().load(&path).unwrap_err());
    assert!(err.starts_with(&path.display().to_string()), "{err}");
    assert!(err.contains("does not export `handle` of hourglass:plugin/task-handler@0.1.0"), "{err}");
    assert!(err.contains("wasi:cli/command") && err.contains("wasi:cli/run"), "{err}");
    assert!(!err.contains('\n'), "{err}");
}

#[test]
fn check_describes_good_and_wrong_plugins() {
    let good = runtime().check(&crate::support::test_plugin("chaos")).unwrap();
    assert!(good.fits());
    let text = good.to_string();
    assert!(text.contains("world:   hourglass:plugin/task-handler@0.1.0"), "{text}");
    assert!(text.contains("hourglass:plugin/log@0.1.0: instance { log }"), "{text}");
    assert!(text.contains("hourglass:plugin/schedule@0.1.0"), "{text}");
    assert!(text.contains("handle: func(task: record { id: list<u8>"), "{text}");
    assert!(text.contains("OK, fits"), "{text}");

    let bad = runtime().check(&crate::support::test_plugin("wrong-world")).unwrap();
    assert!(!bad.fits());
    let text = bad.to_string();
    eprintln!("{good}\n{bad}");
    assert!(text.contains("wasi:cli/command"), "{text}");
    assert!(text.contains("wasi:cli/run@"), "{text}");
    assert!(text.contains("does NOT fit") && text.contains("does not export `handle`"), "{text}");
}

#[test]
fn a_second_runtime_loads_from_the_shared_cache() {
    let cache: PathBuf = tempfile::tempdir().unwrap().keep();
    let opts = RuntimeOptions {
        cache_dir: Some(cache.clone()),
        max_instances: 4,
        ..RuntimeOptions::new(crate::support::compiler())
    };
    let first = Runtime::new(opts.clone()).unwrap();
    let started = Instant::now();
    first.load(&crate::support::test_plugin("chaos")).unwrap();
    let cold = started.elapsed();
    drop(first);
    // wasmtime writes cache entries as it compiles; the folder is not empty now.
    let entries = walk(&cache);
    assert!(entries > 0, "cache folder is empty");

    let second = Runtime::new(opts).unwrap();
    let started = Instant::now();
    let component = second.load(&crate::support::test_plugin("chaos")).unwrap();
    let warm = started.elapsed();
    let h = Handler::new(component, "chaos", &TypePolicy::default().sandbox(), Arc::default());
    assert_eq!(h.run_now(&task("chaos", b"x", "ok")).result, Ok(()));
    eprintln!("chaos.wasm: cold load {cold:?}, cached load {warm:?}");
    let _ = std::fs::remove_dir_all(&cache);
}

fn walk(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir)
        .map(|rd| rd.flatten().map(|e| if e.path().is_dir() { walk(&e.path()) } else { 1 }).sum())
        .unwrap_or(0)
}

#[test]
fn many_tasks_in_parallel_share_one_runtime() {
    let h = Arc::new(handler_with(chaos(), &TypePolicy::default(), &[]));
    let threads: Vec<_> = (0..8)
        .map(|i| {
            let h = h.clone();
            std::thread::spawn(move || {
                for j in 0..10 {
                    let payload = if (i + j) % 3 == 0 { "trap" } else { "ok" };
                    let run = h.run_now(&task("chaos", format!("p-{i}-{j}").as_bytes(), payload));
                    assert_eq!(run.result.is_ok(), payload == "ok", "{:?}", run.result);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

/// What compiling in a worker process costs against compiling in process,
/// for BENCHMARKS.md (ignored: it prints numbers, it asserts nothing about
/// time): `cargo test --release -p hourglass --test sandbox -- --ignored --nocapture runtime::measure_compile`.
#[test]
#[ignore]
fn measure_compile_in_a_worker_against_in_process() {
    let plugins = [
        crate::support::plugin("noop"),
        crate::support::test_plugin("chaos"),
        crate::support::polyglot_plugin("js.echo"),
    ];
    for compiler in [hourglass::runtime::Compiler::InProcess, crate::support::compiler()] {
        let label = if compiler == hourglass::runtime::Compiler::InProcess { "in process" } else { "worker" };
        for path in &plugins {
            let rounds = if path.ends_with("js.echo.wasm") { 3 } else { 10 };
            let mut cold = Vec::new();
            let mut hit = Vec::new();
            for _ in 0..rounds {
                let cache = tempfile::tempdir().unwrap();
                let rt = Runtime::new(RuntimeOptions {
                    cache_dir: Some(cache.path().to_owned()),
                    max_instances: 4,
                    ..RuntimeOptions::new(compiler.clone())
                })
                .unwrap();
                let started = Instant::now();
                rt.load(path).unwrap();
                cold.push(started.elapsed());
                let started = Instant::now();
                rt.load(path).unwrap();
                hit.push(started.elapsed());
            }
            cold.sort();
            hit.sort();
            let name = path.file_name().unwrap().to_string_lossy();
            eprintln!(
                "{label:>10} {name:<14} compile median {:>8.1} ms (min {:.1}), cache hit median {:.2} ms",
                cold[rounds / 2].as_secs_f64() * 1e3,
                cold[0].as_secs_f64() * 1e3,
                hit[rounds / 2].as_secs_f64() * 1e3
            );
        }
    }
}
