//! Dispatch: run each claimed task in the sandbox, and decide what its result means (ack, retry, dead letter).

use hourglass_task::sync::LockExt;
use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use futures_util::FutureExt;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, error, info, warn};

use super::execute::Execute;
use super::in_flight::RunSignals;
use super::ledger::Ledger;
use super::state::{Permits, Queued, Runner, TypeState};
use crate::backoff;
use crate::config::TypePolicy;
use crate::observe::logging::clean_id;
use crate::registry::Entry;
use crate::runtime::{Failure, ReportProgress, RunHooks, TaskRun};
use crate::store::Store;
use crate::task::{ClaimedTask, Lease, Outcome, Progress, RunInfo, Settlement};
use crate::task_type::TaskType;

/// Scores below this (1973-03-03 in ms) were almost surely written in seconds.
const SECONDS_NOT_MS: i64 = 100_000_000_000;

/// What dispatching uses: the executor the runs go to, the ledger (traced
/// claims' traceparents) and this host's id, and the tracker shutdown waits on.
pub(crate) struct Dispatcher<L = Store> {
    executor: tokio::runtime::Handle,
    ledger: L,
    holder: Arc<str>,
    runs: TaskTracker,
}

impl Dispatcher {
    pub(crate) fn of(runner: &Runner) -> Dispatcher {
        Dispatcher::new(
            runner.runtime.executor(),
            runner.store.clone(),
            runner.store.holder().into(),
            runner.runs.clone(),
        )
    }
}

impl<L> Dispatcher<L> {
    /// Runs go to `executor` (the guest runtime), tracked by `runs`; `holder` names this host in task events.
    pub(crate) fn new(
        executor: tokio::runtime::Handle,
        ledger: L,
        holder: Arc<str>,
        runs: TaskTracker,
    ) -> Dispatcher<L> {
        Dispatcher { executor, ledger, holder, runs }
    }
}

impl<L: Ledger + Clone + Send + Sync + 'static> Dispatcher<L> {
    /// Starts a run of every claimed task on the guest executor; each outcome
    /// goes to the type's settler as soon as it is known.
    pub(crate) fn dispatch<E: Execute>(
        &self,
        state: &Arc<TypeState>,
        entry: &Arc<Entry<E>>,
        tasks: Vec<(ClaimedTask, Permits)>,
    ) {
        if tasks.is_empty() {
            return;
        }
        // Each task's lease, built once: held from now (after shutdown's grace
        // period, the runs are told at once their leases are lost), let go
        // when found lost, and settled under.
        let leases: Vec<Lease> = tasks.iter().map(|(task, _)| task.lease()).collect();
        let signals = state.in_flight.claimed(leases.iter().cloned());
        for (task, _) in tasks.iter().filter(|(t, _)| t.due_ms < SECONDS_NOT_MS) {
            warn!(
                task_type = %task.task_type, task_id = %clean_id(&task.id), attempt = task.attempt, score = task.due_ms,
                "due score looks like seconds, not milliseconds; running it now anyway"
            );
        }
        // Taken once per claim: a run then touches no host-wide reference
        // count or lock, each of which costs a cache line moved between cores
        // on a many-core machine (BENCHMARKS.md, round 13).
        let claim = Arc::new(ClaimRuns {
            entry: entry.clone(),
            state: state.clone(),
            // The settler lingers for the outcomes of a claim still to come, so one
            // script call settles whole claims.
            unreported: Arc::new(AtomicUsize::new(tasks.len())),
            trace: ClaimTrace::of(&self.ledger, &tasks),
            settle_tx: state.settle_tx.lock_unpoisoned().clone(),
            holder: self.holder.clone(),
            _tracked: self.runs.token(),
        });
        state.metrics.dispatched(tasks.len());
        for (((task, permits), signals), lease) in tasks.into_iter().zip(signals).zip(leases) {
            let run = Run { task, lease, permits, signals, claim: claim.clone() };
            self.executor.spawn(run.go());
        }
    }
}

/// What the runs of one claim share.
struct ClaimRuns<E, L> {
    entry: Arc<Entry<E>>,
    state: Arc<TypeState>,
    unreported: Arc<AtomicUsize>,
    /// The claim's trace state, while tracing is on.
    trace: Option<ClaimTrace<L>>,
    /// The type's settle queue (none once shutdown closed it).
    settle_tx: Option<tokio::sync::mpsc::UnboundedSender<Queued>>,
    /// This host's id, for the task events.
    holder: Arc<str>,
    /// Shutdown waits for the claim's last run ([`Runner::runs`]).
    _tracked: tokio_util::task::task_tracker::TaskTrackerToken,
}

