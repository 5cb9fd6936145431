//! The path every task takes: claim, settle (with the batching of acks into masks), extend and release.

use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use redis::Value;
use serde::Deserialize;

use crate::reply::{array, bytes, int, opt_bytes, opt_int, score};
use crate::task::{Claim, ClaimedTask, Ended, FollowUp, Lease, Outcome, Settlement};
use crate::task_type::TaskType;
use crate::workflow::entries::encode_followup;
use crate::{Store, duration_ms};

mod entries;
use entries::{BatchEntry, batch_entries};

/// Whether `e` is a CROSSSLOT refusal: keys of several slots in one call.
fn refuses_slots_together(e: &anyhow::Error) -> bool {
    e.chain().filter_map(|c| c.downcast_ref::<redis::RedisError>()).any(|r| r.code() == Some("CROSSSLOT"))
}

/// What a settle committed besides the outcomes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Committed {
    /// Entries it put in the type's outbox: group children's reports, group
    /// work, graphs, and (in a cluster, or where a target's keys were
    /// broken) follow-ups. [`Store::flush_outbox`] moves them on.
    pub outboxed: usize,
    /// Create-only follow-ups delivered in the settle that found their id
    /// waiting or dead-lettered in their type, and left it as it was: (target, id).
    pub kept_existing: Vec<(TaskType, Vec<u8>)>,
}

/// With `fair_by`, how many of the oldest (and of the newest) due tasks a claim looks at.
pub const FAIR_WINDOW: usize = 1000;

/// What one claim may take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimLimits {
    /// Most tasks one claim takes (and most expired leases it reaps).
    pub max_tasks: usize,
    /// Lease of each claimed task.
    pub lease: Duration,
    /// Larger payloads are dead-lettered at claim.
    pub max_payload_bytes: u64,
    /// Longer ids are dead-lettered at claim.
    pub max_id_bytes: usize,
    /// Most tasks of the type leased at once over every host (`max_running`; 0 = no limit).
    pub max_running: u64,
    /// Most tasks of the type handed out per second over every host (`rate`).
    pub rate: Option<Rate>,
    /// Share claims fairly among the keys of task ids: the part before this separator (`fair_by`).
    pub fair_by: Option<String>,
}

impl Default for ClaimLimits {
    fn default() -> Self {
        ClaimLimits {
            max_tasks: 256,
            lease: Duration::from_secs(30),
            max_payload_bytes: 1024 * 1024,
            max_id_bytes: 1024,
            max_running: 0,
            rate: None,
            fair_by: None,
        }
    }
}
/// What extending one lease found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Extended {
    /// The lease runs on.
    Extended,
    /// The lease runs on, but a cancel was asked: stop the run.
    CancelAsked,
    /// The lease was lost (it expired and another host may hold the task).
    Lost,
}
impl Store {
    /// Reaps expired leases, then leases up to `limits.max_tasks` due tasks of type `t`.
    pub async fn claim(&self, t: &TaskType, limits: &ClaimLimits) -> Result<Claim> {
        let k = self.keys(t);
        let mut conn = self.conn.clone();
        let value: Value = self
            .scripts
            .claim
            .key(&k.due)
            .key(&k.payload)
            .key(&k.leases)
            .key(&k.tokens)
            .key(&k.attempts)
            .key(&k.errors)
            .key(&k.dead)
            .key(&k.seq)
            .key(&k.stats)
            .key(&k.recur)
            .key(&k.throttle)
            .key(&k.paused)
            .key(&k.cancels)
            .key(&k.claims)
            .key(&k.claimed)
            .key(&k.member)
            .key(&k.outbox)
            .key(&k.running)
            .key(&k.held)
            .arg(limits.max_tasks.max(1))
            .arg(duration_ms(limits.lease).max(1))
            .arg(limits.max_payload_bytes)
            .arg(limits.max_id_bytes)
            .arg(&*self.holder)
            .arg(limits.max_running)
            .arg(limits.rate.map_or(0.0, |r| r.per_second()))
            .arg(limits.rate.map_or(1.0, |r| r.burst()))
            .arg(limits.fair_by.as_deref().unwrap_or(""))
            .arg(FAIR_WINDOW)
            .arg(t.as_str())
            .invoke_async(&mut conn)
            .await
            .with_context(|| format!("cannot claim {t} tasks"))?;
        parse_claim(t, value).with_context(|| format!("unexpected claim reply for {t}"))
    }

