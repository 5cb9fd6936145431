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
            // Follow-ups are delivered after the page too, a batch per target type (or shard); every
            // entry done with is cleared in one HDEL.
            let mut followups: Vec<(Vec<u8>, FollowUp)> = Vec::new();
            let mut done: Vec<Vec<u8>> = Vec::new();
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
                            followups.push((entry_id.clone(), f));
                            continue;
                        }
                    }
                };
                if let Some(e) = undeliverable {
                    tracing::error!(task_type = %t, "dropping a bad outbox entry: {e:#}");
                }
                done.push(entry_id.clone());
            }
            done.extend(self.deliver_followups(t, followups, &mut flushed).await?);
            self.clear_outbox(t, &done).await?;
            flushed.moved += done.len();
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

    /// Delivers follow-ups (outbox entries of `t`, in the page's order) to
    /// their types, exactly once (deliver.lua's markers): one call per target
    /// type (or shard) and [`batch_len`](crate::app::tasks::batch_len) entries.
    /// Returns the entries done with; an entry whose target's keys are broken
    /// waits in the outbox (in [`OutboxFlush::failed`]). A call refused as a
    /// whole is tried again entry by entry, so one bad marker holds back only
    /// its own entry, not the batch beside it.
    async fn deliver_followups(
        &self,
        t: &TaskType,
        followups: Vec<(Vec<u8>, FollowUp)>,
        flushed: &mut OutboxFlush,
    ) -> Result<Vec<Vec<u8>>> {
        let mut by_target: std::collections::BTreeMap<TaskType, Vec<(Vec<u8>, FollowUp)>> =
            std::collections::BTreeMap::new();
        for (entry_id, f) in followups {
            by_target.entry(self.shard_for(&f.task_type, &f.id)).or_default().push((entry_id, f));
        }
        let mut done = Vec::new();
        for (target, entries) in by_target {
            let mut rest = entries.as_slice();
            while !rest.is_empty() {
                let len = crate::app::tasks::batch_len(rest.iter().map(|(_, f)| f.id.len() + f.payload.len()));
                let (batch, after) = rest.split_at(len);
                rest = after;
                match self.deliver_batch(t, &target, batch).await {
                    Ok(results) => {
                        for ((entry_id, f), result) in batch.iter().zip(results) {
                            note_delivery(flushed, f, result);
                            done.push(entry_id.clone());
                        }
                    }
                    Err(e) if crate::classify(&e) == crate::Trouble::Outage => return Err(e),
                    Err(e) if batch.len() == 1 => {
                        // The target's keys are broken: the entry waits in the outbox.
                        flushed.failed.push((batch[0].1.task_type.clone(), e));
                    }
                    Err(_) => {
                        for one in batch {
                            match self.deliver_batch(t, &target, std::slice::from_ref(one)).await {
                                Ok(results) => {
                                    note_delivery(flushed, &one.1, results[0]);
                                    done.push(one.0.clone());
                                }
                                Err(e) if crate::classify(&e) == crate::Trouble::Outage => return Err(e),
                                Err(e) => flushed.failed.push((one.1.task_type.clone(), e)),
                            }
                        }
                    }
                }
            }
        }
        Ok(done)
    }

    /// deliver.lua on one batch of follow-ups of `t`'s outbox, all for `target`:
    /// per entry 1 delivered, 0 delivered before, 2 kept (create-only, id taken).
    async fn deliver_batch(&self, t: &TaskType, target: &TaskType, batch: &[(Vec<u8>, FollowUp)]) -> Result<Vec<i64>> {
        let tk = self.keys(target);
        let mut inv = self.scripts.deliver.prepare_invoke();
        inv.key(&tk.due).key(&tk.payload).key(&tk.dead);
        for (entry_id, f) in batch {
            inv.key(tk.delivered(entry_id));
            inv.arg(&f.id)
                .arg(f.due_ms)
                .arg(&f.payload)
                .arg(if f.payload.is_empty() { "0" } else { "1" })
                .arg(super::entries::mode(f.replace));
        }
        let mut conn = self.conn.clone();
        let results: Vec<i64> = inv
            .invoke_async(&mut conn)
            .await
            .with_context(|| format!("cannot deliver follow-ups from {t} to {target}"))?;
        anyhow::ensure!(results.len() == batch.len(), "deliver: {} answers for {} entries", results.len(), batch.len());
        Ok(results)
    }

    /// Removes `entries` from `t`'s outbox (HDELs of at most [`BATCH`] fields).
    async fn clear_outbox(&self, t: &TaskType, entries: &[Vec<u8>]) -> Result<()> {
        let k = self.keys(t);
        let mut conn = self.conn.clone();
        for chunk in entries.chunks(BATCH) {
            let _: i64 = redis::cmd("HDEL")
                .arg(&k.outbox)
                .arg(chunk)
                .query_async(&mut conn)
                .await
                .with_context(|| format!("cannot clear the {t} outbox"))?;
        }
        Ok(())
    }
}

/// Counts one delivery's result (deliver.lua's 1, 0 or 2) in `flushed`.
fn note_delivery(flushed: &mut OutboxFlush, f: &FollowUp, result: i64) {
    if result == 2 {
        flushed.kept_existing.push((f.task_type.clone(), f.id.clone()));
    } else if !flushed.delivered_to.contains(&f.task_type) {
        flushed.delivered_to.push(f.task_type.clone());
    }
}
