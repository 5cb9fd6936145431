//! The Lua protocol against a reference model: random interleavings, checked after every step.
//!
//! Long: the reference model restates every script's rules in plain Rust (schedule, claim with
//! its reaping and throttle, settle of each outcome, extend, release, cancel, dead letters, pause),
//! and a model is only worth its detail.
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

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::time::Duration;

use hourglass_store::task::{Claim, Ended, Lease, Outcome, RunInfo, Settlement};
use hourglass_store::task_type::TaskType;
use hourglass_store::{Cancelled, ClaimLimits, Extended, Keys, ScheduleMode, Store};
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, TestCaseError, TestError, TestRunner};

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

// ---------------------------------------------------------------- the state

/// Everything Redis holds for the type, as the test reads it (and as the model predicts it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct State {
    due: BTreeMap<String, i64>,
    payload: BTreeMap<String, Vec<u8>>,
    dead: BTreeMap<String, i64>,
    attempts: BTreeMap<String, String>,
    errors: BTreeMap<String, String>,
    /// id → the lease token a cancel asked to stop.
    cancels: BTreeMap<String, String>,
    /// claim id → lease expiry.
    claims: BTreeMap<String, i64>,
    /// claim id → which of its tasks are leased ('1') or left ('0').
    live: BTreeMap<String, String>,
    /// The `leased` counter of `claimed` (tasks leased under claims).
    leased: i64,
    /// The ids leased under claims (and the member that keeps the set a hash table).
    running: BTreeSet<String>,
    /// id → `<due the client gave>:<due while held>`, of schedules waiting for an earlier run.
    held: BTreeMap<String, String>,
    /// The non-zero counters of the type's stats.
    stats: BTreeMap<String, i64>,
    seq: i64,
    paused: bool,
    /// Completion events written.
    events: usize,
}

/// A claim as the model keeps it: the ids, attempts and holder that Redis packs into one record.
#[derive(Debug, Clone)]
struct ClaimRecord {
    ids: Vec<String>,
    attempts: Vec<u32>,
    holder: usize,
    /// The earliest due time of its tasks: where lost tasks go back to in `due`.
    oldest: i64,
}

/// A run some host was handed: its lease and attempt.
#[derive(Debug, Clone)]
struct Run {
    lease: Lease,
    attempt: u32,
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

/// The reference model: the scripts' rules, written out in Rust.
#[derive(Debug, Default)]
struct Model {
    covered: Coverage,
    now: i64,
    s: State,
    claims: BTreeMap<u64, ClaimRecord>,
    /// Ids a client scheduled while they were leased: the one case where a task may be
    /// due and leased at once (the new schedule waits for the run to end).
    scheduled_while_leased: BTreeSet<String>,
    /// Ids whose last end took them out for good (ack, cancel, purge): the only ones
    /// allowed to be neither due, nor leased, nor dead.
    ended: BTreeSet<String>,
    known: BTreeSet<String>,
}

fn count(stats: &mut BTreeMap<String, i64>, field: &str, n: i64) {
    if n != 0 {
        *stats.entry(field.to_owned()).or_default() += n;
    }
}

impl Model {
    fn new() -> Model {
        Model { now: START_MS, ..Model::default() }
    }

    /// The claim and index a lease names, when that task is still leased under it (the scripts' `leased_in`).
    fn leased_in(&self, lease: &Lease) -> Option<(u64, usize)> {
        let rec = self.claims.get(&lease.claim)?;
        let k = usize::try_from(lease.token.checked_sub(lease.claim)?).ok()?;
        let live = self.s.live.get(&lease.claim.to_string())?;
        (live.as_bytes().get(k) == Some(&b'1') && rec.ids[k].as_bytes() == lease.id.as_slice())
            .then_some((lease.claim, k))
    }

    /// Task `k` of claim `c` leaves it; the claim and its lease go with its last task.
    fn leave_claim(&mut self, c: u64, k: usize) {
        let key = c.to_string();
        let id = self.claims[&c].ids[k].clone();
        let live = self.s.live.get_mut(&key).expect("a live claim");
        live.replace_range(k..=k, "0");
        self.s.leased -= 1;
        if !live.contains('1') {
            self.s.live.remove(&key);
            self.s.claims.remove(&key);
            self.claims.remove(&c);
        }
        self.s.running.remove(&id);
        self.unhold(&id);
    }