    /// Commits the outcomes of finished tasks of type `t` in one atomic step
    /// (settle.lua), appending one entry per committed outcome to
    /// `P:{T}:events` (capped at about `events_maxlen`) when it is given.
    /// Returns how each ended, and what else it committed ([`Committed`]).
    ///
    /// On one server the acks' follow-ups are delivered to their types in
    /// that same step. In a cluster, where their types' keys are on other
    /// slots, they wait in the type's outbox, as do workflow group reports,
    /// group work and graphs, until [`Store::flush_outbox`] moves them on:
    /// the host does that right after ([`Committed::outboxed`]). A direct
    /// batch refused for anything but an outage (a follow-up's target key
    /// of the wrong type, say) is settled again through the outbox, where an
    /// entry for a broken target waits without holding back the rest.
    pub async fn settle(
        &self,
        t: &TaskType,
        batch: &[Settlement],
        events_maxlen: Option<u64>,
    ) -> Result<(Vec<Ended>, Committed)> {
        if batch.is_empty() {
            return Ok((Vec::new(), Committed::default()));
        }
        let has_followups =
            batch.iter().any(|s| matches!(&s.outcome, Outcome::Ack { followups, .. } if !followups.is_empty()));
        if has_followups && self.direct_followups.load(Ordering::Relaxed) {
            match self.settle_as(t, batch, events_maxlen, true).await {
                Err(e) if refuses_slots_together(&e) => {
                    // A proxy (a managed multi-shard endpoint) that holds each slot apart.
                    tracing::info!(
                        "this Redis refuses keys of several slots in one script: follow-ups go through the outbox"
                    );
                    self.direct_followups.store(false, Ordering::Relaxed);
                }
                Err(e) if crate::classify(&e) != crate::Trouble::Outage => {
                    tracing::debug!(task_type = %t, "settling through the outbox: {e:#}");
                }
                answer => return answer,
            }
        }
        self.settle_as(t, batch, events_maxlen, false).await
    }

