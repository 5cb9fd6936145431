//! What clients do to one task: schedule, cancel, pause and resume its type, read its trace parent.

use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::task_type::TaskType;
use crate::{Store, duration_ms};

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
}
