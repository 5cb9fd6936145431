//! Task operations: schedule, cancel, claim, settle, extend, release, and the outbox that carries follow-ups.
//!
//! Long: the Rust side of the task scripts, each call beside the encoding of its arguments and reply; 60 lines are tests.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use redis::Value;

use super::groups::{GroupDelivery, GroupMoves};
use super::reply::parse_claim;
use super::{BATCH, Store, duration_ms};
use crate::task::{Claim, FollowUp, Lease, Outcome, SettleResult, Settlement};
use crate::task_type::TaskType;

/// With `fair_by`, how many of the oldest (and of the newest) due tasks a claim looks at.
pub const FAIR_WINDOW: usize = 1000;

/// What `schedule` does to an id that is already scheduled (the variants of `ZADD`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ScheduleMode {
    /// `ZADD`: the new due time replaces the old one (upsert).
    #[default]
    Upsert,
    /// `ZADD NX`: keep the first schedule (dedupe).
    IfAbsent,
    /// `ZADD GT`: only postpone (a debounce).
    OnlyLater,
    /// `ZADD LT`: only bring forward.
    OnlyEarlier,
}

impl ScheduleMode {
    fn as_str(self) -> &'static str {
        match self {
            ScheduleMode::Upsert => "upsert",
            ScheduleMode::IfAbsent => "if-absent",
            ScheduleMode::OnlyLater => "only-later",
            ScheduleMode::OnlyEarlier => "only-earlier",
        }
    }
}

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
    pub rate: Option<crate::config::Rate>,
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

/// What a cancel did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cancelled {
    /// It was scheduled: removed, with its payload.
    Scheduled,
    /// It runs on host `holder`, which was asked to stop it.
    Running {
        /// The host that holds its lease ("" when that host records no id).
        holder: String,
    },
    /// Neither scheduled nor running.
    Unknown,
}

/// What extending one lease found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Extended {
    /// The lease runs on.
    Extended,
    /// The lease runs on, but a cancel was asked: stop the run.
    Cancelled,
    /// The lease was lost (it expired and another host may hold the task).
    Lost,
}

/// What one pass over an outbox did.
#[derive(Debug, Default)]
pub struct OutboxFlush {
    /// Entries moved on (delivered, or delivered before and now cleared).
    pub moved: usize,
    /// Types that received follow-ups.
    pub delivered_to: Vec<TaskType>,
    /// Entries left in the outbox because their target type's keys are broken.
    pub failed: Vec<(TaskType, anyhow::Error)>,
    /// Create-only follow-ups not delivered because their id was waiting or
    /// dead-lettered in their type: (type, id); handled, not retried.
    pub kept_existing: Vec<(TaskType, Vec<u8>)>,
    /// Workflow groups opened, completed, or whose work was refused (see [`GroupMoves`]).
    pub groups: GroupMoves,
}

impl Store {
    /// Schedules (or re-schedules) a task, as an app would: payload and due
    /// time in one atomic step; `mode` picks what happens to an id already
    /// scheduled. Returns whether the due time was written.
    pub async fn schedule(
        &self,
        t: &TaskType,
        id: &[u8],
        due_ms: i64,
        payload: Option<&[u8]>,
        mode: ScheduleMode,
    ) -> Result<bool> {
        let t = &self.shard_for(t, id);
        let k = self.keys(t);
        let mut conn = self.conn.clone();
        let payload = payload.unwrap_or_default();
        let written: i64 = self
            .scripts
            .schedule
            .key(&k.due)
            .key(&k.payload)
            .arg(id)
            .arg(due_ms)
            .arg(payload)
            .arg(if payload.is_empty() { "0" } else { "1" })
            .arg(mode.as_str())
            .invoke_async(&mut conn)
            .await
            .with_context(|| format!("cannot schedule a {t} task"))?;
        Ok(written == 1)
    }