    /// One settle.lua call: follow-ups `direct`ly into their types' keys, or into the outbox.
    async fn settle_as(
        &self,
        t: &TaskType,
        batch: &[Settlement],
        events_maxlen: Option<u64>,
        direct: bool,
    ) -> Result<(Vec<Ended>, Committed)> {
        let k = self.keys(t);
        let mut inv = self.scripts.settle.prepare_invoke();
        inv.key(&k.due)
            .key(&k.payload)
            .key(&k.claims)
            .key(&k.claimed)
            .key(&k.attempts)
            .key(&k.errors)
            .key(&k.dead)
            .key(&k.stats)
            .key(&k.outbox)
            .key(&k.events)
            .key(&k.cancels)
            .key(&k.member)
            .key(&k.running)
            .key(&k.held)
            .key(&k.progress)
            .arg(t.as_str())
            .arg(events_maxlen.unwrap_or(0));
        // Direct follow-ups' targets (their shards, and their types), numbered from 1 as their keys follow the 15.
        let mut targets: Vec<(TaskType, &TaskType)> = Vec::new();
        let entries = batch_entries(batch, events_maxlen.is_some(), direct);
        for entry in &entries {
            let s = match entry {
                BatchEntry::Plain { claim, mask, tasks, followups } => {
                    // The acked ids in the mask's order: they leave the running set as sent.
                    let mut in_order: Vec<&(usize, usize)> = tasks.iter().collect();
                    in_order.sort_unstable_by_key(|&&(_, index)| index);
                    inv.arg(if *followups { "f" } else { "m" }).arg(*claim).arg(mask.as_slice()).arg(in_order.len());
                    for &&(i, _) in &in_order {
                        inv.arg(&batch[i].lease.id);
                    }
                    if *followups {
                        let of = |i: usize| match &batch[i].outcome {
                            Outcome::Ack { followups, .. } => followups.as_slice(),
                            _ => &[][..],
                        };
                        for &&(i, _) in &in_order {
                            inv.arg(of(i).len());
                        }
                        for &&(i, _) in &in_order {
                            for f in of(i) {
                                let arg = self.direct_followup(f, &mut inv, &mut targets);
                                inv.arg(arg);
                            }
                        }
                    }
                    continue;
                }
                BatchEntry::Full(i) => &batch[*i],
            };
            let (kind, delay_ms, error, followups) = match &s.outcome {
                Outcome::Ack { followups, .. } => ("ack", 0, "", followups.as_slice()),
                Outcome::Retry { delay, error, .. } => ("retry", duration_ms(*delay), error.as_str(), &[][..]),
                Outcome::Dead { error } => ("dead", 0, error.as_str(), &[][..]),
                Outcome::Cancelled => ("cancel", 0, "", &[][..]),
            };
            inv.arg(kind)
                .arg(&s.lease.id)
                .arg(s.lease.token)
                .arg(s.lease.claim)
                .arg(s.run.attempt)
                .arg(s.run.due_ms)
                .arg(s.run.started_ms);
            let (groups, graphs) = match &s.outcome {
                Outcome::Ack { groups, graphs, .. } => (groups.as_slice(), graphs.as_slice()),
                _ => (&[][..], &[][..]),
            };
            // A retry carries its run's last progress, kept with the task.
            let progress = match &s.outcome {
                Outcome::Retry { progress: Some(p), .. } => {
                    Some(format!("p{}", super::progress::stored_value(p, s.run.attempt, s.run.finished_ms)))
                }
                _ => None,
            };
            let items = followups.len() + groups.len() + graphs.len() + usize::from(progress.is_some());
            inv.arg(s.run.finished_ms).arg(delay_ms).arg(error).arg(items);
            if let Some(p) = progress {
                inv.arg(p);
            }
            for f in followups {
                let arg = if direct {
                    self.direct_followup(f, &mut inv, &mut targets)
                } else {
                    let mut arg = vec![if f.replace { b'r' } else { b'c' }];
                    arg.extend(encode_followup(f));
                    arg
                };
                inv.arg(arg);
            }
            for g in groups {
                let mut arg = vec![b'g'];
                arg.extend(crate::workflow::entries::encode_work(g));
                inv.arg(arg);
            }
            for g in graphs {
                let mut arg = vec![b'G'];
                arg.extend(serde_json::to_vec(g)?);
                inv.arg(arg);
            }
        }
        let mut conn = self.conn.clone();
        let mut replies: Vec<Value> =
            inv.invoke_async(&mut conn).await.with_context(|| format!("cannot settle {} {t} tasks", batch.len()))?;
        let kept = replies.pop().map(array).transpose().context("settle: no list of follow-ups kept")?;
        let outboxed = replies.pop().map(int).transpose().context("settle: no count of outbox entries")?;
        if replies.len() != entries.len() {
            bail!("settle of {t}: {} results for {} entries", replies.len(), entries.len());
        }
        let mut committed = Committed { outboxed: outboxed.unwrap_or(0) as usize, kept_existing: Vec::new() };
        let mut kept = kept.unwrap_or_default().into_iter();
        while let (Some(number), Some(id)) = (kept.next(), kept.next()) {
            let number = int(number).context("settle: a kept follow-up's target is not a number")?;
            let target = usize::try_from(number - 1).ok().and_then(|at| targets.get(at));
            let (_, target) =
                target.with_context(|| format!("settle: a kept follow-up's target {number} is unknown"))?;
            committed.kept_existing.push(((*target).clone(), bytes(id).context("settle: a kept follow-up's id")?));
        }
        let mut results = vec![Ended::Fenced; batch.len()];
        for (entry, reply) in entries.iter().zip(replies) {
            match entry {
                BatchEntry::Plain { tasks, .. } => {
                    let taken = crate::reply::bytes(reply).context("settle: a claim's acks are not a mask")?;
                    for &(i, index) in tasks {
                        if taken.get(index) == Some(&b'1') {
                            results[i] = Ended::Succeeded;
                        }
                    }
                }
                BatchEntry::Full(i) => {
                    let name = crate::reply::bytes(reply).context("settle: a task's end is not a name")?;
                    results[*i] = std::str::from_utf8(&name)
                        .ok()
                        .and_then(Ended::from_name)
                        .with_context(|| format!("settle: unknown end {:?}", String::from_utf8_lossy(&name)))?;
                }
            }
        }
        Ok((results, committed))
    }

