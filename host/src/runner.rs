//! The runner: one claim loop per type with a plugin, its runs and its settler, and the drain at shutdown.
//!
//! The path of a task, room by room: [`claim`](crate::claim) takes due
//! tasks under a lease within the concurrency limits,
//! [`dispatch`](crate::dispatch) runs each in the sandbox and decides what
//! its result means, and [`settle`](crate::settle) writes the outcomes in
//! batches and only then frees the slots. This module starts those loops
//! for every type that has a plugin and, at shutdown, stops claiming, lets
//! running tasks finish within the grace period, ends the rest and hands
//! their leases back.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{error, info, warn};

use crate::health::Health;
use crate::registry::Registry;
use crate::runtime::Runtime;
use crate::settle::Finished;
use crate::store::Store;
use crate::task::Lease;
use crate::task_type::TaskType;
use crate::wakeup::Wakeups;

/// How long shutdown waits for the last outcomes to be written.
const SETTLE_AT_EXIT: Duration = Duration::from_secs(10);

/// What the runner tells an [`Observer`]: a task started running, or its outcome was written.
#[derive(Debug, Clone, Copy)]
pub enum Event<'a> {
    /// A handler is about to run the task.
    Started {
        /// Its type.
        task_type: &'a TaskType,
        /// Its id.
        id: &'a [u8],
        /// The score it was claimed with (ms since the epoch).
        due_ms: i64,
        /// Short hash of the plugin version that runs it.
        plugin_hash: &'a str,
    },
    /// Its outcome is stored in Redis (`fenced`: ignored because the lease was lost).
    Settled {
        /// Its type.
        task_type: &'a TaskType,
        /// Its id.
        id: &'a [u8],
        /// True for a success ack.
        acked: bool,
        /// True when the outcome was ignored (stale lease token).
        fenced: bool,
    },
}

/// A callback the runner invokes at task start and settle, e.g. for `hourglass bench`.
/// It runs on hot paths, so it must be quick; without one the runner pays nothing.
pub type Observer = Arc<dyn Fn(Event<'_>) + Send + Sync>;

/// What the runner is handed by the host that starts it.
pub struct Parts {
    /// Where the tasks are (recording this host as the holder of its leases).
    pub store: Store,
    /// Which plugin serves which type, kept current.
    pub registry: Registry,
    /// The sandbox the runs execute in.
    pub runtime: Runtime,
    /// Early wake-ups when a due set changes.
    pub wakeups: Wakeups,
    /// Outages and per-type faults, shared with the admin server.
    pub health: Health,
    /// Told about every start and settle (benchmarks); `None` in production.
    pub observer: Option<Observer>,
    /// Requests to stop runs, as the wake-up listener receives them.
    pub cancels: mpsc::UnboundedReceiver<CancelRequest>,
}

/// Shared handles of the running host; cheap to clone.
#[derive(Clone)]
pub(crate) struct Runner {
    pub(crate) store: Store,
    pub(crate) registry: Registry,
    pub(crate) runtime: Runtime,
    pub(crate) wakeups: Wakeups,
    pub(crate) health: Health,
    /// Slots of the global `runner.concurrency`.
    pub(crate) global: Arc<Semaphore>,
    /// Cancelled at shutdown: no new claims.
    pub(crate) stop_claiming: CancellationToken,
    /// Cancelled when the grace period is over: runs still going are ended.
    pub(crate) abort: CancellationToken,
    /// Every run in progress, so shutdown can wait for them.
    pub(crate) runs: TaskTracker,
    pub(crate) poll_interval: Duration,
    pub(crate) batch_size: usize,
    pub(crate) lease: Duration,
    pub(crate) observer: Option<Observer>,
}

/// A claimed task not yet settled: when its lease was last renewed, and how to stop its run.
pub(crate) struct InFlightRun {
    pub(crate) renewed: Instant,
    /// Cancelled by `hourglass cancel` (through Redis): the run ends as cancelled.
    pub(crate) stop: CancellationToken,
}

/// Claimed tasks of one type by (id, lease token).
pub(crate) type InFlight = Arc<Mutex<HashMap<Lease, InFlightRun>>>;

/// A request to stop one run, from `hourglass cancel` through Redis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CancelRequest {
    /// Its type.
    pub task_type: TaskType,
    /// Its id.
    pub id: Vec<u8>,
    /// The lease token of the run to stop (a later run of the same id is left alone).
    pub token: u64,
}

