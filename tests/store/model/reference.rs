//! The reference model of the random test: every script's rules restated in plain Rust, and the properties it checks.

use std::collections::{BTreeMap, BTreeSet};

use hourglass_store::task::{Ended, Lease};
use hourglass_store::{Extended, ScheduleMode};

use super::{Coverage, End, HOLDERS, MAX_ID_BYTES, MAX_PAYLOAD_BYTES, START_MS};

// ---------------------------------------------------------------- the state

/// Everything Redis holds for the type, as the test reads it (and as the model predicts it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct State {
    pub(super) due: BTreeMap<String, i64>,
    pub(super) payload: BTreeMap<String, Vec<u8>>,
    pub(super) dead: BTreeMap<String, i64>,
    pub(super) attempts: BTreeMap<String, String>,
    pub(super) errors: BTreeMap<String, String>,
    /// id → the lease token a cancel asked to stop.
    pub(super) cancels: BTreeMap<String, String>,
    /// claim id → lease expiry.
    pub(super) claims: BTreeMap<String, i64>,
    /// claim id → which of its tasks are leased ('1') or left ('0').
    pub(super) live: BTreeMap<String, String>,
    /// The `leased` counter of `claimed` (tasks leased under claims).
    pub(super) leased: i64,
    /// The ids leased under claims (and the member that keeps the set a hash table).
    pub(super) running: BTreeSet<String>,
    /// id → `<due the client gave>:<due while held>`, of schedules waiting for an earlier run.
    pub(super) held: BTreeMap<String, String>,
    /// The non-zero counters of the type's stats.
    pub(super) stats: BTreeMap<String, i64>,
    pub(super) seq: i64,
    pub(super) paused: bool,
    /// Completion events written.
    pub(super) events: usize,
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
pub(super) struct Run {
    pub(super) lease: Lease,
    pub(super) attempt: u32,
}

/// The reference model: the scripts' rules, written out in Rust.
#[derive(Debug, Default)]
pub(super) struct Model {
    pub(super) covered: Coverage,
    pub(super) now: i64,
    pub(super) s: State,
    claims: BTreeMap<u64, ClaimRecord>,
    /// Ids a client scheduled while they were leased: the one case where a task may be
    /// due and leased at once (the new schedule waits for the run to end).
    scheduled_while_leased: BTreeSet<String>,
    /// Ids whose last end took them out for good (ack, cancel, purge): the only ones
    /// allowed to be neither due, nor leased, nor dead.
    ended: BTreeSet<String>,
    pub(super) known: BTreeSet<String>,
}

fn count(stats: &mut BTreeMap<String, i64>, field: &str, n: i64) {
    if n != 0 {
        *stats.entry(field.to_owned()).or_default() += n;
    }
}

impl Model {
    pub(super) fn new() -> Model {
        Model { now: START_MS, ..Model::default() }
    }

    /// The claim and index a lease names, when that task is still leased under it (the scripts' `leased_in`).
    pub(super) fn leased_in(&self, lease: &Lease) -> Option<(u64, usize)> {
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

    pub(super) fn schedule(&mut self, id: &str, due: i64, payload: &[u8], mode: ScheduleMode) -> bool {
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
    pub(super) fn claim(&mut self, holder: usize, max: usize, lease_ms: u64, max_running: u64) -> ModelClaim {
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
    pub(super) fn settle(&mut self, run: &Run, end: End, events: bool) -> Ended {
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

    pub(super) fn extend(&mut self, run: &Run, lease_ms: u64) -> Extended {
        let Some((c, _)) = self.leased_in(&run.lease) else { return Extended::Lost };
        self.s.claims.insert(c.to_string(), self.now + lease_ms as i64);
        let id = String::from_utf8_lossy(&run.lease.id).into_owned();
        if self.s.cancels.get(&id) == Some(&run.lease.token.to_string()) {
            Extended::CancelAsked
        } else {
            Extended::Extended
        }
    }

    /// Hands runs back, due now (a client's schedule wins); returns how many.
    pub(super) fn release(&mut self, runs: &[&Run]) -> usize {
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
    pub(super) fn cancel(&mut self, id: &str) -> CancelModel {
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
    pub(super) fn dead_op(&mut self, ids: Option<&str>, purge: bool) -> u64 {
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
    pub(super) fn check_properties(&self, real: &State) -> Result<(), String> {
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
    pub(super) fn settle_down(&mut self) {
        let still: BTreeSet<String> =
            self.scheduled_while_leased.iter().filter(|id| !self.leases_of(id).is_empty()).cloned().collect();
        self.scheduled_while_leased = still;
    }
}

#[derive(Debug, Default)]
pub(super) struct ModelClaim {
    pub(super) tasks: Vec<(String, i64, Vec<u8>, u32, u64)>,
    pub(super) dead: Vec<(String, String)>,
    pub(super) paused: bool,
    /// Due ids not handed out because an earlier run of theirs still holds its lease.
    pub(super) held: Vec<String>,
}

pub(super) enum CancelModel {
    Scheduled,
    Running(Vec<(String, &'static str)>),
    Unknown,
}