    /// Waits until `replicas` replicas acknowledged this connection's writes,
    /// or `timeout` passed (Redis `WAIT`); returns how many did.
    pub async fn wait_replicas(&self, replicas: u32, timeout: Duration) -> Result<u32> {
        if self.target.is_cluster() {
            // WAIT counts the writes of its own connection to one node; a cluster
            // connection may send it to another node than the slot's master.
            bail!(
                "--wait-replicas is not supported on a Redis Cluster; use WAIT from a client connected to the slot's master"
            );
        }
        let mut conn = self.conn.clone();
        let acked: i64 = redis::cmd("WAIT")
            .arg(replicas)
            .arg(duration_ms(timeout))
            .query_async(&mut conn)
            .await
            .context("cannot wait for replicas (WAIT)")?;
        Ok(u32::try_from(acked).unwrap_or(0))
    }

    /// Pauses type `t` (every shard) on every host, for `length` or until resumed; returns
    /// when the pause ends (ms since the epoch), `None` for "until resumed".
    pub async fn pause(&self, t: &TaskType, length: Option<Duration>) -> Result<Option<i64>> {
        let mut ends = None;
        for shard in self.shards_of(t) {
            ends = self.pause_in(&shard, length).await?;
        }
        Ok(ends)
    }

    async fn pause_in(&self, t: &TaskType, length: Option<Duration>) -> Result<Option<i64>> {
        let k = self.keys(t);
        let mut conn = self.conn.clone();
        let ends: i64 = self
            .scripts
            .pause
            .key(&k.paused)
            .key(&k.due)
            .arg(length.map_or(0, duration_ms))
            .invoke_async(&mut conn)
            .await
            .with_context(|| format!("cannot pause {t}"))?;
        Ok((ends > 0).then_some(ends))
    }

    /// Resumes a paused type (every shard); false when it was not paused.
    pub async fn resume(&self, t: &TaskType) -> Result<bool> {
        let mut resumed = false;
        for shard in self.shards_of(t) {
            resumed |= self.resume_in(&shard).await?;
        }
        Ok(resumed)
    }

    async fn resume_in(&self, t: &TaskType) -> Result<bool> {
        let k = self.keys(t);
        let mut conn = self.conn.clone();
        let resumed: i64 = self
            .scripts
            .resume
            .key(&k.paused)
            .key(&k.due)
            .invoke_async(&mut conn)
            .await
            .with_context(|| format!("cannot resume {t}"))?;
        Ok(resumed == 1)
    }

    /// Whether task `id` of `t` is leased (claimed and not yet settled) now.
    pub async fn leased(&self, t: &TaskType, id: &[u8]) -> Result<bool> {
        Ok(self.show(t, id).await?.running.is_some())
    }

    /// The channel hosts listen on for cancels of running tasks.
    pub fn cancel_channel(&self) -> String {
        format!("{}:cancel", self.prefix)
    }

    /// Cancels a task: removes it when scheduled; when running, asks its host to stop it.
    /// Of a sharded type, in the shard it is in (its own first, then the others).
    pub async fn cancel(&self, t: &TaskType, id: &[u8]) -> Result<Cancelled> {
        for shard in self.lookup_order(t, id) {
            match self.cancel_in(&shard, id).await? {
                Cancelled::Unknown => continue,
                found => return Ok(found),
            }
        }
        Ok(Cancelled::Unknown)
    }

    async fn cancel_in(&self, t: &TaskType, id: &[u8]) -> Result<Cancelled> {
        let k = self.keys(t);
        let mut conn = self.conn.clone();
        let reply: Vec<String> = self
            .scripts
            .cancel
            .key(&k.due)
            .key(&k.payload)
            .key(&k.tokens)
            .key(&k.claimed)
            .key(&k.cancels)
            .key(&k.member)
            .key(&k.outbox)
            .key(&k.seq)
            .key(&k.held)
            .arg(id)
            .arg(t.as_str())
            .arg(self.cancel_channel())
            .invoke_async(&mut conn)
            .await
            .with_context(|| format!("cannot cancel a {t} task"))?;
        if reply.get(1).is_some_and(|r| r == "1") {
            // A group's child: its report waits in the outbox; a host's heartbeat
            // would move it on too, this only saves the group that wait.
            if let Err(e) = self.flush_outbox(t).await {
                tracing::warn!(task_type = %t, "cannot deliver a cancelled child's report now: {e:#}");
            }
        }
        Ok(match reply.first().map(String::as_str) {
            Some("scheduled") => Cancelled::Scheduled,
            Some("running") => Cancelled::Running { holder: reply.get(1).cloned().unwrap_or_default() },
            _ => Cancelled::Unknown,
        })
    }

