use std::time::Duration;

use super::*;
use crate::pipeline::fakes::{ByName, Scripted, policy};
use crate::pipeline::state::SettleQueue;
use crate::store::Extended;
use crate::task::{FollowUp, Lease};

fn task(attempt: u32) -> ClaimedTask {
    ClaimedTask {
        task_type: "t".parse().unwrap(),
        id: b"id".to_vec(),
        payload: Vec::new(),
        attempt,
        due_ms: 0,
        token: 1,
        claim: 1,
    }
}

fn decided(attempt: u32, max_attempts: u32, result: Result<(), Failure>) -> Outcome {
    decide(&policy(max_attempts), &task(attempt), TaskRun::returned(result), 0)
}

#[test]
fn success_is_an_ack_with_its_follow_ups() {
    let followup = FollowUp {
        task_type: "u".parse().unwrap(),
        id: b"next".to_vec(),
        payload: Vec::new(),
        due_ms: 0,
        replace: false,
    };
    let run = TaskRun { followups: vec![followup.clone()], ..TaskRun::returned(Ok(())) };
    let outcome = decide(&policy(3), &task(1), run, 0);
    assert_eq!(outcome, Outcome::Ack { followups: vec![followup], groups: Vec::new(), graphs: Vec::new() });
}

#[test]
fn a_retry_keeps_the_runs_last_progress_and_an_ack_drops_it() {
    let progress = Some(crate::task::Progress { percent: 60, detail: r#"{"rows":6}"#.into() });
    let failed = TaskRun { progress: progress.clone(), ..TaskRun::returned(Err(Failure::Error("boom".into()))) };
    let Outcome::Retry { progress: kept, .. } = decide(&policy(3), &task(1), failed, 0) else { panic!("retried") };
    assert_eq!(kept, progress);
    let acked = TaskRun { progress, ..TaskRun::returned(Ok(())) };
    assert!(matches!(decide(&policy(3), &task(1), acked, 0), Outcome::Ack { .. }));
}

#[test]
fn a_failure_retries_with_capped_backoff_until_the_last_attempt() {
    for attempt in 1..5 {
        let Outcome::Retry { delay, error, .. } = decided(attempt, 5, Err(Failure::Error("boom".into()))) else {
            panic!("attempt {attempt} of 5 is retried");
        };
        assert_eq!(error, "boom");
        let ceiling = Duration::from_secs(1 << (attempt - 1)).min(Duration::from_secs(60));
        assert!(delay >= ceiling / 2 && delay <= ceiling, "attempt {attempt}: {delay:?} outside {ceiling:?}/2..");
    }
    assert_eq!(decided(5, 5, Err(Failure::Error("boom".into()))), Outcome::Dead { error: "boom".into() });
    // A re-delivery past max_attempts (a lost lease counts an attempt) is dead too.
    assert!(matches!(decided(9, 5, Err(Failure::Error("x".into()))), Outcome::Dead { .. }));
}

#[test]
fn retry_after_is_the_plugins_delay_and_permanent_is_dead_at_once() {
    let asked = Duration::from_secs(42 * 60);
    let Outcome::Retry { delay, .. } = decided(1, 5, Err(Failure::RetryAfter(asked))) else { panic!("retried") };
    assert_eq!(delay, asked, "the plugin's delay, not the backoff (nor its cap)");
    assert_eq!(
        decided(1, 5, Err(Failure::Permanent("bad input".into()))),
        Outcome::Dead { error: "permanent: bad input".into() }
    );
}

fn ok() -> TaskRun {
    TaskRun::returned(Ok(()))
}

#[tokio::test]
async fn a_run_ends_with_its_result_unless_a_cancel_or_a_lost_lease_comes_first() {
    let (stop, lost) = (CancellationToken::new(), CancellationToken::new());
    assert!(matches!(race(async { ok() }, &stop, &lost).await, Ok(TaskRun { result: Ok(()), .. })));

    // A handler that never ends: the cancel ends it, then the lost lease does.
    let stop_now = CancellationToken::new();
    stop_now.cancel();
    assert!(matches!(race(std::future::pending(), &stop_now, &lost).await, Err(Stopped::CancelAsked)));
    let lost_now = CancellationToken::new();
    lost_now.cancel();
    assert!(matches!(race(std::future::pending(), &stop, &lost_now).await, Err(Stopped::LeaseLost)));

    // Both ready at once: the cancel wins over the result, the result over the lost lease.
    assert!(matches!(race(async { ok() }, &stop_now, &lost).await, Err(Stopped::CancelAsked)));
    assert!(race(async { ok() }, &stop, &lost_now).await.is_ok());
}

/// A type with 4 slots, its settle queue, and a dispatcher onto this test's runtime.
struct Bench {
    state: Arc<TypeState>,
    queue: SettleQueue,
    slots: Arc<tokio::sync::Semaphore>,
    global: Arc<tokio::sync::Semaphore>,
    dispatcher: Dispatcher<Scripted>,
    entry: Arc<Entry<ByName>>,
}

impl Bench {
    fn new(aborted: bool) -> Bench {
        let slots = Arc::new(tokio::sync::Semaphore::new(4));
        let (state, queue) = TypeState::new(&"t".parse().unwrap(), slots.clone(), 4);
        if aborted {
            state.in_flight.abort_all();
        }
        let dispatcher = Dispatcher {
            executor: tokio::runtime::Handle::current(),
            ledger: Scripted::new(),
            holder: "this-host".into(),
            runs: TaskTracker::new(),
        };
        let entry =
            Entry { handler: Arc::new(ByName), policy: policy(3), file: "by-name.wasm".into(), hash: "h".into() };
        let global = Arc::new(tokio::sync::Semaphore::new(4));
        Bench { state: Arc::new(state), queue, slots, global, dispatcher, entry: Arc::new(entry) }
    }

    /// Claims `ids` (one slot of each limit apiece) and dispatches them.
    fn dispatch(&self, ids: &[&str]) -> Vec<Lease> {
        let tasks: Vec<(ClaimedTask, Permits)> = ids
            .iter()
            .zip(1..)
            .map(|(id, token)| {
                let task = ClaimedTask { id: id.as_bytes().to_vec(), token, ..task(1) };
                let permits =
                    (self.global.clone().try_acquire_owned().unwrap(), self.slots.clone().try_acquire_owned().unwrap());
                (task, permits)
            })
            .collect();
        let leases = tasks.iter().map(|(t, _)| t.lease()).collect();
        self.dispatcher.dispatch(&self.state, &self.entry, tasks);
        leases
    }

    /// Waits until every run dispatched has ended (settled, queued or dropped).
    async fn runs_ended(&self) {
        self.dispatcher.runs.close();
        self.dispatcher.runs.wait().await;
    }

    fn in_flight(&self, lease: &Lease) -> bool {
        self.state.in_flight.holds(lease)
    }
}

fn id(queued: &Queued) -> &str {
    std::str::from_utf8(&queued.settlement.lease.id).unwrap()
}

#[tokio::test]
async fn each_outcome_is_decided_and_queued_for_the_settler_with_the_slots_it_holds() {
    let mut bench = Bench::new(false);
    let leases = bench.dispatch(&["ok", "fail", "bad"]);
    bench.runs_ended().await;
    let mut queued: Vec<Queued> = (0..3).map(|_| bench.queue.outcomes.try_recv().unwrap()).collect();
    queued.sort_by(|a, b| id(a).cmp(id(b)));
    assert_eq!(queued.iter().map(id).collect::<Vec<_>>(), ["bad", "fail", "ok"]);
    assert_eq!(queued[0].settlement.outcome, Outcome::Dead { error: "permanent: bad input".into() });
    assert!(matches!(&queued[1].settlement.outcome, Outcome::Retry { error, .. } if error == "boom"));
    assert_eq!(
        queued[2].settlement.outcome,
        Outcome::Ack { followups: Vec::new(), groups: Vec::new(), graphs: Vec::new() }
    );
    assert_eq!(queued[2].settlement.lease, leases[0], "an outcome names the lease it was run under");
    assert_eq!(queued[0].claim_unreported.load(Ordering::Acquire), 0, "the claim reported every outcome");
    // Its last run woke the settler, which has not taken the wake-up yet.
    let woken = tokio::time::timeout(Duration::ZERO, bench.state.claim_reported.notified()).await;
    assert!(woken.is_ok(), "the claim's last outcome wakes the settler");

    // Until the settler has stored them, the tasks stay in flight and hold their slots.
    assert!(leases.iter().all(|l| bench.in_flight(l)));
    assert_eq!((bench.slots.available_permits(), bench.global.available_permits()), (1, 1));
    drop(queued);
    assert_eq!((bench.slots.available_permits(), bench.global.available_permits()), (4, 4));
}

#[tokio::test]
async fn a_cancel_is_settled_as_cancelled_and_a_lost_lease_settles_nothing() {
    let mut bench = Bench::new(false);
    let leases = bench.dispatch(&["to-cancel", "to-lose"]);
    assert!(bench.state.in_flight.cancel(b"to-cancel", leases[0].token), "the host holds it: the cancel stops its run");
    let lost = bench.state.in_flight.renewed(&leases[1..], vec![Extended::Lost]);
    assert_eq!(lost[&leases[1].claim], ["to-lose"], "its handler was still going");
    bench.runs_ended().await;

    let cancelled = bench.queue.outcomes.try_recv().unwrap();
    assert_eq!((id(&cancelled), &cancelled.settlement.outcome), ("to-cancel", &Outcome::Cancelled));
    assert!(bench.queue.outcomes.try_recv().is_err(), "the lost run queues nothing: the task is another host's");
    assert!(!bench.in_flight(&leases[1]), "nor is it handed back at shutdown");
    assert_eq!(bench.slots.available_permits(), 3, "its slot is free at once; the cancelled one waits for its settle");
    drop(cancelled);
    assert_eq!(bench.slots.available_permits(), 4);
}

#[tokio::test]
async fn a_claim_that_arrives_after_the_grace_period_ends_at_once_and_keeps_its_lease_to_hand_back() {
    let mut bench = Bench::new(true);
    let leases = bench.dispatch(&["long", "ok"]);
    bench.runs_ended().await;
    let finished = bench.queue.outcomes.try_recv().unwrap();
    assert_eq!(id(&finished), "ok", "a handler done at its first step keeps its outcome");
    assert!(bench.queue.outcomes.try_recv().is_err(), "the stopped run queues nothing");
    assert!(bench.in_flight(&leases[0]), "its lease stays listed, for shutdown to hand back");
    assert_eq!(bench.slots.available_permits(), 3, "its slot is free; the finished one waits for its settle");
}

#[tokio::test]
async fn a_panic_in_the_host_fails_the_task_not_the_host() {
    let (stop, lost) = (CancellationToken::new(), CancellationToken::new());
    let panicking = async { panic!("a bug in a host call") };
    match race(panicking, &stop, &lost).await {
        Ok(TaskRun { result: Err(Failure::Error(text)), .. }) => {
            assert!(text.contains("panic in the host"), "{text}")
        }
        other => panic!("{other:?}"),
    }
}

/// A handler whose future holds 16 KiB across an await, as a fresh
/// instance's instantiation and call hold kilobytes.
struct Bulky;

impl Execute for Bulky {
    async fn execute(&self, _: &ClaimedTask, _: crate::runtime::RunHooks) -> TaskRun {
        let buffer = [1u8; 16 * 1024];
        tokio::task::yield_now().await;
        std::hint::black_box(&buffer);
        ok()
    }
}

#[tokio::test]
async fn a_run_keeps_its_handlers_future_on_the_heap_so_spawning_and_moving_it_copy_little() {
    let slots = Arc::new(tokio::sync::Semaphore::new(3));
    let (state, _queue) = TypeState::new(&"t".parse().unwrap(), slots.clone(), 1);
    let entry = Entry { handler: Arc::new(Bulky), policy: policy(3), file: "bulky.wasm".into(), hash: "h".into() };
    let claim = Arc::new(ClaimRuns::<Bulky, Scripted> {
        entry: Arc::new(entry),
        state: Arc::new(state),
        unreported: Arc::new(AtomicUsize::new(1)),
        trace: None,
        settle_tx: None,
        holder: "this-host".into(),
        _tracked: TaskTracker::new().token(),
    });
    let permits = (slots.clone().try_acquire_owned().unwrap(), slots.try_acquire_owned().unwrap());
    let signals = claim.state.in_flight.claimed([task(1).lease()]).remove(0);
    let run = Run { task: task(1), lease: task(1).lease(), permits, signals, claim: claim.clone() };
    let go = run.go();
    // Every move of a future copies all of it: the spawn into the executor's
    // task, and inside, the race. The handler's kilobytes stay out of them.
    let bytes = std::mem::size_of_val(&go);
    assert!(bytes < 4 * 1024, "a run's future is {bytes} bytes: the handler's future is held inline");
    go.await;
    // Held, yet a cancel finds no handler going: the boxed handler ran to its end.
    assert!(claim.state.in_flight.holds(&task(1).lease()) && !claim.state.in_flight.cancel(b"id", 1));
}