    /// A follow-up's settle argument for delivery in the settle itself
    /// (settle.lua's 'd'), its target's three keys added to `inv` the first
    /// time `targets` (numbered from 1) meets it.
    fn direct_followup<'f>(
        &self,
        f: &'f FollowUp,
        inv: &mut redis::ScriptInvocation<'_>,
        targets: &mut Vec<(TaskType, &'f TaskType)>,
    ) -> Vec<u8> {
        let target = self.shard_for(&f.task_type, &f.id);
        let number = match targets.iter().position(|(known, _)| *known == target) {
            Some(at) => at + 1,
            None => {
                let tk = self.keys(&target);
                inv.key(&tk.due).key(&tk.payload).key(&tk.dead);
                targets.push((target, &f.task_type));
                targets.len()
            }
        };
        let mode = if f.replace { 'r' } else { 'c' };
        let mut arg = format!("d{number},{mode},{},{},", f.due_ms, f.id.len()).into_bytes();
        arg.reserve(f.id.len() + f.payload.len());
        arg.extend_from_slice(&f.id);
        arg.extend_from_slice(&f.payload);
        arg
    }

    /// Extends the leases of running tasks to now + `lease_ms`.
    pub async fn extend(&self, t: &TaskType, leases: &[Lease], lease_ms: u64) -> Result<Vec<Extended>> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let k = self.keys(t);
        let mut inv = self.scripts.extend.prepare_invoke();
        inv.key(&k.claims).key(&k.claimed).key(&k.cancels).arg(lease_ms.max(1));
        for lease in leases {
            inv.arg(&lease.id).arg(lease.token).arg(lease.claim);
        }
        let mut conn = self.conn.clone();
        let flags: Vec<i64> =
            inv.invoke_async(&mut conn).await.with_context(|| format!("cannot extend {} {t} leases", leases.len()))?;
        Ok(flags
            .into_iter()
            .map(|f| match f {
                1 => Extended::Extended,
                2 => Extended::CancelAsked,
                _ => Extended::Lost,
            })
            .collect())
    }

    /// Hands leased tasks back, due now, without counting the attempt; returns how many.
    pub async fn release(&self, t: &TaskType, leases: &[Lease]) -> Result<usize> {
        if leases.is_empty() {
            return Ok(0);
        }
        let k = self.keys(t);
        let mut inv = self.scripts.release.prepare_invoke();
        inv.key(&k.claims).key(&k.claimed).key(&k.due).key(&k.running).key(&k.held);
        for lease in leases {
            inv.arg(&lease.id).arg(lease.token).arg(lease.claim);
        }
        let mut conn = self.conn.clone();
        let n: usize =
            inv.invoke_async(&mut conn).await.with_context(|| format!("cannot release {} {t} leases", leases.len()))?;
        Ok(n)
    }
}

/// A rate limit: tasks per second, minute or hour (`50/s`, `100/m`, `1000/h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct Rate {
    count: u32,
    per: Duration,
}

impl Rate {
    /// Tasks per second.
    pub fn per_second(&self) -> f64 {
        f64::from(self.count) / self.per.as_secs_f64()
    }

    /// One of `parts` equal parts of this rate (a shard's, of a type with `parts` shards).
    pub fn split(self, parts: u16) -> Rate {
        Rate { count: self.count, per: self.per * u32::from(parts.max(1)) }
    }

