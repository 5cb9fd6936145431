//! Cancelling one task: removed when scheduled, asked to stop when running; a workflow child's end reported to its group at once.
//!
//! It lives with the workflows because a cancelled child ends: its report
//! to its group (or graph) is committed by `cancel.lua` and moved on here,
//! and a graph's cancel ([`Store::graph_cancel`]) cancels its nodes this way.

use anyhow::{Context, Result};

use crate::Store;
use crate::task_type::TaskType;

/// What a cancel did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CancelEffect {
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

impl Store {
    /// Cancels a task: removes it when scheduled; when running, asks its host to stop it.
    /// Of a sharded type, in the shard it is in (its own first, then the others).
    pub async fn cancel(&self, t: &TaskType, id: &[u8]) -> Result<CancelEffect> {
        for shard in self.lookup_order(t, id) {
            match self.cancel_in(&shard, id).await? {
                CancelEffect::Unknown => continue,
                found => return Ok(found),
            }
        }
        Ok(CancelEffect::Unknown)
    }

    async fn cancel_in(&self, t: &TaskType, id: &[u8]) -> Result<CancelEffect> {
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
            .key(&k.progress)
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
            Some("scheduled") => CancelEffect::Scheduled,
            Some("running") => CancelEffect::Running { holder: reply.get(1).cloned().unwrap_or_default() },
            _ => CancelEffect::Unknown,
        })
    }
}