    /// The run of `id` ended: a schedule held for it gets back the due time the client gave,
    /// unless someone moved it since (the prelude's unhold).
    fn unhold(&mut self, id: &str) {
        let Some(entry) = self.s.held.remove(id) else { return };
        let (original, bumped) = entry.split_once(':').expect("original:bumped");
        if self.s.due.get(id).is_some_and(|&d| d.to_string() == bumped) {
            self.s.due.insert(id.to_owned(), original.parse().unwrap());
            self.covered.given_back += 1;
        }
    }

    /// (claim, index) of every live lease of `id`.
    fn leases_of(&self, id: &str) -> Vec<(u64, usize)> {
        let mut out = Vec::new();
        for (c, rec) in &self.claims {
            let live = self.s.live[&c.to_string()].as_bytes();
            for (k, held) in rec.ids.iter().enumerate() {
                if held == id && live[k] == b'1' {
                    out.push((*c, k));
                }
            }
        }
        out
    }

    fn schedule(&mut self, id: &str, due: i64, payload: &[u8], mode: ScheduleMode) -> bool {
        let current = self.s.due.get(id).copied();
        let written = match mode {
            ScheduleMode::Upsert => true,
            ScheduleMode::IfAbsent => current.is_none(),
            ScheduleMode::OnlyLater => current.is_none_or(|c| due > c),
            ScheduleMode::OnlyEarlier => current.is_none_or(|c| due < c),
        };
        if written {
            self.s.due.insert(id.to_owned(), due);
            if payload.is_empty() {
                self.s.payload.remove(id);
            } else {
                self.s.payload.insert(id.to_owned(), payload.to_vec());
            }
            self.ended.remove(id);
            if !self.leases_of(id).is_empty() {
                self.scheduled_while_leased.insert(id.to_owned());
            }
        }
        written
    }