/// A claim's runs report their progress to their type's writer through the
/// claim they share (one reference count per claim, not one per type).
impl<E: Send + Sync + 'static, L: Send + Sync + 'static> ReportProgress for ClaimRuns<E, L> {
    fn report(&self, lease: &Lease, attempt: u32, progress: Progress) {
        if let Some(board) = self.state.progress.get() {
            board.report(lease, attempt, progress);
        }
    }

    fn run_returned(&self, lease: &Lease) {
        if let Some(board) = self.state.progress.get() {
            board.run_returned(lease);
        }
    }
}

/// A traced claim: the tracer, and the client traceparents of its tasks,
/// read once (one HMGET of `P:{T}:trace`) by the first of its runs to start.
struct ClaimTrace<L> {
    tracing: crate::observe::traces::Tracing,
    ledger: L,
    task_type: TaskType,
    ids: Vec<Vec<u8>>,
    parents: tokio::sync::OnceCell<HashMap<Vec<u8>, String>>,
}

impl<L: Ledger + Clone> ClaimTrace<L> {
    /// The trace state of a claim of `tasks` while tracing is on; `None` (and nothing else paid) otherwise.
    fn of(ledger: &L, tasks: &[(ClaimedTask, Permits)]) -> Option<ClaimTrace<L>> {
        let tracing = crate::observe::traces::tracing()?;
        let (first, _) = tasks.first()?;
        Some(ClaimTrace {
            tracing,
            ledger: ledger.clone(),
            task_type: first.task_type.clone(),
            ids: tasks.iter().map(|(t, _)| t.id.clone()).collect(),
            parents: tokio::sync::OnceCell::new(),
        })
    }

    /// Starts the span of one run, as a child of the client's traceparent when it left one.
    async fn start(&self, task: &ClaimedTask, plugin_hash: &str, started_ms: i64) -> crate::observe::traces::RunSpan {
        let parents = self
            .parents
            .get_or_init(|| async {
                match self.ledger.trace_parents(&self.task_type, &self.ids).await {
                    Ok(found) => self.ids.iter().cloned().zip(found).filter_map(|(id, p)| Some((id, p?))).collect(),
                    Err(e) => {
                        // Traces are a nicety: the runs go ahead as new traces.
                        warn!(task_type = %self.task_type, "traces: cannot read the client traceparents: {e:#}");
                        HashMap::new()
                    }
                }
            })
            .await;
        self.tracing.start(task, plugin_hash, started_ms, parents.get(&task.id).map(String::as_str))
    }
}

/// One claimed task on its way through the sandbox.
struct Run<E, L> {
    task: ClaimedTask,
    /// The task's lease, as the claim took it.
    lease: Lease,
    permits: Permits,
    /// Stopped by a cancel or a lost lease; told when the handler is done.
    signals: RunSignals,
    claim: Arc<ClaimRuns<E, L>>,
}

impl<E: Execute, L: Ledger + Clone + Send + Sync + 'static> Run<E, L> {
    async fn go(self) {
        let (task, claim) = (&self.task, &*self.claim);
        // One event per start at trace level (target `hourglass::task`): what
        // `hourglass-bench` measures lateness and double runs from.
        // Plain `&str` fields: a listener reads them without formatting.
        tracing::trace!(
            target: "hourglass::task",
            event = "started",
            host = &*claim.holder,
            task_type = task.task_type.as_str(),
            task_id = &*crate::observe::logging::clean_id_cow(&task.id),
            due_ms = task.due_ms,
            plugin_hash = claim.entry.hash.as_str(),
        );
        let started_ms = crate::clock::now_ms();
        let span = match &claim.trace {
            Some(trace) => Some(trace.start(task, &claim.entry.hash, started_ms).await),
            None => None,
        };
        let since = Instant::now();
        // On the heap: a run's future is kilobytes (a fresh instance's
        // instantiation and call), and held inline every move of it and of
        // this future (into the race, into the spawned task) copies them all.
        let hooks = RunHooks {
            trace: span.as_ref().map(crate::observe::traces::RunSpan::run_trace),
            progress: Some(self.claim.clone()),
        };
        let handled = Box::pin(claim.entry.handler.execute(task, hooks));
        let ran = race(handled, &self.signals.stop, &self.signals.lost).await;
        if matches!(ran, Err(Stopped::LeaseLost)) && claim.state.in_flight.dropped(&self.lease) {
            claim.state.metrics.abandoned();
        }
        self.signals.handler_returned();
        let ran_for = since.elapsed();
        let info = RunInfo {
            attempt: task.attempt,
            due_ms: task.due_ms,
            started_ms,
            finished_ms: crate::clock::now_ms(),
            ran_for,
        };
        let outcome = match ran {
            Ok(run) => decide(&claim.entry.policy, task, run, started_ms),
            Err(Stopped::CancelAsked) => {
                info!(task_type = %task.task_type, task_id = %clean_id(&task.id), attempt = task.attempt, "cancelled while running");
                Outcome::Cancelled
            }
            Err(Stopped::LeaseLost) => {
                claim.state.metrics.unsettled(&info);
                if let Some(span) = span {
                    span.stopped();
                }
                if claim.unreported.fetch_sub(1, Ordering::AcqRel) == 1 {
                    claim.state.claim_reported.notify_one();
                }
                return;
            }
        };
        let settlement = Settlement { lease: self.lease, outcome, run: info };
        // Counted down just before it is queued, so the settler never lingers
        // for an outcome already in its queue; the claim's last outcome wakes
        // it once queued.
        let last = claim.unreported.fetch_sub(1, Ordering::AcqRel) == 1;
        let queued = Queued { settlement, span, permits: self.permits, claim_unreported: claim.unreported.clone() };
        let unsent = match &claim.settle_tx {
            Some(tx) => tx.send(queued).err().map(|e| e.0),
            None => Some(queued),
        };
        if let Some(unsent) = unsent {
            claim.state.metrics.unsettled(&unsent.settlement.run);
            if let Some(span) = unsent.span {
                span.stopped();
            }
        }
        if last {
            claim.state.claim_reported.notify_one();
        }
    }
}

