//! The Lua protocol against a reference model: random interleavings, checked after every step.
//!
//! The reference model (`reference`) restates every script's rules in plain Rust (schedule, claim
//! with its reaping and throttle, settle of each outcome, extend, release, cancel, dead letters,
//! pause); `case` runs one case through the store and the model and compares them.
//!
//! Each case is a random sequence of what clients, several hosts and time do
//! to one task type, run through the real [`Store`] against a real
//! redis-server. Time is a key the scripts read instead of `TIME`
//! ([`Store::with_manual_clock`]), so a lease expires exactly when the case
//! steps past it. After every step the whole of the type's state in Redis
//! must equal the model's, and three properties must hold: a task is
//! leased at most once at a time, without exception (a schedule a client
//! writes while it runs waits for the run to end), and never both due and
//! leased unless a client scheduled it so; a fenced outcome changes nothing; no task is lost (each is due, leased,
//! dead, or ended by an ack, a cancel or a purge). A failure shrinks to a
//! minimal sequence of steps and names the step and the difference.
//!
//! `HOURGLASS_MODEL_CASES` sets the number of cases (default 3000);
//! `HOURGLASS_MODEL_REDIS` runs them against a Redis of your own (a
//! `redis://` URL; the test writes only keys under `hgmodel-<pid>:` and
//! deletes them after each case). docs/correctness.md has the figures.

// The exhaustive check of the protocol in small worlds, beside this random one against Redis.
mod protocol;
// One case of this random test: its steps through the store and the model, compared.
mod case;
// The reference model: the scripts' rules in plain Rust.
mod reference;

use hourglass_store::{ScheduleMode, Store};
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, TestCaseError, TestError, TestRunner};

use case::run_case;

/// Task ids: few, so that steps collide on them; the last is longer than
/// [`MAX_ID_BYTES`] and is dead-lettered when claimed.
const IDS: [&str; 5] = ["a", "b", "c", "d", "toolong"];
const MAX_ID_BYTES: usize = 6;
/// Payloads are 0 to 6 bytes: the longer ones are dead-lettered when claimed.
const MAX_PAYLOAD_BYTES: usize = 4;
const HOLDERS: [&str; 3] = ["h1", "h2", "h3"];
/// The manual clock's start (ms): any fixed time works, the scripts never look at the real one.
const START_MS: i64 = 1_700_000_000_000;
/// Events are kept when a settle asks for them; trimming never starts at this size.
const EVENTS_MAXLEN: u64 = 100_000;

// ---------------------------------------------------------------- the steps

/// One thing that happens to the type.
#[derive(Debug, Clone)]
enum Step {
    /// A client schedules `id` due `at` ms from now (negative: overdue), with a payload of `payload` bytes.
    Schedule {
        id: usize,
        at: i64,
        payload: usize,
        mode: ScheduleMode,
    },
    /// Host `holder` claims up to `max` due tasks under a lease of `lease_ms`; `max_running` 0 = no limit.
    Claim {
        holder: usize,
        max: usize,
        lease_ms: u64,
        max_running: u64,
    },
    /// A host settles runs it was handed, in one batch: runs still leased, or with `stale` any
    /// run ever handed out (a host that lost its lease). `events` sends them the way a type with
    /// events does (each in full), else acks go as claim masks.
    Settle {
        runs: Vec<(Index, End)>,
        stale: bool,
        events: bool,
    },
    /// A host's heartbeat for runs it was handed (as for `Settle`).
    Extend {
        runs: Vec<Index>,
        stale: bool,
        lease_ms: u64,
    },
    /// A host shutting down hands runs back (as for `Settle`).
    Release {
        runs: Vec<Index>,
        stale: bool,
    },
    /// `hourglass cancel`.
    Cancel {
        id: usize,
    },
    /// `hourglass dead requeue` of one id, or of all.
    Requeue {
        id: Option<usize>,
    },
    /// `hourglass dead purge` of one id, or of all.
    Purge {
        id: Option<usize>,
    },
    Pause,
    Resume,
    /// Time passes.
    Advance {
        ms: i64,
    },
}

/// How a run ended.
#[derive(Debug, Clone, Copy)]
enum End {
    Ack,
    Retry { delay_ms: u64 },
    Dead,
    Cancel,
}