    /// What claim.lua does: the tasks handed out (id, due, payload, attempt, token) and those dead-lettered.
    fn claim(&mut self, holder: usize, max: usize, lease_ms: u64, max_running: u64) -> ModelClaim {
        if self.s.paused {
            self.covered.claims_while_paused += 1;
            return ModelClaim { paused: true, ..ModelClaim::default() };
        }
        let now = self.now;
        let mut limit = max.min(65535);
        // 1. Reap expired claims, oldest expiry first (ties by claim id as text, as the ZSET orders them).
        let mut expired: Vec<(i64, String)> =
            self.s.claims.iter().filter(|&(_, &e)| e <= now).map(|(c, &e)| (e, c.clone())).collect();
        expired.sort();
        expired.truncate(limit);
        let mut lost = Vec::new();
        for (_, c) in &expired {
            let claim: u64 = c.parse().unwrap();
            let rec = self.claims.remove(&claim).expect("a claim record");
            let live = self.s.live.remove(c).expect("live bytes");
            self.s.claims.remove(c);
            for (k, byte) in live.bytes().enumerate() {
                if byte == b'1' {
                    lost.push((rec.ids[k].clone(), (claim + k as u64).to_string(), rec.attempts[k], rec.oldest));
                    self.s.leased -= 1;
                }
            }
        }
        self.covered.reaped += lost.len();
        for (id, ..) in &lost {
            self.s.running.remove(id);
            self.unhold(id);
        }
        let marks: Vec<Option<String>> = lost.iter().map(|(id, ..)| self.s.cancels.get(id).cloned()).collect();
        let mut back = Vec::new();
        for ((id, token, attempt, at), mark) in lost.into_iter().zip(marks) {
            if mark.as_deref() == Some(token.as_str()) {
                // A run whose cancel was asked, and whose host died, is not run again.
                self.s.cancels.remove(&id);
                if !self.s.due.contains_key(&id) {
                    self.s.payload.remove(&id);
                }
                count(&mut self.s.stats, "cancelled", 1);
                self.ended.insert(id);
            } else {
                back.push((id.clone(), at));
                self.s.attempts.insert(id, attempt.to_string());
            }
        }
        // Back at their claim's earliest due time, ahead of what fell due since (a client's schedule wins).
        for (id, at) in back {
            self.s.due.entry(id.clone()).or_insert(at);
            self.ended.remove(&id);
        }
        // 2. max_running over every host.
        if max_running > 0 {
            let room = max_running as i64 - self.s.leased;
            if room < limit as i64 {
                limit = room.max(0) as usize;
            }
        }
        // 3. Due tasks, oldest first (ties by id).
        let mut rows: Vec<(i64, String)> =
            self.s.due.iter().filter(|&(_, &d)| d <= now).map(|(id, &d)| (d, id.clone())).collect();
        rows.sort();
        rows.truncate(limit);
        let mut out = ModelClaim::default();
        // One run of an id at a time: one whose earlier run's claim still exists waits for its
        // lease's end, and `held` keeps the time it had (or the one it had before, if untouched).
        let mut free = Vec::new();
        if !rows.is_empty() && self.s.running.is_empty() {
            // The member that keeps `running` a hash table (the prelude's RUNNING_TABLE_MEMBER).
            self.s.running.insert(format!("~{} keeps this a hash table", "-".repeat(70)));
        }
        for (due, id) in rows {
            let until = self.leases_of(&id).first().map(|(c, _)| self.s.claims[&c.to_string()]);
            let Some(until) = until else {
                free.push((due, id));
                continue;
            };
            let original = match self.s.held.get(&id).and_then(|e| e.split_once(':')) {
                Some((o, b)) if b == due.to_string() => o.to_owned(),
                _ => due.to_string(),
            };
            self.s.due.insert(id.clone(), until);
            self.s.held.insert(id.clone(), format!("{original}:{until}"));
            self.covered.held_back += 1;
            out.held.push(id);
        }
        let mut kept = Vec::new();
        for (due, id) in free {
            self.s.due.remove(&id);
            if self.s.dead.remove(&id).is_some() {
                // A dead id a client scheduled again starts over.
                self.s.attempts.remove(&id);
                self.s.errors.remove(&id);
            }
            let payload_len = self.s.payload.get(&id).map_or(0, Vec::len);
            let reason = if id.len() > MAX_ID_BYTES {
                Some(format!("id of {} bytes is over the {MAX_ID_BYTES}-byte limit", id.len()))
            } else if payload_len > MAX_PAYLOAD_BYTES {
                Some(format!("payload of {payload_len} bytes is over the {MAX_PAYLOAD_BYTES}-byte limit"))
            } else {
                None
            };
            match reason {
                Some(reason) => {
                    self.s.dead.insert(id.clone(), now);
                    self.s.errors.insert(id.clone(), reason.clone());
                    count(&mut self.s.stats, "dead", 1);
                    self.covered.dead_at_claim += 1;
                    out.dead.push((id, reason));
                }
                None => kept.push((due, id)),
            }
        }
        if !kept.is_empty() {
            let first = self.s.seq as u64 + 1;
            self.s.seq += kept.len() as i64;
            let mut rec = ClaimRecord {
                ids: Vec::new(),
                attempts: Vec::new(),
                holder,
                oldest: kept.iter().map(|k| k.0).min().unwrap(),
            };
            for (k, (due, id)) in kept.into_iter().enumerate() {
                let attempt = self.s.attempts.get(&id).map_or(0, |a| a.parse::<u32>().unwrap()) + 1;
                self.s.running.insert(id.clone());
                self.covered.handed_out += 1;
                out.tasks.push((
                    id.clone(),
                    due,
                    self.s.payload.get(&id).cloned().unwrap_or_default(),
                    attempt,
                    first + k as u64,
                ));
                rec.ids.push(id);
                rec.attempts.push(attempt);
            }
            let n = rec.ids.len();
            self.s.claims.insert(first.to_string(), now + lease_ms as i64);
            self.s.live.insert(first.to_string(), "1".repeat(n));
            self.s.leased += n as i64;
            self.claims.insert(first, rec);
        }
        out
    }

