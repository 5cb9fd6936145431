//! The outbox: follow-ups and workflow reports committed with a settle, moved on to their target types exactly once.

use anyhow::{Context, Result};

use super::entries::{Parent, decode_followup};
use super::groups::{GroupDelivery, GroupMoves};
use crate::task::FollowUp;
use crate::task_type::TaskType;
use crate::{BATCH, Store};

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
    /// Workflow graphs whose last node ended: (home type, graph id).
    pub graphs_done: Vec<(TaskType, crate::group::GroupId)>,
    /// Workflow graphs runs declared, declared now: (home type, graph id).
    pub graphs_declared: Vec<(TaskType, crate::group::GroupId)>,
    /// Workflow graphs runs declared that were refused (the id or a node's
    /// task in use): (home type, graph id, why); dropped, not retried.
    pub graphs_refused: Vec<(TaskType, crate::group::GroupId, String)>,
}

impl Store {
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
            // Reports (children's and nodes' ends) are delivered together after the page, a batch
            // per parent kind and home type; graph nodes' schedules too, a batch per type.
            let mut reports = Vec::new();
            let mut nodes = Vec::new();
            // Home types whose graphs were declared here: their roots are scheduled after the page.
            let mut homes: Vec<TaskType> = Vec::new();
            for pair in flat.chunks_exact(2) {
                let (entry_id, encoded) = (&pair[0], &pair[1]);
                // What can never be delivered (corrupt) is logged and dropped, to keep the outbox moving.
                let undeliverable = if entry_id.ends_with(super::entries::REPORT) {
                    match super::entries::decode_report(entry_id, encoded) {
                        Ok(report) => {
                            reports.push((entry_id.clone(), report));
                            continue;
                        }
                        Err(e) => Some(e),
                    }
                } else if entry_id.ends_with(super::graphs::NODE) {
                    nodes.push((entry_id.clone(), encoded.clone()));
                    continue;
                } else if entry_id.ends_with(super::graphs::GRAPH) {
                    match self.deliver_graph_work(entry_id, encoded, &mut flushed).await {
                        Ok(home) => {
                            homes.extend(home);
                            None
                        }
                        Err(GroupDelivery::Bad(e)) => Some(e),
                        Err(GroupDelivery::Waits(target, e)) => {
                            flushed.failed.push((target, e));
                            continue;
                        }
                        Err(GroupDelivery::Outage(e)) => return Err(e),
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
            self.deliver_graph_nodes(t, nodes, &mut flushed).await?;
            // A node's end goes to its graph, a child's to its group: one delivery for both.
            let graph_homes = reports.iter().filter(|(_, r)| r.parent == Parent::Graph);
            homes.extend(graph_homes.map(|(_, r)| r.group.callback_type.clone()));
            homes.sort_by(|a, b| a.as_str().cmp(b.as_str()));
            homes.dedup();
            self.deliver_reports(t, reports, &mut flushed).await?;
            // The nodes those ends released wait in their home type's outbox (this one too, when
            // nodes and graph share a type): schedule them now, not at that type's next pass.
            for home in &homes {
                if let Err(e) = self.flush_graph_nodes(home, &mut flushed).await {
                    // A broken home type's keys hold its nodes back, not this outbox.
                    if crate::classify(&e) == crate::Trouble::Outage {
                        return Err(e);
                    }
                    flushed.failed.push((home.clone(), e));
                }
            }
            cursor = next;
            if cursor == 0 {
                return Ok(flushed);
            }
        }
    }

    /// Schedules the graph nodes waiting in `home`'s outbox (entries ending
    /// `:node`), as [`Store::flush_outbox`] would, and nothing else. A client
    /// that declared a graph calls it to start the roots at once.
    pub async fn flush_graph_nodes(&self, home: &TaskType, flushed: &mut OutboxFlush) -> Result<()> {
        let k = self.keys(home);
        let mut conn = self.conn.clone();
        let mut cursor: u64 = 0;
        loop {
            let (next, flat): (u64, Vec<Vec<u8>>) = redis::cmd("HSCAN")
                .arg(&k.outbox)
                .arg(cursor)
                .arg("MATCH")
                .arg("*:node")
                .arg("COUNT")
                .arg(BATCH)
                .query_async(&mut conn)
                .await
                .with_context(|| format!("cannot read the {home} outbox"))?;
            let page = flat.chunks_exact(2).map(|pair| (pair[0].clone(), pair[1].clone())).collect();
            self.deliver_graph_nodes(home, page, flushed).await?;
            cursor = next;
            if cursor == 0 {
                return Ok(());
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
            Err(e) if crate::classify(&e) != crate::Trouble::Outage => {
                // The target's keys are broken: the entry waits in the outbox.
                flushed.failed.push((f.task_type, e));
                return Ok(false);
            }
            Err(e) => return Err(e),
        }
        Ok(true)
    }
}