fn step() -> impl Strategy<Value = Step> {
    let mode = prop::sample::select(vec![
        ScheduleMode::Upsert,
        ScheduleMode::IfAbsent,
        ScheduleMode::OnlyLater,
        ScheduleMode::OnlyEarlier,
    ]);
    let end = prop_oneof![
        3 => Just(End::Ack),
        2 => prop::sample::select(vec![0u64, 40, 150]).prop_map(|delay_ms| End::Retry { delay_ms }),
        1 => Just(End::Dead),
        1 => Just(End::Cancel),
    ];
    let lease = prop::sample::select(vec![50u64, 100, 400]);
    // Mostly ids and payloads a claim hands out; now and then one it dead-letters as too long.
    let id = prop_oneof![9 => 0..IDS.len() - 1, 1 => Just(IDS.len() - 1)];
    let payload = prop_oneof![6 => 0..=MAX_PAYLOAD_BYTES, 1 => MAX_PAYLOAD_BYTES + 1..=MAX_PAYLOAD_BYTES + 2];
    let stale = prop_oneof![4 => Just(false), 1 => Just(true)];
    prop_oneof![
        5 => (id.clone(), -100i64..120, payload, mode)
            .prop_map(|(id, at, payload, mode)| Step::Schedule { id, at, payload, mode }),
        5 => (0..HOLDERS.len(), 1usize..4, lease.clone(), prop_oneof![3 => Just(0u64), 1 => 1u64..4])
            .prop_map(|(holder, max, lease_ms, max_running)| Step::Claim { holder, max, lease_ms, max_running }),
        5 => (prop::collection::vec((any::<Index>(), end), 1..4), stale.clone(), any::<bool>())
            .prop_map(|(runs, stale, events)| Step::Settle { runs, stale, events }),
        2 => (prop::collection::vec(any::<Index>(), 1..3), stale.clone(), lease)
            .prop_map(|(runs, stale, lease_ms)| Step::Extend { runs, stale, lease_ms }),
        1 => (prop::collection::vec(any::<Index>(), 1..3), stale).prop_map(|(runs, stale)| Step::Release { runs, stale }),
        2 => id.clone().prop_map(|id| Step::Cancel { id }),
        1 => prop::option::of(0..IDS.len()).prop_map(|id| Step::Requeue { id }),
        1 => prop::option::of(0..IDS.len()).prop_map(|id| Step::Purge { id }),
        1 => Just(Step::Pause),
        3 => Just(Step::Resume),
        4 => prop::sample::select(vec![1i64, 30, 60, 120, 500]).prop_map(|ms| Step::Advance { ms }),
    ]
}

/// How often the cases reached the paths that matter (a generator that never
/// reaches them would pass without checking anything).
#[derive(Debug, Default, Clone, Copy)]
struct Coverage {
    handed_out: usize,
    fenced: usize,
    reaped: usize,
    cancelled_running: usize,
    dead_at_claim: usize,
    retried: usize,
    claims_while_paused: usize,
    /// Due ids a claim held back because an earlier run of theirs still held its lease.
    held_back: usize,
    /// Held schedules that got their own due time back when the earlier run ended.
    given_back: usize,
}

impl Coverage {
    fn add(&mut self, o: Coverage) {
        self.handed_out += o.handed_out;
        self.fenced += o.fenced;
        self.reaped += o.reaped;
        self.cancelled_running += o.cancelled_running;
        self.dead_at_claim += o.dead_at_claim;
        self.retried += o.retried;
        self.claims_while_paused += o.claims_while_paused;
        self.held_back += o.held_back;
        self.given_back += o.given_back;
    }

    /// The paths no run of the default size may miss.
    fn missed(&self) -> Vec<&'static str> {
        let mut out = Vec::new();
        for (n, name) in [
            (self.handed_out, "claims"),
            (self.fenced, "fenced outcomes"),
            (self.reaped, "reaped leases"),
            (self.cancelled_running, "cancels of running tasks"),
            (self.dead_at_claim, "dead letters at claim"),
            (self.retried, "retries"),
            (self.claims_while_paused, "claims while paused"),
            (self.held_back, "ids held back for their earlier run"),
            (self.given_back, "held schedules given their time back"),
        ] {
            if n == 0 {
                out.push(name);
            }
        }
        out
    }
}

fn cases() -> u32 {
    std::env::var("HOURGLASS_MODEL_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(3000)
}

#[test]
fn the_scripts_agree_with_the_model_under_random_interleavings() {
    // A private redis-server, unless the user points the test at their own.
    let own = std::env::var("HOURGLASS_MODEL_REDIS").ok();
    let server = own.is_none().then(crate::support::RedisServer::start);
    let url = own.clone().unwrap_or_else(|| server.as_ref().unwrap().url());
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let prefix: hourglass_store::KeyPrefix = format!("hgmodel-{}", std::process::id()).parse().unwrap();
    let clock_key = format!("{}:clock", prefix.as_str());
    let store = rt.block_on(Store::connect(&url, &prefix)).unwrap().with_manual_clock(&clock_key);

    let mut runner = TestRunner::new(Config { cases: cases(), failure_persistence: None, ..Config::default() });
    let case = std::cell::Cell::new(0);
    let steps_run = std::cell::Cell::new(0);
    let covered = std::cell::Cell::new(Coverage::default());
    let result = runner.run(&prop::collection::vec(step(), 1..60), |steps| {
        case.set(case.get() + 1);
        steps_run.set(steps_run.get() + steps.len());
        let c = rt.block_on(run_case(&store, &clock_key, case.get(), &steps)).map_err(TestCaseError::fail)?;
        let mut all = covered.get();
        all.add(c);
        covered.set(all);
        Ok(())
    });
    rt.block_on(async {
        let mut conn = store.connection();
        let _: Result<(), _> = redis::cmd("DEL").arg(&clock_key).query_async(&mut conn).await;
    });
    match result {
        // The reason holds the shrunk case's trace, which reads better than its Debug.
        Err(TestError::Fail(reason, _)) => {
            panic!("the scripts and the model disagree (shrunk to a minimal case):\n{reason}")
        }
        Err(e) => panic!("{e}"),
        Ok(()) => {}
    }
    let covered = covered.get();
    eprintln!(
        "model: {} cases, {} steps, every state equal to the model's; covered {covered:?}",
        cases(),
        steps_run.get()
    );
    if cases() >= 200 {
        let missed = covered.missed();
        assert!(missed.is_empty(), "the cases never reached: {missed:?} ({covered:?})");
    }
}