    /// What settle.lua does with one run (a batch holds each id once, so runs settle one by one).
    fn settle(&mut self, run: &Run, end: End, events: bool) -> Ended {
        let Some((c, k)) = self.leased_in(&run.lease) else {
            self.covered.fenced += 1;
            return Ended::Fenced;
        };
        let id = String::from_utf8(run.lease.id.clone()).unwrap();
        let attempt = self.claims[&c].attempts[k];
        self.leave_claim(c, k);
        let token = run.lease.token.to_string();
        let mut end = end;
        // A failure of a run whose cancel was asked is a cancel: never retried.
        if matches!(end, End::Retry { .. } | End::Dead) && self.s.cancels.get(&id) == Some(&token) {
            end = End::Cancel;
        }
        self.s.cancels.remove(&id);
        let due_again = self.s.due.contains_key(&id);
        let result = match end {
            End::Ack | End::Cancel => {
                self.s.attempts.remove(&id);
                self.s.errors.remove(&id);
                if !due_again {
                    self.s.payload.remove(&id);
                    self.ended.insert(id.clone());
                }
                if matches!(end, End::Ack) {
                    count(&mut self.s.stats, "succeeded", 1);
                    Ended::Succeeded
                } else {
                    count(&mut self.s.stats, "cancelled", 1);
                    Ended::Cancelled
                }
            }
            End::Retry { delay_ms } => {
                self.s.errors.insert(id.clone(), "retry".into());
                self.s.attempts.insert(id.clone(), attempt.to_string());
                count(&mut self.s.stats, "failed", 1);
                count(&mut self.s.stats, "retried", 1);
                self.covered.retried += 1;
                // A client's schedule made during the run wins.
                self.s.due.entry(id.clone()).or_insert(self.now + delay_ms as i64);
                Ended::Retried
            }
            End::Dead => {
                self.s.errors.insert(id.clone(), "dead".into());
                count(&mut self.s.stats, "failed", 1);
                if due_again {
                    // A client's schedule made during the run stands: rescheduled, not dead.
                    self.s.attempts.remove(&id);
                    Ended::Rescheduled
                } else {
                    self.s.dead.insert(id.clone(), self.now);
                    self.s.attempts.insert(id.clone(), attempt.to_string());
                    count(&mut self.s.stats, "dead", 1);
                    Ended::Dead
                }
            }
        };
        if events {
            self.s.events += 1;
        }
        result
    }

    fn extend(&mut self, run: &Run, lease_ms: u64) -> Extended {
        let Some((c, _)) = self.leased_in(&run.lease) else { return Extended::Lost };
        self.s.claims.insert(c.to_string(), self.now + lease_ms as i64);
        let id = String::from_utf8_lossy(&run.lease.id).into_owned();
        if self.s.cancels.get(&id) == Some(&run.lease.token.to_string()) {
            Extended::Cancelled
        } else {
            Extended::Extended
        }
    }

    /// Hands runs back, due now (a client's schedule wins); returns how many.
    fn release(&mut self, runs: &[&Run]) -> usize {
        let mut back = Vec::new();
        for run in runs {
            if let Some((c, k)) = self.leased_in(&run.lease) {
                self.leave_claim(c, k);
                back.push(String::from_utf8(run.lease.id.clone()).unwrap());
            }
        }
        for id in &back {
            self.s.due.entry(id.clone()).or_insert(self.now);
            self.ended.remove(id);
        }
        back.len()
    }

    /// Cancel: the leases it may mark when the task runs (more than one only
    /// when a client scheduled it again while it ran: the script picks any).
    fn cancel(&mut self, id: &str) -> CancelModel {
        if self.s.due.remove(id).is_some() {
            self.s.payload.remove(id);
            self.s.held.remove(id);
            self.ended.insert(id.to_owned());
            return CancelModel::Scheduled;
        }
        let leases = self.leases_of(id);
        if leases.is_empty() {
            return CancelModel::Unknown;
        }
        CancelModel::Running(
            leases.into_iter().map(|(c, k)| ((c + k as u64).to_string(), HOLDERS[self.claims[&c].holder])).collect(),
        )
    }

    /// Requeue (`purge` false) or purge the dead ids `ids` (all when None); returns how many.
    fn dead_op(&mut self, ids: Option<&str>, purge: bool) -> u64 {
        let chosen: Vec<String> = match ids {
            Some(id) => self.s.dead.contains_key(id).then(|| id.to_owned()).into_iter().collect(),
            None => self.s.dead.keys().cloned().collect(),
        };
        for id in &chosen {
            self.s.dead.remove(id);
            self.s.attempts.remove(id);
            self.s.errors.remove(id);
            if purge {
                if !self.s.due.contains_key(id) {
                    self.s.payload.remove(id);
                    self.ended.insert(id.clone());
                }
            } else {
                self.s.due.insert(id.clone(), self.now);
                self.ended.remove(id);
                if !self.leases_of(id).is_empty() {
                    self.scheduled_while_leased.insert(id.clone());
                }
            }
        }
        chosen.len() as u64
    }

