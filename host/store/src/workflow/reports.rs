//! The one delivery of reports: a group child's or a graph node's end, moved from the task's outbox to its group or graph, exactly once.
//!
//! A report is committed in the task's slot (settle.lua, cancel.lua, the
//! prelude's report_ended) and delivered into its parent's home slot: one
//! script call per parent kind and home type (`group_reports.lua`, which may
//! fire the callback; `graph_reports.lua`, which may release nodes), then one
//! HDEL of the delivered entries. The two scripts keep each parent's own
//! rules; the batching, the fault handling and the clearing are written here once.

use anyhow::{Context, Result};

use super::entries::{Parent, Report};
use super::groups::Fired;
use super::outbox::OutboxFlush;
use crate::Store;
use crate::task_type::TaskType;

/// Reports delivered per script call (all to one parent kind in one home type).
const REPORTS_PER_CALL: usize = 256;

impl Store {
    /// Delivers reports (entries of `t`'s outbox, decoded) to their groups and
    /// graphs. Entries whose home type's keys are broken wait in the outbox
    /// ([`OutboxFlush::failed`]); a connection error stops the pass.
    pub(super) async fn deliver_reports(
        &self,
        t: &TaskType,
        mut reports: Vec<(Vec<u8>, Report)>,
        flushed: &mut OutboxFlush,
    ) -> Result<()> {
        // One slot per home type: batch each kind's reports to one home together.
        reports.sort_by(|a, b| {
            (a.1.parent, a.1.group.callback_type.as_str()).cmp(&(b.1.parent, b.1.group.callback_type.as_str()))
        });
        let same_call = |a: &(Vec<u8>, Report), b: &(Vec<u8>, Report)| {
            a.1.parent == b.1.parent && a.1.group.callback_type == b.1.group.callback_type
        };
        for batch in reports.chunk_by(same_call).flat_map(|run| run.chunks(REPORTS_PER_CALL)) {
            let (home, parent) = (batch[0].1.group.callback_type.clone(), batch[0].1.parent);
            let k = self.keys(&home);
            let mut inv = match parent {
                Parent::Group => {
                    let mut inv = self.scripts.group_reports.prepare_invoke();
                    inv.key(&k.groups).key(&k.stats).key(&k.due).key(&k.payload).key(&k.dead);
                    inv
                }
                Parent::Graph => {
                    let mut inv = self.scripts.graph_reports.prepare_invoke();
                    inv.key(&k.graphs).key(&k.stats).key(&k.outbox).key(&k.seq).arg(home.as_str());
                    inv
                }
            };
            for (_, r) in batch {
                match parent {
                    Parent::Group => {
                        let gk = k.group(&r.group.id);
                        inv.key(&gk.group).key(&gk.pending).key(&gk.failed);
                        let member = [r.child_type.as_bytes(), b"\n", &r.id].concat();
                        inv.arg(r.group.id.as_str()).arg(member).arg(&r.outcome).arg(r.number);
                    }
                    Parent::Graph => {
                        let gk = k.graph(&r.group.id);
                        inv.key(&gk.graph).key(&gk.nodes);
                        inv.arg(r.group.id.as_str()).arg(r.number).arg(&r.outcome);
                    }
                }
            }
            let mut conn = self.conn.clone();
            let (ends, parents) = match parent {
                Parent::Group => ("child", "groups"),
                Parent::Graph => ("node", "graphs"),
            };
            let replies: Result<Vec<Vec<u8>>> = inv.invoke_async(&mut conn).await.with_context(|| {
                format!("cannot deliver {} {ends} ends from {t} to their {home} {parents}", batch.len())
            });
            let replies = match replies {
                Ok(replies) => replies,
                Err(e) if crate::classify(&e) == crate::Trouble::Outage => return Err(e),
                Err(e) => {
                    // The home type's keys are broken: its reports wait in the outbox.
                    flushed.failed.push((home, e));
                    continue;
                }
            };
            for ((_, r), reply) in batch.iter().zip(&replies) {
                match parent {
                    Parent::Group => {
                        if let Some(f) = Fired::parse(reply) {
                            flushed.groups.completed.push((r.group.clone(), f));
                        }
                    }
                    Parent::Graph if reply.as_slice() == b"done" => {
                        flushed.graphs_done.push((home.clone(), r.group.id.clone()));
                    }
                    Parent::Graph => {}
                }
            }
            let ids: Vec<&[u8]> = batch.iter().map(|(id, _)| id.as_slice()).collect();
            let _: i64 = redis::cmd("HDEL")
                .arg(&self.keys(t).outbox)
                .arg(&ids)
                .query_async(&mut conn)
                .await
                .with_context(|| format!("cannot clear the {t} outbox"))?;
            flushed.moved += batch.len();
        }
        Ok(())
    }
}
