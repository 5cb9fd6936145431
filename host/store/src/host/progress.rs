//! Writing the progress running handlers report, each only while its run's lease holds (`scripts/progress.lua`).

use anyhow::{Context, Result};

use crate::Store;
use crate::app::progress::ProgressReport;
use crate::task::Progress;
use crate::task_type::TaskType;

/// A report as stored in `P:{T}:progress` (and by settle.lua with a retry):
/// `{"percent":P,"detail":D,"attempt":A,"at_ms":T}`, D null when none.
pub fn stored_value(progress: &Progress, attempt: u32, at_ms: i64) -> String {
    let detail = if progress.detail.is_empty() { "null" } else { progress.detail.as_str() };
    format!(r#"{{"percent":{},"detail":{detail},"attempt":{attempt},"at_ms":{at_ms}}}"#, progress.percent)
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ProgressView;

    #[test]
    fn what_is_stored_reads_back() {
        let p = Progress { percent: 7, detail: r#"{"rows":3}"#.into() };
        let view = ProgressView::parse(stored_value(&p, 2, 99).as_bytes()).unwrap();
        assert_eq!(view, ProgressView { percent: 7, detail: Some(r#"{"rows":3}"#.into()), attempt: 2, at_ms: 99 });
        let bare = Progress { percent: 100, detail: String::new() };
        assert_eq!(ProgressView::parse(stored_value(&bare, 1, 5).as_bytes()).unwrap().detail, None);
    }
}