    /// The properties, on the state Redis holds (already equal to the model's).
    fn check_properties(&self, real: &State) -> Result<(), String> {
        let mut leased: BTreeMap<&str, usize> = BTreeMap::new();
        for (c, rec) in &self.claims {
            for (k, byte) in real.live[&c.to_string()].bytes().enumerate() {
                if byte == b'1' {
                    *leased.entry(rec.ids[k].as_str()).or_default() += 1;
                }
            }
        }
        for (id, n) in &leased {
            if *n > 1 {
                return Err(format!("{id} is leased {n} times at once"));
            }
            if real.due.contains_key(*id) && !self.scheduled_while_leased.contains(*id) {
                return Err(format!("{id} is both due and leased"));
            }
        }
        for id in &self.known {
            let reachable = real.due.contains_key(id) || leased.contains_key(id.as_str()) || real.dead.contains_key(id);
            if !reachable && !self.ended.contains(id) {
                return Err(format!("{id} is lost: not due, not leased, not dead, and it never ended"));
            }
        }
        Ok(())
    }

    /// A step ends: ids no longer leased leave the exception.
    fn settle_down(&mut self) {
        let still: BTreeSet<String> =
            self.scheduled_while_leased.iter().filter(|id| !self.leases_of(id).is_empty()).cloned().collect();
        self.scheduled_while_leased = still;
    }
}

#[derive(Debug, Default)]
struct ModelClaim {
    tasks: Vec<(String, i64, Vec<u8>, u32, u64)>,
    dead: Vec<(String, String)>,
    paused: bool,
    /// Due ids not handed out because an earlier run of theirs still holds its lease.
    held: Vec<String>,
}

enum CancelModel {
    Scheduled,
    Running(Vec<(String, &'static str)>),
    Unknown,
}

// ---------------------------------------------------------------- Redis

/// Reads the type's whole state in one round trip.
async fn read_state(store: &Store, k: &Keys) -> anyhow::Result<State> {
    type Pairs = Vec<(String, String)>;
    type Scores = Vec<(String, f64)>;
    let mut conn = store.connection();
    #[allow(clippy::type_complexity)]
    let (due, payload, dead, attempts, errors, cancels, claims, claimed, stats, seq, paused, events): (
        Scores,
        Vec<(String, Vec<u8>)>,
        Scores,
        Pairs,
        Pairs,
        Pairs,
        Scores,
        Vec<(String, Vec<u8>)>,
        Pairs,
        Option<i64>,
        bool,
        usize,
    ) = redis::pipe()
        .zrange_withscores(&k.due, 0, -1)
        .hgetall(&k.payload)
        .zrange_withscores(&k.dead, 0, -1)
        .hgetall(&k.attempts)
        .hgetall(&k.errors)
        .hgetall(&k.cancels)
        .zrange_withscores(&k.claims, 0, -1)
        .hgetall(&k.claimed)
        .hgetall(&k.stats)
        .get(&k.seq)
        .exists(&k.paused)
        .xlen(&k.events)
        .query_async(&mut conn)
        .await?;
    // A tuple reply has at most 12 parts: the run index apart (nothing runs between the reads).
    let (running, held): (BTreeSet<String>, Pairs) =
        redis::pipe().smembers(&k.running).hgetall(&k.held).query_async(&mut conn).await?;
    let scores = |v: Scores| v.into_iter().map(|(m, s)| (m, s as i64)).collect();
    let mut live = BTreeMap::new();
    let mut leased = 0;
    for (field, value) in claimed {
        if field == "leased" {
            leased = String::from_utf8(value)?.parse()?;
        } else if let Some(c) = field.strip_suffix(":live") {
            live.insert(c.to_owned(), String::from_utf8(value)?);
        }
    }
    Ok(State {
        due: scores(due),
        payload: payload.into_iter().collect(),
        dead: scores(dead),
        attempts: attempts.into_iter().collect(),
        errors: errors.into_iter().collect(),
        cancels: cancels.into_iter().collect(),
        claims: scores(claims),
        live,
        leased,
        running,
        held: held.into_iter().collect(),
        stats: stats.into_iter().map(|(f, v)| (f, v.parse().unwrap_or(i64::MIN))).filter(|(_, v)| *v != 0).collect(),
        seq: seq.unwrap_or(0),
        paused,
        events,
    })
}

/// The fields where two states differ, one per line.
fn difference(model: &State, real: &State) -> String {
    let mut out = String::new();
    macro_rules! field {
        ($($f:ident),*) => {$(
            if model.$f != real.$f {
                let _ = writeln!(out, "  {}: model {:?}\n  {}  redis {:?}", stringify!($f), model.$f, " ".repeat(stringify!($f).len()), real.$f);
            }
        )*};
    }
    field!(
        due, payload, dead, attempts, errors, cancels, claims, live, leased, running, held, stats, seq, paused, events
    );
    out
}

/// One case against Redis: every step through the store, then the model, then the comparison.
struct Case<'a> {
    store: &'a Store,
    clock_key: &'a str,
    t: TaskType,
    model: Model,
    runs: Vec<Run>,
    trace: Vec<String>,
}

impl Case<'_> {
    fn holder(&self, i: usize) -> Store {
        self.store.clone().with_holder(HOLDERS[i])
    }

