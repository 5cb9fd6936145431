//! Progress that running handlers report, kept with their task until it ends (`P:{T}:progress`).

use anyhow::{Context, Result};
use redis::Value;
use serde::{Serialize, Serializer};

use crate::Store;
use crate::reply::{array, opt_bytes};
use crate::task::{Lease, Progress};
use crate::task_type::TaskType;

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

/// The detail as the JSON it is (it was checked to be JSON when reported).
fn as_json<S: Serializer>(detail: &Option<String>, s: S) -> Result<S::Ok, S::Error> {
    let value = detail.as_deref().and_then(|d| serde_json::from_str::<serde_json::Value>(d).ok());
    value.serialize(s)
}

impl Store {
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
}

#[cfg(test)]
mod tests {
    use super::*;

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
