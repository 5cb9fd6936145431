//! The warm-up call before a kept instance's checkpoint: it is a task with no data (attempt 0), nothing it does leaves the sandbox, and a warm-up that misbehaves costs no task anything.
//!
//! The chaos plugin runs the command in its config value `warm-up` when its
//! attempt is 0, so each test makes the warm-up do what an attacker (or a
//! handler that expects a real payload) would. The same commands as a real
//! task's payload show that each check can fail.

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use crate::runtime::runtime;
use crate::support::{RunNow, capture_logs, test_plugin};
use bytesize::ByteSize;
use hourglass::config::TypePolicy;
use hourglass::runtime::{Component, Handler};
use hourglass::task::ClaimedTask;

/// Chaos loaded anew: whether its warm-up is usable is a property of the
/// loaded component, which the other tests' shared one must not inherit.
fn chaos() -> Component {
    runtime().load(&test_plugin("chaos")).expect("load chaos")
}

/// A handler of `component` (instances reset, warm-up on: the defaults) whose warm-up runs `warm_up`.
fn handler(component: &Component, warm_up: &str, policy: TypePolicy) -> Handler {
    let config = BTreeMap::from([("warm-up".to_owned(), warm_up.to_owned())]);
    Handler::new(component.clone(), "chaos", &policy.sandbox(), Arc::new(config))
}

fn policy(allowed: Vec<String>) -> TypePolicy {
    TypePolicy {
        timeout: Duration::from_secs(5),
        memory_limit: ByteSize::mib(32),
        may_schedule: vec!["noop".parse().unwrap()],
        allowed_outbound_hosts: allowed.try_into().unwrap(),
        http_timeout: Duration::from_millis(300),
        ..TypePolicy::default()
    }
}

fn task(payload: &str) -> ClaimedTask {
    ClaimedTask {
        task_type: "chaos".parse().unwrap(),
        id: b"t-1".to_vec(),
        payload: payload.as_bytes().to_vec(),
        attempt: 1,
        due_ms: 1_700_000_000_000,
        token: 1,
        claim: 1,
    }
}

#[test]
fn nothing_a_warm_up_call_does_leaves_the_sandbox() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let url = format!("http://127.0.0.1:{}", listener.local_addr().unwrap().port());
    let allowed = vec![url.clone()];
    for warm_up in ["schedule:noop:from-warm-up", "log", "stdout", &format!("http-get:{url}/warm-up")] {
        let component = chaos();
        let h = handler(&component, warm_up, policy(allowed.clone()));
        let (run, logs) = capture_logs(|| h.run_now(&task("ok")));
        assert_eq!(run.result, Ok(()), "{warm_up}");
        assert!(run.followups.is_empty(), "{warm_up}: the warm-up's follow-up reached a task: {:?}", run.followups);
        assert!(!logs.contains("chaos log") && !logs.contains("hello from"), "{warm_up}: the warm-up logged:\n{logs}");
        if warm_up == "stdout" {
            // Rust's std keeps its stdout stream open once used: a handle the
            // checkpoint cannot record, so this warm-up is (rightly) not used.
            let why = component.warm_up_refused().unwrap_or_default();
            assert!(why.contains("handles"), "{warm_up}: {why:?}");
        } else {
            assert!(component.warm_up_refused().is_none(), "{warm_up}: {:?}", component.warm_up_refused());
            assert!(h.instances().contains("warm-up"), "{warm_up}: {}", h.instances());
        }
        assert!(listener.accept().is_err(), "{warm_up}: the warm-up made a connection");
    }

    // The same commands in a real task do all of it: each check above can fail.
    let component = chaos();
    let h = handler(&component, "", policy(allowed));
    let run = h.run_now(&task("schedule:noop:from-task"));
    assert_eq!(run.followups.len(), 1, "{run:?}");
    let (_, logs) = capture_logs(|| (h.run_now(&task("log")), h.run_now(&task("stdout"))));
    assert!(logs.contains("chaos log at info") && logs.contains("hello from stdout"), "{logs}");
    let run = h.run_now(&task(&format!("http-get:{url}/task")));
    assert!(run.result.is_err(), "nobody answers: {run:?}");
    assert!(listener.accept().is_ok(), "the task's request did not connect");
}

#[test]
fn a_warm_up_that_fails_costs_no_task_anything() {
    for warm_up in ["trap", "panic:no payload", "loop", "membomb", "stackoverflow"] {
        let component = chaos();
        let h = handler(&component, warm_up, policy(Vec::new()));
        for _ in 0..3 {
            assert_eq!(h.run_now(&task("ok")).result, Ok(()), "{warm_up}: a task paid for its warm-up");
        }
        let why = component.warm_up_refused().unwrap_or_else(|| panic!("{warm_up}: the failed warm-up was used"));
        assert!(!why.is_empty() && !why.contains('\n'), "{warm_up}: {why}");
        assert!(component.reset_refused().is_none(), "{warm_up}: its instances are still reset");
        assert_eq!(h.instances(), "a kept instance reset after each task", "{warm_up}");
    }
}

#[test]
fn a_warm_up_that_returns_a_failure_is_still_used() {
    // A handler that expects a payload fails on the warm-up's empty one: the
    // state it returned in is as good as any.
    let component = chaos();
    let h = handler(&component, "error:no payload", policy(Vec::new()));
    for _ in 0..3 {
        assert_eq!(h.run_now(&task("ok")).result, Ok(()));
    }
    assert!(component.warm_up_refused().is_none(), "{:?}", component.warm_up_refused());
    assert!(h.instances().contains("warm-up"), "{}", h.instances());
}

#[test]
fn instance_warm_up_false_checkpoints_right_after_instantiation() {
    let component = chaos();
    let policy = TypePolicy { instance_warm_up: false, ..policy(Vec::new()) };
    let h = handler(&component, "trap", policy);
    assert_eq!(h.run_now(&task("ok")).result, Ok(()));
    assert!(component.warm_up_refused().is_none(), "no warm-up call was made, so none failed");
    assert_eq!(h.instances(), "a kept instance reset after each task");
}