    /// Distinct runs named by `picks`, at most one per id (as one host's batch is):
    /// among those still leased, or with `stale` among every run handed out.
    fn pick(&self, picks: &[Index], stale: bool) -> Vec<Run> {
        let mut seen = BTreeSet::new();
        let mut out = Vec::new();
        let pool: Vec<&Run> = self.runs.iter().filter(|r| stale || self.model.leased_in(&r.lease).is_some()).collect();
        if pool.is_empty() {
            return out;
        }
        for p in picks {
            let run = pool[p.index(pool.len())];
            if seen.insert(run.lease.id.clone()) {
                out.push(run.clone());
            }
        }
        out
    }

    async fn apply(&mut self, n: usize, step: &Step) -> Result<(), String> {
        let t = self.t.clone();
        let now = self.model.now;
        let fail = |what: &str, e: anyhow::Error| format!("step {n} {what}: {e:#}");
        let note: String = match step {
            Step::Schedule { id, at, payload, mode } => {
                let id = IDS[*id];
                self.model.known.insert(id.to_owned());
                let body = vec![b'a' + (n % 26) as u8; *payload];
                let body_arg = (!body.is_empty()).then_some(body.as_slice());
                let written = self
                    .store
                    .schedule(&t, id.as_bytes(), now + at, body_arg, *mode)
                    .await
                    .map_err(|e| fail("schedule", e))?;
                let expected = self.model.schedule(id, now + at, &body, *mode);
                if written != expected {
                    return Err(format!("step {n}: schedule wrote {written}, the model {expected}"));
                }
                format!("written {written}")
            }
            Step::Claim { holder, max, lease_ms, max_running } => {
                let limits = ClaimLimits {
                    max_tasks: *max,
                    lease: Duration::from_millis(*lease_ms),
                    max_payload_bytes: MAX_PAYLOAD_BYTES as u64,
                    max_id_bytes: MAX_ID_BYTES,
                    max_running: *max_running,
                    ..ClaimLimits::default()
                };
                let claim = self.holder(*holder).claim(&t, &limits).await.map_err(|e| fail("claim", e))?;
                let expected = self.model.claim(*holder, *max, *lease_ms, *max_running);
                compare_claim(n, &claim, &expected)?;
                for task in &claim.tasks {
                    self.runs.push(Run {
                        lease: Lease { id: task.id.clone(), token: task.token, claim: task.claim },
                        attempt: task.attempt,
                    });
                }
                let ids: Vec<_> = expected.tasks.iter().map(|t| format!("{}#{}", t.0, t.4)).collect();
                let overlap = if expected.held.is_empty() {
                    String::new()
                } else {
                    format!(" (held for their earlier run: {:?})", expected.held)
                };
                format!("handed out {ids:?}, dead-lettered {:?}{overlap}", expected.dead)
            }
            Step::Settle { runs, stale, events } => {
                let picks: Vec<Index> = runs.iter().map(|r| r.0).collect();
                let runs: Vec<(Run, End)> =
                    self.pick(&picks, *stale).into_iter().zip(runs.iter().map(|r| r.1)).collect();
                if runs.is_empty() {
                    return Ok(());
                }
                let batch: Vec<Settlement> = runs
                    .iter()
                    .map(|(run, end)| Settlement {
                        lease: run.lease.clone(),
                        outcome: match end {
                            End::Ack => Outcome::Ack { followups: Vec::new(), groups: Vec::new() },
                            End::Retry { delay_ms } => {
                                Outcome::Retry { delay: Duration::from_millis(*delay_ms), error: "retry".into() }
                            }
                            End::Dead => Outcome::Dead { error: "dead".into() },
                            End::Cancel => Outcome::Cancelled,
                        },
                        run: RunInfo { attempt: run.attempt, ..RunInfo::default() },
                    })
                    .collect();
                let results = self
                    .store
                    .settle(&t, &batch, events.then_some(EVENTS_MAXLEN))
                    .await
                    .map_err(|e| fail("settle", e))?;
                let expected: Vec<Ended> =
                    runs.iter().map(|(run, end)| self.model.settle(run, *end, *events)).collect();
                if results != expected {
                    return Err(format!("step {n}: settle gave {results:?}, the model {expected:?}"));
                }
                let what: Vec<_> = runs
                    .iter()
                    .zip(&results)
                    .map(|((run, end), r)| {
                        format!("{}#{} {end:?}: {r:?}", String::from_utf8_lossy(&run.lease.id), run.lease.token)
                    })
                    .collect();
                what.join(", ")
            }
            Step::Extend { runs, stale, lease_ms } => {
                let runs = self.pick(runs, *stale);
                if runs.is_empty() {
                    return Ok(());
                }
                let leases: Vec<Lease> = runs.iter().map(|r| r.lease.clone()).collect();
                let got = self.store.extend(&t, &leases, *lease_ms).await.map_err(|e| fail("extend", e))?;
                let expected: Vec<Extended> = runs.iter().map(|r| self.model.extend(r, *lease_ms)).collect();
                if got != expected {
                    return Err(format!("step {n}: extend gave {got:?}, the model {expected:?}"));
                }
                format!("{got:?}")
            }
            Step::Release { runs, stale } => {
                let runs = self.pick(runs, *stale);
                if runs.is_empty() {
                    return Ok(());
                }
                let leases: Vec<Lease> = runs.iter().map(|r| r.lease.clone()).collect();
                let got = self.store.release(&t, &leases).await.map_err(|e| fail("release", e))?;
                let expected = self.model.release(&runs.iter().collect::<Vec<_>>());
                if got != expected {
                    return Err(format!("step {n}: release handed back {got}, the model {expected}"));
                }
                format!("handed back {got}")
            }
            Step::Cancel { id } => {
                let id = IDS[*id];
                let got = self.store.cancel(&t, id.as_bytes()).await.map_err(|e| fail("cancel", e))?;
                match (self.model.cancel(id), &got) {
                    (CancelModel::Scheduled, Cancelled::Scheduled) | (CancelModel::Unknown, Cancelled::Unknown) => {}
                    (CancelModel::Running(candidates), Cancelled::Running { holder }) => {
                        // The script marks one lease of the id; more than one exists only in the exception.
                        let mut conn = self.store.connection();
                        let marked: Option<String> = redis::cmd("HGET")
                            .arg(self.store.keys(&t).cancels)
                            .arg(id)
                            .query_async(&mut conn)
                            .await
                            .map_err(|e| format!("step {n}: {e}"))?;
                        let Some((token, _)) =
                            candidates.iter().find(|(token, h)| Some(token) == marked.as_ref() && h == holder)
                        else {
                            return Err(format!(
                                "step {n}: cancel marked {marked:?} on {holder}, the model expected one of {candidates:?}"
                            ));
                        };
                        self.model.s.cancels.insert(id.to_owned(), token.clone());
                        self.model.covered.cancelled_running += 1;
                    }
                    (_, got) => return Err(format!("step {n}: cancel gave {got:?}, which the model did not expect")),
                }
                format!("{got:?}")
            }
            Step::Requeue { id } | Step::Purge { id } => {
                let purge = matches!(step, Step::Purge { .. });
                let ids = id.map(|i| vec![IDS[i].as_bytes().to_vec()]);
                let got = if purge {
                    self.store.dead_purge(&t, ids.as_deref()).await.map_err(|e| fail("purge", e))?
                } else {
                    self.store.dead_requeue(&t, ids.as_deref()).await.map_err(|e| fail("requeue", e))?
                };
                let expected = self.model.dead_op(id.map(|i| IDS[i]), purge);
                if got != expected {
                    return Err(format!("step {n}: {got} dead tasks moved, the model {expected}"));
                }
                format!("{got} moved")
            }
            Step::Pause => {
                let ends = self.store.pause(&t, None).await.map_err(|e| fail("pause", e))?;
                if ends.is_some() {
                    return Err(format!("step {n}: a pause until resumed ends at {ends:?}"));
                }
                self.model.s.paused = true;
                String::new()
            }
            Step::Resume => {
                let was = self.store.resume(&t).await.map_err(|e| fail("resume", e))?;
                if was != self.model.s.paused {
                    return Err(format!("step {n}: resume says paused was {was}, the model {}", self.model.s.paused));
                }
                self.model.s.paused = false;
                String::new()
            }
            Step::Advance { ms } => {
                self.model.now += ms;
                set_clock(self.store, self.clock_key, self.model.now).await.map_err(|e| fail("clock", e))?;
                format!("now {}", self.model.now - START_MS)
            }
        };
        self.trace.push(format!("{n:>3} {step:?} -> {note}"));
        let real = read_state(self.store, &self.store.keys(&t)).await.map_err(|e| fail("read", e))?;
        if real != self.model.s {
            return Err(format!("after step {n} Redis and the model differ:\n{}", difference(&self.model.s, &real)));
        }
        self.model.check_properties(&real).map_err(|e| format!("after step {n}: {e}"))?;
        self.model.settle_down();
        Ok(())
    }
}

fn compare_claim(n: usize, claim: &Claim, expected: &ModelClaim) -> Result<(), String> {
    let got: Vec<_> = claim
        .tasks
        .iter()
        .map(|t| (String::from_utf8_lossy(&t.id).into_owned(), t.due_ms, t.payload.clone(), t.attempt, t.token))
        .collect();
    let dead: Vec<_> =
        claim.dead_lettered.iter().map(|(id, r)| (String::from_utf8_lossy(id).into_owned(), r.clone())).collect();
    if got != expected.tasks || dead != expected.dead || claim.paused != expected.paused {
        return Err(format!(
            "step {n}: the claim handed out {got:?}, dead-lettered {dead:?}, paused {}; the model {:?}, {:?}, paused {}",
            claim.paused, expected.tasks, expected.dead, expected.paused
        ));
    }
    Ok(())
}

async fn set_clock(store: &Store, key: &str, now: i64) -> anyhow::Result<()> {
    let mut conn = store.connection();
    let () = redis::cmd("SET").arg(key).arg(now).query_async(&mut conn).await?;
    Ok(())
}

/// Deletes every key of type `t` (the case is over).
async fn clean(store: &Store, t: &TaskType) -> anyhow::Result<()> {
    let mut conn = store.connection();
    let () = redis::cmd("DEL").arg(&store.keys(t).fixed()[..]).query_async(&mut conn).await?;
    Ok(())
}

/// Runs `steps` as case number `case`: what it covered, or the step that
/// failed with the difference and the trace of the steps before it.
async fn run_case(store: &Store, clock_key: &str, case: usize, steps: &[Step]) -> Result<Coverage, String> {
    let t: TaskType = format!("case{case}").parse().unwrap();
    set_clock(store, clock_key, START_MS).await.map_err(|e| e.to_string())?;
    let mut c = Case { store, clock_key, t: t.clone(), model: Model::new(), runs: Vec::new(), trace: Vec::new() };
    let mut outcome = Ok(());
    for (n, step) in steps.iter().enumerate() {
        if let Err(e) = c.apply(n, step).await {
            outcome = Err(format!("{e}\ntrace:\n{}\n{n:>3} {step:?} -> failed", c.trace.join("\n")));
            break;
        }
    }
    clean(store, &t).await.map_err(|e| e.to_string())?;
    outcome.map(|()| c.model.covered)
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
