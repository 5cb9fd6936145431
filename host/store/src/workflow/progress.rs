//! How far a workflow group's or graph's tasks have got, read from the progress their handlers report.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use serde::Serialize;

use super::groups::GroupView;
use crate::Store;
use crate::group::GroupRef;
use crate::task_type::TaskType;

/// Most pending children a group's progress reads (past them, the rest count as not started).
const GROUP_PENDING_READ: u64 = 1000;

/// How far a workflow group's children have got, all together: each ended
/// child counts as done, each pending one as far as it last reported.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct GroupProgress {
    /// 0 to 100.
    pub percent: f64,
    /// Pending children read for it (at most 1,000: past that, the rest count as not started).
    pub pending_read: u64,
    /// Of those, how many have reported progress.
    pub reporting: u64,
}

/// How far a workflow graph's nodes have got, all together: each ended or
/// skipped node counts as done, each scheduled one as far as it last
/// reported, each waiting one as not started.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct GraphProgress {
    /// 0 to 100.
    pub percent: f64,
    /// Scheduled nodes read for it (at most 1,000: past that, the rest count as not started).
    pub scheduled_read: u64,
    /// Of those, how many have reported progress.
    pub reporting: u64,
}

impl Store {
    /// The progress of graph `view`: its ended and skipped nodes count 100
    /// each, its scheduled ones what they last reported (the first 1,000,
    /// one HMGET per node type), its waiting ones 0.
    pub async fn graph_progress(&self, view: &crate::GraphView) -> Result<GraphProgress> {
        let mut by_type: BTreeMap<TaskType, Vec<Vec<u8>>> = BTreeMap::new();
        let mut read = 0u64;
        for n in view.nodes.iter().filter(|n| n.state == "scheduled").take(GROUP_PENDING_READ as usize) {
            let Ok(t) = n.task_type.parse::<TaskType>() else { continue };
            by_type.entry(self.shard_for(&t, n.id.as_bytes())).or_default().push(n.id.as_bytes().to_vec());
            read += 1;
        }
        let (mut sum, mut reporting) = (0u64, 0u64);
        for (t, ids) in &by_type {
            for p in self.progress_of(t, ids).await?.into_iter().flatten() {
                sum += u64::from(p.percent);
                reporting += 1;
            }
        }
        let ended = view.nodes.iter().filter(|n| !matches!(n.state.as_str(), "waiting" | "scheduled")).count() as u64;
        let percent = match view.nodes.len() as u64 {
            0 => 0.0,
            all => ((ended * 100 + sum) as f64 / all as f64).min(100.0),
        };
        Ok(GraphProgress { percent, scheduled_read: read, reporting })
    }

    /// The progress of group `g` (as `view` read it): its ended children
    /// count 100 each, its pending ones what they last reported, read for
    /// the first 1,000 pending (an HSCAN of its pending children, then one
    /// HMGET per child type).
    pub async fn group_progress(&self, g: &GroupRef, view: &GroupView) -> Result<GroupProgress> {
        let pending_key = self.keys(&g.callback_type).group(&g.id).pending;
        let mut conn = self.conn.clone();
        let mut by_type: BTreeMap<TaskType, Vec<Vec<u8>>> = BTreeMap::new();
        let (mut cursor, mut read) = (0u64, 0u64);
        loop {
            let (next, page): (u64, Vec<Vec<u8>>) = redis::cmd("HSCAN")
                .arg(&pending_key)
                .arg(cursor)
                .arg("COUNT")
                .arg(200)
                .query_async(&mut conn)
                .await
                .with_context(|| format!("cannot read the pending children of group {g}"))?;
            for member in page.chunks_exact(2).map(|p| &p[0]) {
                let Some(at) = member.iter().position(|&b| b == b'\n') else { continue };
                let Ok(t) = String::from_utf8_lossy(&member[..at]).parse::<TaskType>() else { continue };
                let id = member[at + 1..].to_vec();
                by_type.entry(self.shard_for(&t, &id)).or_default().push(id);
                read += 1;
            }
            cursor = next;
            if cursor == 0 || read >= GROUP_PENDING_READ {
                break;
            }
        }
        let (mut sum, mut reporting) = (0u64, 0u64);
        for (t, ids) in &by_type {
            for p in self.progress_of(t, ids).await?.into_iter().flatten() {
                sum += u64::from(p.percent);
                reporting += 1;
            }
        }
        let ended = view.added.saturating_sub(view.pending);
        let percent = match view.added {
            0 if view.state == "done" => 100.0,
            0 => 0.0,
            added => ((ended * 100 + sum) as f64 / added as f64).min(100.0),
        };
        Ok(GroupProgress { percent, pending_read: read, reporting })
    }
}