/// What stopped a run before its handler returned.
#[derive(Debug)]
enum Stopped {
    /// `hourglass cancel`: settled as cancelled.
    CancelAsked,
    /// Its lease was lost, or shutdown passed its grace period: nothing is
    /// settled, the task is another host's (or handed back).
    LeaseLost,
}

/// Runs `handled` until it ends, or until `stop` (a cancel) or `lost` (the
/// lease, or shutdown's grace period) ends it first; either drops the run
/// where it is, with its instance and any outbound HTTP in flight. A cancel
/// wins over a result that is ready at the same moment. A handler that is done
/// before its lease is found lost keeps its outcome (fenced, or stored if
/// the lease had not run out after all). A panic in the host's own code
/// fails the task, not the host.
async fn race(
    handled: impl Future<Output = TaskRun>,
    stop: &CancellationToken,
    lost: &CancellationToken,
) -> Result<TaskRun, Stopped> {
    let run = std::panic::AssertUnwindSafe(handled).catch_unwind();
    tokio::select! {
        biased;
        _ = stop.cancelled() => Err(Stopped::CancelAsked),
        run = run => Ok(run.unwrap_or_else(|_| TaskRun::returned(Err(Failure::Error("handler failed: panic in the host".into()))))),
        _ = lost.cancelled() => Err(Stopped::LeaseLost),
    }
}

/// Turns a handler's result into what to write: ack, retry with backoff, or dead letter.
pub(crate) fn decide(policy: &TypePolicy, task: &ClaimedTask, run: TaskRun, started_ms: i64) -> Outcome {
    let TaskRun { result, followups, groups, graphs, progress } = run;
    let id = clean_id(&task.id);
    let lateness_ms = started_ms - task.due_ms;
    match result {
        Ok(()) => {
            debug!(task_type = %task.task_type, task_id = %id, attempt = task.attempt, lateness_ms, "succeeded");
            Outcome::Ack { followups, groups, graphs }
        }
        Err(Failure::Permanent(reason)) => {
            let reason = crate::observe::logging::Clean(&reason);
            error!(task_type = %task.task_type, task_id = %id, attempt = task.attempt, "dead-lettered: permanent failure: {reason}");
            Outcome::Dead { error: format!("permanent: {}", reason.0) }
        }
        Err(failure) if task.attempt >= policy.max_attempts => {
            let text = failure.to_string();
            error!(task_type = %task.task_type, task_id = %id, attempt = task.attempt,
                "dead-lettered after {} attempts: {}", task.attempt, crate::observe::logging::Clean(&text));
            Outcome::Dead { error: text }
        }
        Err(failure) => {
            let delay = match &failure {
                Failure::RetryAfter(d) => *d,
                _ => backoff::retry_delay(policy.backoff_base, policy.backoff_cap, task.attempt),
            };
            let text = failure.to_string();
            warn!(task_type = %task.task_type, task_id = %id, attempt = task.attempt, retry_in = ?delay, "failed: {}", crate::observe::logging::Clean(&text));
            Outcome::Retry { delay, error: text, progress }
        }
    }
}

#[cfg(test)]
mod tests;
