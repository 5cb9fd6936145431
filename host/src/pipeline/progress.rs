//! Progress that running handlers report: the latest report of each run, written to Redis at most every quarter second.
//!
//! A handler may report as often as it likes; Redis sees the latest report of
//! each run once per [`WRITE_EVERY`], written in one script call for all of
//! the type's runs, fenced by their leases (`scripts/progress.lua`). Nothing
//! runs while no handler reports: the writer starts with the first report
//! and stops once it finds nothing new.

use hourglass_task::sync::LockExt;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use metrics::{Counter, counter};
use tracing::warn;

use super::execute::Plugins;
use super::ledger::Ledger;
use crate::runtime::progress::ReportProgress;
use crate::store::ProgressReport;
use crate::task::{Lease, Progress};
use crate::task_type::TaskType;

/// How often at most a type's progress reports are written to Redis.
pub(crate) const WRITE_EVERY: Duration = Duration::from_millis(250);

/// The progress reports of one type's runs not written yet, and their writer.
#[derive(Clone)]
pub(crate) struct ProgressBoard<L, P> {
    inner: Arc<Board<L, P>>,
}

struct Board<L, P> {
    task_type: TaskType,
    ledger: L,
    plugins: P,
    /// Where the writer runs (the host's runtime, not the guests').
    executor: tokio::runtime::Handle,
    latest: Mutex<Latest>,
    reports: Counter,
    writes: Counter,
}

#[derive(Default)]
struct Latest {
    /// The latest report of each run since the last write.
    reports: HashMap<Lease, (u32, Progress, i64)>,
    /// Whether a writer is on its way (it drains `reports`).
    writing: bool,
}

impl<L, P> ProgressBoard<L, P>
where
    L: Ledger + Clone + Send + Sync + 'static,
    P: Plugins,
{
    /// The board of `task_type`; its writer runs on `executor` when there is something to write.
    pub(crate) fn new(task_type: TaskType, ledger: L, plugins: P, executor: tokio::runtime::Handle) -> Self {
        let t = task_type.to_string();
        ProgressBoard {
            inner: Arc::new(Board {
                reports: counter!("hourglass_progress_reports_total", "type" => t.clone()),
                writes: counter!("hourglass_progress_writes_total", "type" => t),
                task_type,
                ledger,
                plugins,
                executor,
                latest: Mutex::default(),
            }),
        }
    }

    /// Writes what was reported, then again every [`WRITE_EVERY`] while
    /// reports come; ends once a round finds none.
    async fn write(self) {
        let board = &*self.inner;
        let mut failing = false;
        loop {
            let batch: Vec<ProgressReport> = {
                let mut latest = board.latest.lock_unpoisoned();
                if latest.reports.is_empty() {
                    latest.writing = false;
                    return;
                }
                latest
                    .reports
                    .drain()
                    .map(|(lease, (attempt, progress, at_ms))| ProgressReport { lease, attempt, progress, at_ms })
                    .collect()
            };
            let events = board.plugins.config().events_maxlen(&board.task_type);
            match board.ledger.write_progress(&board.task_type, &batch, events).await {
                Ok(stored) => {
                    board.writes.increment(stored as u64);
                    failing = false;
                }
                // Progress is shown, not kept: a report that cannot be
                // written is dropped (the run's next one replaces it).
                Err(e) if !failing => {
                    warn!(task_type = %board.task_type, "progress: {} reports not written: {e:#}", batch.len());
                    failing = true;
                }
                Err(_) => {}
            }
            tokio::time::sleep(WRITE_EVERY).await;
        }
    }
}

impl<L, P> ReportProgress for ProgressBoard<L, P>
where
    L: Ledger + Clone + Send + Sync + 'static,
    P: Plugins,
{
    fn report(&self, lease: &Lease, attempt: u32, progress: Progress) {
        let board = &*self.inner;
        board.reports.increment(1);
        let mut latest = board.latest.lock_unpoisoned();
        latest.reports.insert(lease.clone(), (attempt, progress, crate::clock::now_ms()));
        if !latest.writing {
            latest.writing = true;
            drop(latest);
            board.executor.spawn(self.clone().write());
        }
    }

    fn run_returned(&self, lease: &Lease) {
        // Short runs end before the next write: their reports never reach Redis.
        self.inner.latest.lock_unpoisoned().reports.remove(lease);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::fakes::{Scripted, Served};

    fn lease(id: &str, token: u64) -> Lease {
        Lease { id: id.as_bytes().to_vec(), token, claim: token }
    }

    fn at(percent: u8) -> Progress {
        Progress { percent, detail: String::new() }
    }

    #[tokio::test(start_paused = true)]
    async fn the_latest_report_of_each_run_is_written_at_most_every_quarter_second() {
        let ledger = Scripted::new();
        let t = TaskType::try_from("t".to_owned()).unwrap();
        let board = ProgressBoard::new(t.clone(), ledger.clone(), Served::new(""), tokio::runtime::Handle::current());
        board.report(&lease("a", 1), 1, at(10));
        tokio::task::yield_now().await;
        // Reported many times between two writes: only the latest counts.
        for p in 11..=40 {
            board.report(&lease("a", 1), 1, at(p));
        }
        board.report(&lease("b", 2), 3, at(5));
        tokio::time::sleep(WRITE_EVERY * 4).await;
        let calls = ledger.timed_calls();
        let writes: Vec<_> = calls.iter().filter(|(_, c)| c.starts_with("progress")).collect();
        assert_eq!(writes.len(), 2, "{calls:?}");
        assert_eq!(writes[0].1, "progress a@1=10");
        assert_eq!(writes[1].1, "progress a@1=40 b@2=5");
        assert_eq!(writes[1].0 - writes[0].0, WRITE_EVERY);
        // Nothing new: the writer stopped; a new report starts it again at once.
        board.report(&lease("a", 1), 1, at(50));
        tokio::task::yield_now().await;
        let writes = ledger.calls().into_iter().filter(|c| c.starts_with("progress")).count();
        assert_eq!(writes, 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_run_that_ends_before_the_write_is_not_written() {
        let ledger = Scripted::new();
        let t = TaskType::try_from("t".to_owned()).unwrap();
        let board = ProgressBoard::new(t, ledger.clone(), Served::new(""), tokio::runtime::Handle::current());
        board.report(&lease("a", 1), 1, at(10));
        tokio::task::yield_now().await;
        board.report(&lease("a", 1), 1, at(90));
        board.report(&lease("b", 2), 1, at(20));
        board.run_returned(&lease("a", 1));
        tokio::time::sleep(WRITE_EVERY * 2).await;
        let writes: Vec<String> = ledger.calls().into_iter().filter(|c| c.starts_with("progress")).collect();
        assert_eq!(writes, ["progress a@1=10", "progress b@2=20"]);
    }
}
