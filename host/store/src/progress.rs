//! Progress that running handlers report, kept with their task until it ends (`P:{T}:progress`).

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use redis::Value;
use serde::{Serialize, Serializer};

use super::Store;
use super::groups::GroupView;
use super::reply::{array, opt_bytes};
use crate::group::GroupRef;
use crate::task::{Lease, Progress};
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

/// One run's latest progress report, to be stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgressReport {
    /// The run's lease: the report is stored only while it holds.
    pub lease: Lease,
    /// The attempt that reported it.
    pub attempt: u32,
    /// How far it got.
    pub progress: Progress,
    /// When it reported it, ms since the epoch.
    pub at_ms: i64,
}

/// A task's progress as stored: the latest report of its latest attempt that made one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProgressView {
    /// 0 to 100.
    pub percent: u8,
    /// The handler's detail (JSON), if it gave one.
    #[serde(serialize_with = "as_json", skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// The attempt that reported it.
    pub attempt: u32,
    /// When it was reported, ms since the epoch.
    pub at_ms: i64,
}

impl ProgressView {
    /// Reads a stored value (`{"percent":P,"detail":D,"attempt":A,"at_ms":T}`);
    /// `None` for anything else (a hand-written value is not shown as progress).
    pub fn parse(stored: &[u8]) -> Option<ProgressView> {
        #[derive(serde::Deserialize)]
        struct Stored {
            percent: u8,
            detail: Option<serde_json::Value>,
            attempt: u32,
            at_ms: i64,
        }
        let s: Stored = serde_json::from_slice(stored).ok()?;
        if s.percent > 100 {
            return None;
        }
        Some(ProgressView {
            percent: s.percent,
            detail: s.detail.filter(|d| !d.is_null()).map(|d| d.to_string()),
            attempt: s.attempt,
            at_ms: s.at_ms,
        })
    }
}

/// A report as stored in `P:{T}:progress` (and by settle.lua with a retry):
/// `{"percent":P,"detail":D,"attempt":A,"at_ms":T}`, D null when none.
pub fn stored_value(progress: &Progress, attempt: u32, at_ms: i64) -> String {
    let detail = if progress.detail.is_empty() { "null" } else { progress.detail.as_str() };
    format!(r#"{{"percent":{},"detail":{detail},"attempt":{attempt},"at_ms":{at_ms}}}"#, progress.percent)
}

/// The detail as the JSON it is (it was checked to be JSON when reported).
fn as_json<S: Serializer>(detail: &Option<String>, s: S) -> Result<S::Ok, S::Error> {
    let value = detail.as_deref().and_then(|d| serde_json::from_str::<serde_json::Value>(d).ok());
    value.serialize(s)
}

impl Store {
    /// Stores the latest progress of runs of `t`, each only while its lease
    /// holds (`scripts/progress.lua`), and with `events_maxlen` appends a
    /// `progress` event for each; returns how many were stored.
    pub async fn write_progress(
        &self,
        t: &TaskType,
        reports: &[ProgressReport],
        events_maxlen: Option<u64>,
    ) -> Result<usize> {
        if reports.is_empty() {
            return Ok(0);
        }
        let k = self.keys(t);
        let mut inv = self.scripts.progress.prepare_invoke();
        inv.key(&k.claimed).key(&k.progress).key(&k.events).arg(events_maxlen.unwrap_or(0));
        for r in reports {
            inv.arg(&r.lease.id)
                .arg(r.lease.token)
                .arg(r.lease.claim)
                .arg(r.attempt)
                .arg(r.progress.percent)
                .arg(&r.progress.detail)
                .arg(stored_value(&r.progress, r.attempt, r.at_ms));
        }
        let mut conn = self.conn.clone();
        let stored: usize = inv
            .invoke_async(&mut conn)
            .await
            .with_context(|| format!("cannot store the progress of {} {t} tasks", reports.len()))?;
        Ok(stored)
    }

    /// The stored progress of tasks `ids` of `t`, in their order (one HMGET).
    pub async fn progress_of(&self, t: &TaskType, ids: &[Vec<u8>]) -> Result<Vec<Option<ProgressView>>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let k = self.keys(t);
        let mut conn = self.conn.clone();
        let value: Value = redis::cmd("HMGET")
            .arg(&k.progress)
            .arg(ids)
            .query_async(&mut conn)
            .await
            .with_context(|| format!("cannot read the progress of {} {t} tasks", ids.len()))?;
        array(value)?.into_iter().map(|v| Ok(opt_bytes(v)?.and_then(|b| ProgressView::parse(&b)))).collect()
    }

    /// The progress of graph `view`: its ended and skipped nodes count 100
    /// each, its scheduled ones what they last reported (the first 1,000,
    /// one HMGET per node type), its waiting ones 0.
    pub async fn graph_progress(&self, view: &super::GraphView) -> Result<GraphProgress> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_stored_reads_back() {
        let p = Progress { percent: 7, detail: r#"{"rows":3}"#.into() };
        let view = ProgressView::parse(stored_value(&p, 2, 99).as_bytes()).unwrap();
        assert_eq!(view, ProgressView { percent: 7, detail: Some(r#"{"rows":3}"#.into()), attempt: 2, at_ms: 99 });
        let bare = Progress { percent: 100, detail: String::new() };
        assert_eq!(ProgressView::parse(stored_value(&bare, 1, 5).as_bytes()).unwrap().detail, None);
    }

    #[test]
    fn a_stored_value_reads_back_and_anything_else_is_not_progress() {
        let view = ProgressView::parse(br#"{"percent":40,"detail":{"step":"copy"},"attempt":2,"at_ms":17}"#).unwrap();
        assert_eq!(view.percent, 40);
        assert_eq!(view.detail.as_deref(), Some(r#"{"step":"copy"}"#));
        assert_eq!((view.attempt, view.at_ms), (2, 17));
        let json = serde_json::to_string(&view).unwrap();
        assert_eq!(json, r#"{"percent":40,"detail":{"step":"copy"},"attempt":2,"at_ms":17}"#);
        let none = ProgressView::parse(br#"{"percent":5,"detail":null,"attempt":1,"at_ms":1}"#).unwrap();
        assert_eq!(none.detail, None);
        assert_eq!(ProgressView::parse(b"50%"), None);
        assert_eq!(ProgressView::parse(br#"{"percent":400,"attempt":1,"at_ms":1}"#), None);
    }
}