    /// The most tasks the bucket lets out at once: 50 ms worth, at least one,
    /// so that any one-second window sees at most 5% over the rate.
    pub fn burst(&self) -> f64 {
        (self.per_second() / 20.0).max(1.0)
    }
}

impl std::fmt::Display for Rate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let unit = match self.per.as_secs() {
            1 => "s",
            60 => "m",
            _ => "h",
        };
        write!(f, "{}/{unit}", self.count)
    }
}

impl TryFrom<String> for Rate {
    type Error = String;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        let bad = || format!("invalid rate {s:?}: expected <count>/s, /m or /h, like \"50/s\"");
        let (count, unit) = s.split_once('/').ok_or_else(bad)?;
        let count: u32 = count.trim().parse().map_err(|_| bad())?;
        let per = match unit.trim() {
            "s" | "sec" | "second" => Duration::from_secs(1),
            "m" | "min" | "minute" => Duration::from_secs(60),
            "h" | "hour" => Duration::from_secs(3600),
            _ => return Err(bad()),
        };
        if count == 0 {
            return Err(format!("invalid rate {s:?}: the count must be at least 1"));
        }
        Ok(Rate { count, per })
    }
}

fn parse_claim(t: &TaskType, value: Value) -> Result<Claim> {
    let mut top = array(value)?.into_iter();
    let mut next = || top.next().ok_or_else(|| anyhow!("short reply"));
    let now_ms = int(next()?)?;
    let claimed = array(next()?)?;
    // Both absent (false, read as nil) when no task has a payload or a retried attempt.
    let payloads = opt_array(next()?)?;
    let attempts = opt_array(next()?)?;
    let dead = array(next()?)?;
    let next_due_ms = score(next()?)?;
    let next_lease_expiry_ms = score(next()?)?;
    let lease_expiry_ms = int(next()?)?;
    let first_token = u64::try_from(int(next()?)?).context("negative token")?;
    let throttled_ms = opt_int(top.next().unwrap_or(Value::Nil))?;
    let paused = opt_int(top.next().unwrap_or(Value::Nil))?.unwrap_or(0) == 1;

    let n = claimed.len() / 2;
    if claimed.len() % 2 != 0 || dead.len() % 2 != 0 {
        bail!("odd list lengths");
    }
    if payloads.as_ref().is_some_and(|p| p.len() != n) || attempts.as_ref().is_some_and(|a| a.len() != n) {
        bail!("payloads or attempts do not match the {n} tasks claimed");
    }
    let mut payloads = payloads.map(Vec::into_iter);
    let mut attempts = attempts.map(Vec::into_iter);
    let mut tasks = Vec::with_capacity(n);
    let mut it = claimed.into_iter();
    let mut token = first_token;
    while let (Some(id), Some(due)) = (it.next(), it.next()) {
        let payload = match payloads.as_mut().and_then(Iterator::next) {
            Some(p) => opt_bytes(p)?.unwrap_or_default(),
            None => Vec::new(),
        };
        let attempt = match attempts.as_mut().and_then(Iterator::next) {
            Some(a) => u32::try_from(int(a)?).unwrap_or(u32::MAX),
            None => 1,
        };
        tasks.push(ClaimedTask {
            task_type: t.clone(),
            id: bytes(id)?,
            payload,
            attempt,
            due_ms: score(due)?.unwrap_or(0),
            token,
            claim: first_token,
        });
        token += 1;
    }
    let mut dead_lettered = Vec::with_capacity(dead.len() / 2);
    let mut it = dead.into_iter();
    while let (Some(id), Some(reason)) = (it.next(), it.next()) {
        dead_lettered.push((bytes(id)?, String::from_utf8_lossy(&bytes(reason)?).into_owned()));
    }
    Ok(Claim { now_ms, tasks, dead_lettered, next_due_ms, next_lease_expiry_ms, lease_expiry_ms, throttled_ms, paused })
}

/// An array, or `None` for the nil a script's `false` becomes.
fn opt_array(v: Value) -> Result<Option<Vec<Value>>> {
    match v {
        Value::Nil => Ok(None),
        other => array(other).map(Some),
    }
}