    /// The W3C traceparents clients attached to `ids` of `t` in `P:{T}:trace`
    /// (`None` where there is none), in one HMGET; read only while tracing is on.
    pub async fn trace_parents(&self, t: &TaskType, ids: &[Vec<u8>]) -> Result<Vec<Option<String>>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let k = self.keys(t);
        let mut conn = self.conn.clone();
        let found: Vec<Option<Vec<u8>>> = redis::cmd("HMGET")
            .arg(&k.trace)
            .arg(ids)
            .query_async(&mut conn)
            .await
            .with_context(|| format!("cannot read {}", k.trace))?;
        Ok(found.into_iter().map(|p| p.and_then(|p| String::from_utf8(p).ok())).collect())
    }

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
    /// Follow-ups committed with acks wait in the type's outbox until
    /// [`Store::flush_outbox`] moves them on: the host does that right after.
    pub async fn settle(
        &self,
        t: &TaskType,
        batch: &[Settlement],
        events_maxlen: Option<u64>,
    ) -> Result<Vec<SettleResult>> {
        Ok(self.settle_reporting(t, batch, events_maxlen).await?.0)
    }

    /// [`Store::settle`], and how many reports of workflow group children
    /// that ended it put in the outbox (for [`Store::flush_outbox`]).
    pub async fn settle_reporting(
        &self,
        t: &TaskType,
        batch: &[Settlement],
        events_maxlen: Option<u64>,
    ) -> Result<(Vec<SettleResult>, usize)> {
        if batch.is_empty() {
            return Ok((Vec::new(), 0));
        }
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
            .arg(t.as_str())
            .arg(events_maxlen.unwrap_or(0));
        let entries = settle_entries(batch, events_maxlen.is_some());
        for entry in &entries {
            let s = match entry {
                SettleEntry::Plain { claim, mask, tasks } => {
                    // The acked ids in the mask's order: they leave the running set as sent.
                    let mut in_order: Vec<&(usize, usize)> = tasks.iter().collect();
                    in_order.sort_unstable_by_key(|&&(_, index)| index);
                    inv.arg("m").arg(*claim).arg(mask.as_slice()).arg(in_order.len());
                    for &&(i, _) in &in_order {
                        inv.arg(&batch[i].lease.id);
                    }
                    continue;
                }
                SettleEntry::Full(i) => &batch[*i],
            };
            let (kind, delay_ms, error, followups) = match &s.outcome {
                Outcome::Ack { followups, .. } => ("ack", 0, "", followups.as_slice()),
                Outcome::Retry { delay, error } => ("retry", duration_ms(*delay), error.as_str(), &[][..]),
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
            let groups = match &s.outcome {
                Outcome::Ack { groups, .. } => groups.as_slice(),
                _ => &[],
            };
            inv.arg(s.run.finished_ms).arg(delay_ms).arg(error).arg(followups.len() + groups.len());
            for f in followups {
                let mut arg = vec![if f.replace { b'r' } else { b'c' }];
                arg.extend(encode_followup(f));
                inv.arg(arg);
            }
            for g in groups {
                let mut arg = vec![b'g'];
                arg.extend(super::groups::encode_work(g));
                inv.arg(arg);
            }
        }
        let mut conn = self.conn.clone();
        let mut replies: Vec<Value> =
            inv.invoke_async(&mut conn).await.with_context(|| format!("cannot settle {} {t} tasks", batch.len()))?;
        let reports = replies.pop().map(super::reply::int).transpose().context("settle: no count of group reports")?;
        if replies.len() != entries.len() {
            bail!("settle of {t}: {} results for {} entries", replies.len(), entries.len());
        }
        // Follow-ups committed with acks wait in the outbox; the caller moves them on (`flush_outbox`).
        let mut results = vec![SettleResult::Fenced; batch.len()];
        for (entry, reply) in entries.iter().zip(replies) {
            match entry {
                SettleEntry::Plain { tasks, .. } => {
                    let taken = super::reply::bytes(reply).context("settle: a claim's acks are not a mask")?;
                    for &(i, index) in tasks {
                        if taken.get(index) == Some(&b'1') {
                            results[i] = SettleResult::Settled;
                        }
                    }
                }
                SettleEntry::Full(i) => {
                    results[*i] = match super::reply::int(reply).context("settle: a task's result is not a number")? {
                        1 => SettleResult::Settled,
                        2 => SettleResult::Cancelled,
                        3 => SettleResult::Rescheduled,
                        _ => SettleResult::Fenced,
                    }
                }
            }
        }
        Ok((results, reports.unwrap_or(0) as usize))
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
                2 => Extended::Cancelled,
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

    /// Moves every follow-up in `t`'s outbox into its target type's due set
    /// (exactly once, see `deliver.lua`). An entry whose target type's keys
    /// are broken stays in the outbox and is reported in [`OutboxFlush::failed`];
    /// a connection error stops the flush.
    pub async fn flush_outbox(&self, t: &TaskType) -> Result<OutboxFlush> {
        let k = self.keys(t);
        let mut conn = self.conn.clone();
        let mut flushed = OutboxFlush::default();
        let mut cursor: u64 = 0;
        loop {
            let (next, flat): (u64, Vec<Vec<u8>>) = redis::cmd("HSCAN")
                .arg(&k.outbox)
                .arg(cursor)
                .arg("COUNT")
                .arg(BATCH)
                .query_async(&mut conn)
                .await
                .with_context(|| format!("cannot read the {t} outbox"))?;
            // Children's ends are delivered together after the page, a batch per callback type.
            let mut reports = Vec::new();
            for pair in flat.chunks_exact(2) {
                let (entry_id, encoded) = (&pair[0], &pair[1]);
                // What can never be delivered (corrupt) is logged and dropped, to keep the outbox moving.
                let undeliverable = if entry_id.ends_with(super::groups::REPORT) {
                    match super::groups::decode_report(entry_id, encoded) {
                        Ok(report) => {
                            reports.push((entry_id.clone(), report));
                            continue;
                        }
                        Err(e) => Some(e),
                    }
                } else if entry_id.ends_with(super::groups::WORK) {
                    match self.deliver_work(entry_id, encoded, &mut flushed.groups).await {
                        Ok(()) => None,
                        Err(GroupDelivery::Bad(e)) => Some(e),
                        Err(GroupDelivery::Waits(target, e)) => {
                            flushed.failed.push((target, e));
                            continue;
                        }
                        Err(GroupDelivery::Outage(e)) => return Err(e),
                    }
                } else {
                    match decode_followup(entry_id, encoded) {
                        Err(e) => Some(e),
                        Ok(f) => {
                            if !self.deliver_followup(t, entry_id, f, &mut flushed).await? {
                                continue;
                            }
                            None
                        }
                    }
                };
                if let Some(e) = undeliverable {
                    tracing::error!(task_type = %t, "dropping a bad outbox entry: {e:#}");
                }
                let _: i64 = redis::cmd("HDEL")
                    .arg(&k.outbox)
                    .arg(entry_id)
                    .query_async(&mut conn)
                    .await
                    .with_context(|| format!("cannot clear the {t} outbox"))?;
                flushed.moved += 1;
            }
            self.deliver_reports(t, reports, &mut flushed).await?;
            cursor = next;
            if cursor == 0 {
                return Ok(flushed);
            }
        }
    }

    /// Delivers follow-up `f` (outbox entry `entry_id` of `t`) to its type,
    /// exactly once (deliver.lua's marker). Returns whether the entry is done
    /// with: `false` when the target's keys are broken and it waits.
    async fn deliver_followup(
        &self,
        t: &TaskType,
        entry_id: &[u8],
        f: FollowUp,
        flushed: &mut OutboxFlush,
    ) -> Result<bool> {
        // Into the shard of the target type that holds the follow-up's id.
        let tk = self.keys(&self.shard_for(&f.task_type, &f.id));
        let mut conn = self.conn.clone();
        let delivered: Result<i64> = self
            .scripts
            .deliver
            .key(&tk.due)
            .key(&tk.payload)
            .key(tk.delivered(entry_id))
            .key(&tk.dead)
            .arg(&f.id)
            .arg(f.due_ms)
            .arg(&f.payload)
            .arg(if f.payload.is_empty() { "0" } else { "1" })
            .arg(if f.replace { "replace" } else { "create" })
            .invoke_async(&mut conn)
            .await
            .with_context(|| format!("cannot deliver a follow-up from {t} to {}", f.task_type));
        match delivered {
            Ok(2) => flushed.kept_existing.push((f.task_type, f.id)),
            Ok(_) => {
                if !flushed.delivered_to.contains(&f.task_type) {
                    flushed.delivered_to.push(f.task_type.clone());
                }
            }
            Err(e) if crate::health::classify(&e) != crate::health::Trouble::Outage => {
                // The target's keys are broken: the entry waits in the outbox.
                flushed.failed.push((f.task_type, e));
                return Ok(false);
            }
            Err(e) => return Err(e),
        }
        Ok(true)
    }
}

/// How an outbox entry id ends when its follow-up is create-only (settle.lua).
const CREATE_ONLY: &[u8] = b":create";

/// Encodes a follow-up for the outbox: `<type>\n<due_ms>\n<id_len>\n<id><payload>`
/// (binary-safe). Whether it may replace is in the entry id (settle.lua).
pub fn encode_followup(f: &FollowUp) -> Vec<u8> {
    let mut out = format!("{}\n{}\n{}\n", f.task_type, f.due_ms, f.id.len()).into_bytes();
    out.extend_from_slice(&f.id);
    out.extend_from_slice(&f.payload);
    out
}

/// Decodes the outbox entry `entry_id` holding what [`encode_followup`] wrote.
pub fn decode_followup(entry_id: &[u8], data: &[u8]) -> Result<FollowUp> {
    let mut parts = data.splitn(4, |&b| b == b'\n');
    let mut text = |what: &str| -> Result<&str> {
        let part = parts.next().ok_or_else(|| anyhow!("outbox entry has no {what}"))?;
        std::str::from_utf8(part).with_context(|| format!("outbox entry {what} is not text"))
    };
    let task_type: TaskType = text("type")?.parse()?;
    let due_ms: i64 = text("due time")?.parse().context("bad due time in outbox entry")?;
    let id_len: usize = text("id length")?.parse().context("bad id length in outbox entry")?;
    let rest = parts.next().unwrap_or_default();
    if rest.len() < id_len {
        bail!("outbox entry is truncated");
    }
    let (id, payload) = rest.split_at(id_len);
    let replace = !entry_id.ends_with(CREATE_ONLY);
    Ok(FollowUp { task_type, id: id.to_vec(), payload: payload.to_vec(), due_ms, replace })
}

/// One entry of a settle call: the plain acks of one claim as a mask, or one task in full.
#[derive(Debug, PartialEq, Eq)]
enum SettleEntry {
    /// Acks with nothing else to write (no follow-ups, no events) of tasks of
    /// `claim`: byte i of `mask` is `1` for its task i (from 0, the token
    /// minus the claim id); `tasks` maps batch indexes to i.
    Plain { claim: u64, mask: Vec<u8>, tasks: Vec<(usize, usize)> },
    /// The batch index of a task sent with its outcome in full.
    Full(usize),
}

/// Most tasks one claim holds (claim.lua caps a claim at this many).
const CLAIM_MAX: u64 = 65535;

/// The entries of one settle call for `batch`, in the order each first
/// appears: acks of the same claim share one mask, so settling a whole
/// claim sends three arguments, not four per task.
fn settle_entries(batch: &[Settlement], events: bool) -> Vec<SettleEntry> {
    let mut entries = Vec::new();
    let mut masks: HashMap<u64, usize> = HashMap::new(); // claim → its entry
    for (i, s) in batch.iter().enumerate() {
        let plain = !events
            && matches!(&s.outcome, Outcome::Ack { followups, groups } if followups.is_empty() && groups.is_empty());
        let Lease { token, claim, .. } = s.lease;
        let index = token.checked_sub(claim).filter(|&k| k < CLAIM_MAX);
        let (true, Some(index)) = (plain, index) else {
            entries.push(SettleEntry::Full(i));
            continue;
        };
        let at = *masks.entry(claim).or_insert_with(|| {
            entries.push(SettleEntry::Plain { claim, mask: Vec::new(), tasks: Vec::new() });
            entries.len() - 1
        });
        let SettleEntry::Plain { mask, tasks, .. } = &mut entries[at] else {
            unreachable!("masks index plain entries")
        };
        let index = index as usize;
        if mask.len() <= index {
            mask.resize(index + 1, b'0');
        }
        mask[index] = b'1';
        tasks.push((i, index));
    }
    entries
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::task::RunInfo;

    #[test]
    fn followup_encoding_round_trips() {
        let f = FollowUp {
            task_type: "a.b".parse().unwrap(),
            id: vec![0, 10, 255, b'\n'],
            payload: vec![b'\n', 0, 1],
            due_ms: -5,
            replace: true,
        };
        assert_eq!(decode_followup(b"src:7:0", &encode_followup(&f)).unwrap(), f);
        let created = FollowUp { replace: false, ..f.clone() };
        assert_eq!(decode_followup(b"src:7:0:create", &encode_followup(&created)).unwrap(), created);
        assert!(decode_followup(b"src:7:0", b"a\n1\n9\nxy").is_err());
    }

    fn settlement(token: u64, claim: u64, outcome: Outcome) -> Settlement {
        let lease = Lease { id: format!("t{token}").into_bytes(), token, claim };
        Settlement { lease, outcome, run: RunInfo::default() }
    }

    fn ack() -> Outcome {
        Outcome::Ack { followups: Vec::new(), groups: Vec::new() }
    }

    #[test]
    fn plain_acks_of_one_claim_share_one_mask() {
        let retry = Outcome::Retry { delay: Duration::from_secs(1), error: "x".into() };
        let batch = [
            settlement(12, 10, ack()),
            settlement(20, 20, ack()),
            settlement(11, 10, retry),
            settlement(10, 10, ack()),
        ];
        assert_eq!(
            settle_entries(&batch, false),
            [
                SettleEntry::Plain { claim: 10, mask: b"101".to_vec(), tasks: vec![(0, 2), (3, 0)] },
                SettleEntry::Plain { claim: 20, mask: b"1".to_vec(), tasks: vec![(1, 0)] },
                SettleEntry::Full(2),
            ]
        );
    }

    #[test]
    fn acks_go_in_full_with_events_or_an_impossible_token() {
        let batch = [settlement(5, 10, ack()), settlement(10, 10, ack())];
        assert_eq!(settle_entries(&batch, true), [SettleEntry::Full(0), SettleEntry::Full(1)]);
        assert_eq!(
            settle_entries(&batch, false),
            [SettleEntry::Full(0), SettleEntry::Plain { claim: 10, mask: b"1".to_vec(), tasks: vec![(1, 0)] }]
        );
    }
}