impl CancelRequest {
    /// Reads a cancel message: `<type>\n<token>\n<id>`.
    pub fn parse(message: &[u8]) -> Option<CancelRequest> {
        let mut parts = message.splitn(3, |&b| b == b'\n');
        let task_type = std::str::from_utf8(parts.next()?).ok()?.parse().ok()?;
        let token = std::str::from_utf8(parts.next()?).ok()?.parse().ok()?;
        Some(CancelRequest { task_type, token, id: parts.next()?.to_vec() })
    }
}

/// The global and per-type concurrency slots one task holds until it is settled.
pub(crate) type Permits = (OwnedSemaphorePermit, OwnedSemaphorePermit);

/// Per task type: its concurrency limit, running tasks and settle queue.
pub(crate) struct TypeState {
    pub(crate) semaphore: Arc<Semaphore>,
    /// Most tasks one claim takes: see [`claim_size`](crate::claim::claim_size).
    pub(crate) claim_size: usize,
    pub(crate) in_flight: InFlight,
    pub(crate) settle_tx: Mutex<Option<mpsc::UnboundedSender<Finished>>>,
    settler: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// The worker ended because the type lost its plugin.
    pub(crate) stopped: AtomicBool,
    pub(crate) metrics: Arc<crate::telemetry::TypeMetrics>,
}

impl TypeState {
    fn new(runner: &Runner, task_type: &TaskType, concurrency: usize) -> TypeState {
        let (tx, rx) = mpsc::unbounded_channel();
        let in_flight = InFlight::default();
        let metrics = Arc::new(crate::telemetry::TypeMetrics::new(task_type));
        let state = TypeState {
            semaphore: Arc::new(Semaphore::new(concurrency)),
            claim_size: crate::claim::claim_size(runner.batch_size, concurrency),
            in_flight: in_flight.clone(),
            settle_tx: Mutex::new(Some(tx)),
            settler: Mutex::new(None),
            stopped: AtomicBool::new(false),
            metrics: metrics.clone(),
        };
        let settler = tokio::spawn(runner.clone().settler(task_type.clone(), in_flight, metrics, rx));
        *state.settler.lock().unwrap_or_else(|p| p.into_inner()) = Some(settler);
        state
    }

    /// Stops the run of `id` under `token`, if this host holds it; true if it did.
    fn stop(&self, id: &[u8], token: u64) -> bool {
        let map = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        // A cancel names the task and its token, not its claim; it is rare, so a scan will do.
        match map.iter().find(|(lease, _)| lease.id == id && lease.token == token).map(|(_, run)| run) {
            Some(run) => {
                run.stop.cancel();
                true
            }
            None => false,
        }
    }

    /// Leases of tasks claimed and not yet settled.
    fn in_flight_leases(&self) -> Vec<Lease> {
        let map = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        map.keys().cloned().collect()
    }

    /// Closes the settle queue and waits until everything in it is written,
    /// or gives up after [`SETTLE_AT_EXIT`] (Redis is down): those tasks'
    /// leases expire and they run again, as after a crash.
    async fn close_settler(&self, task_type: &TaskType) {
        self.settle_tx.lock().unwrap_or_else(|p| p.into_inner()).take();
        let handle = self.settler.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(mut h) = handle
            && tokio::time::timeout(SETTLE_AT_EXIT, &mut h).await.is_err()
        {
            h.abort();
            error!(task_type = %task_type, "outcomes not written before exit (Redis unreachable): those tasks run again once their leases expire");
        }
    }
}

/// Runs every type's claim loop until `shutdown` is cancelled, then drains:
/// no new claims; running tasks get `grace_period` to finish; the runs still
/// going are ended (their futures dropped, so their instances and slots
/// come back at once) and their leases handed back to `due`, due now.
pub async fn run(parts: Parts, shutdown: CancellationToken) {
    let config = parts.registry.config();
    let mut cancels = parts.cancels;
    let runner = Runner {
        store: parts.store,
        registry: parts.registry,
        runtime: parts.runtime,
        wakeups: parts.wakeups,
        health: parts.health,
        global: Arc::new(Semaphore::new(config.runner.concurrency)),
        stop_claiming: shutdown.clone(),
        abort: CancellationToken::new(),
        runs: TaskTracker::new(),
        poll_interval: config.runner.poll_interval,
        batch_size: config.runner.batch_size,
        lease: config.runner.lease,
        observer: parts.observer,
    };
    let workers = TaskTracker::new();
    let mut states: HashMap<TaskType, Arc<TypeState>> = HashMap::new();
    let mut versions = runner.registry.subscribe();
    loop {
        // Start a worker for every type that gained a plugin.
        for task_type in runner.registry.types() {
            if states.get(&task_type).is_some_and(|s| !s.stopped.load(Ordering::Relaxed)) {
                continue;
            }
            let concurrency = runner.registry.config().policy(&task_type).concurrency;
            let state = Arc::new(TypeState::new(&runner, &task_type, concurrency));
            states.insert(task_type.clone(), state.clone());
            let r = runner.clone();
            workers.spawn(async move { r.type_worker(task_type, state).await });
        }
        tokio::select! {
            _ = shutdown.cancelled() => break,
            changed = versions.changed() => if changed.is_err() { break },
            Some(request) = cancels.recv() => {
                if states.get(&request.task_type).is_some_and(|s| s.stop(&request.id, request.token)) {
                    info!(task_type = %request.task_type, task_id = %crate::logging::clean_id(&request.id), "cancel asked: stopping the run");
                }
            }
        }
    }

    let grace = runner.registry.config().runner.grace_period;
    info!(grace = ?grace, "shutting down: no new claims; waiting for running tasks");
    runner.runs.close();
    if tokio::time::timeout(grace, runner.runs.wait()).await.is_err() {
        let unfinished = runner.runs.len();
        runner.abort.cancel();
        runner.runs.wait().await;
        warn!(unfinished, "grace period over: the runs still going were stopped");
    }
    for (task_type, state) in &states {
        state.close_settler(task_type).await;
    }
    for (task_type, state) in &states {
        let leases = state.in_flight_leases();
        if leases.is_empty() {
            continue;
        }
        match runner.store.release(task_type, &leases).await {
            Ok(n) => {
                warn!(task_type = %task_type, handed_back = n, "leases of unfinished tasks handed back: due now for any host")
            }
            Err(e) => error!(task_type = %task_type, "cannot hand leases back, they will expire: {e:#}"),
        }
    }
    workers.close();
    workers.wait().await;
}

#[cfg(test)]
mod tests {
    use super::CancelRequest;

    #[test]
    fn cancel_messages_parse_with_any_id_bytes() {
        let r = CancelRequest::parse(b"order.timeout\n42\na\nb\xff").unwrap();
        assert_eq!((r.task_type.as_str(), r.token, r.id.as_slice()), ("order.timeout", 42, &b"a\nb\xff"[..]));
        assert!(CancelRequest::parse(b"Bad Type\n1\nx").is_none());
        assert!(CancelRequest::parse(b"t\nnot-a-number\nx").is_none());
        assert!(CancelRequest::parse(b"t\n1").is_none());
    }
}
