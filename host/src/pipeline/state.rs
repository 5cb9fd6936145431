//! The runner's shared state: the handles the stages take theirs from, each type's slots, tasks in flight and settle queue.
//!
//! Claim, dispatch and settle read and change this; it imports none of them.

use hourglass_task::sync::LockExt;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::error;

use crate::health::Health;
use crate::registry::Registry;
use crate::runtime::Runtime;
use crate::store::Store;
use crate::task::{Lease, Settlement};
use crate::task_type::TaskType;
use crate::wakeup::Wakeups;

/// How long shutdown waits for the last outcomes to be written.
const SETTLE_AT_EXIT: Duration = Duration::from_secs(10);

/// Shared handles of the running host, from which each stage takes the ones it uses.
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
    /// Set when the grace period is over: runs still going are ended (each
    /// through its `lost` token, so no run waits on a token all runs share).
    pub(crate) aborted: Arc<AtomicBool>,
    /// Every claim with runs in progress, so shutdown can wait for them.
    pub(crate) runs: TaskTracker,
    pub(crate) poll_interval: Duration,
    pub(crate) batch_size: usize,
    pub(crate) lease: Duration,
}

/// A claimed task not yet settled: when its lease was last renewed, and how to stop its run.
pub(crate) struct InFlightRun {
    pub(crate) renewed: Instant,
    /// Cancelled by `hourglass cancel` (through Redis): the run ends as cancelled.
    pub(crate) stop: CancellationToken,
    /// Cancelled when this host no longer holds the lease (reaped, or not
    /// renewed in time): the run ends where it is and nothing is settled,
    /// since the task is, or soon will be, another host's to run.
    pub(crate) lost: CancellationToken,
    /// Set when the handler is done (its outcome may still wait to be settled).
    pub(crate) ended: Arc<AtomicBool>,
}

impl InFlightRun {
    /// The lease is gone: stops the run; whether its handler was still going
    /// (a handler that already ended has its outcome fenced instead).
    pub(crate) fn lose(&self) -> bool {
        self.lost.cancel();
        !self.ended.load(std::sync::atomic::Ordering::Acquire)
    }
}

/// Claimed tasks of one type by (id, lease token).
pub(crate) type InFlight = Arc<Mutex<HashMap<Lease, InFlightRun>>>;

/// The global and per-type concurrency slots one task holds until it is settled.
pub(crate) type Permits = (OwnedSemaphorePermit, OwnedSemaphorePermit);

/// Per task type, or per shard of a sharded type: its concurrency slots
/// (shared by a type's shards), running tasks and settle queue.
pub(crate) struct TypeState {
    pub(crate) semaphore: Arc<Semaphore>,
    /// Most tasks one claim takes: see [`claim_size`](super::claim::claim_size).
    pub(crate) claim_size: usize,
    pub(crate) in_flight: InFlight,
    pub(crate) settle_tx: Mutex<Option<mpsc::UnboundedSender<Finished>>>,
    /// Notified once the last outcome of a claim is queued: the settler,
    /// lingering for whole claims, then wakes once per claim rather than once
    /// per outcome, each wake a thread woken on another core.
    pub(crate) claim_reported: Arc<Notify>,
    settler: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// The worker ended because the type lost its plugin.
    pub(crate) stopped: AtomicBool,
    pub(crate) metrics: Arc<crate::telemetry::TypeMetrics>,
}

impl TypeState {
    /// A type's (or a shard's) state with the type's `slots` and claims of
    /// `claim_size`, and the receiving end of its settle queue (for its settler).
    pub(crate) fn new(task_type: &TaskType, slots: Arc<Semaphore>, claim_size: usize) -> (TypeState, SettleQueue) {
        let (tx, rx) = mpsc::unbounded_channel();
        let claim_reported = Arc::new(Notify::new());
        let queue = SettleQueue { outcomes: rx, claim_reported: claim_reported.clone() };
        let state = TypeState {
            semaphore: slots,
            claim_size,
            in_flight: InFlight::default(),
            settle_tx: Mutex::new(Some(tx)),
            claim_reported,
            settler: Mutex::new(None),
            stopped: AtomicBool::new(false),
            metrics: Arc::new(crate::telemetry::TypeMetrics::new(task_type)),
        };
        (state, queue)
    }

    /// Keeps the settler's handle, so [`TypeState::close_settler`] can wait for it.
    pub(crate) fn set_settler(&self, settler: tokio::task::JoinHandle<()>) {
        *self.settler.lock_unpoisoned() = Some(settler);
    }

    /// Stops the run of `id` under `token`, if this host holds it; true if it did.
    pub(crate) fn stop(&self, id: &[u8], token: u64) -> bool {
        let map = self.in_flight.lock_unpoisoned();
        // A cancel names the task and its token, not its claim; it is rare, so a scan will do.
        match map.iter().find(|(lease, _)| lease.id == id && lease.token == token).map(|(_, run)| run) {
            Some(run) => {
                run.stop.cancel();
                true
            }
            None => false,
        }
    }

    /// Shutdown past its grace period: ends every run still going (see
    /// [`Runner::aborted`]); how many handlers were still going.
    pub(crate) fn abort_runs(&self) -> usize {
        let map = self.in_flight.lock_unpoisoned();
        map.values().filter(|run| run.lose()).count()
    }

    /// Leases of tasks claimed and not yet settled.
    pub(crate) fn in_flight_leases(&self) -> Vec<Lease> {
        let map = self.in_flight.lock_unpoisoned();
        map.keys().cloned().collect()
    }

    /// Closes the settle queue and waits until everything in it is written,
    /// or gives up after [`SETTLE_AT_EXIT`] (Redis is down): those tasks'
    /// leases expire and they run again, as after a crash.
    pub(crate) async fn close_settler(&self, task_type: &TaskType) {
        self.settle_tx.lock_unpoisoned().take();
        let handle = self.settler.lock_unpoisoned().take();
        if let Some(mut h) = handle
            && tokio::time::timeout(SETTLE_AT_EXIT, &mut h).await.is_err()
        {
            h.abort();
            error!(task_type = %task_type, "outcomes not written before exit (Redis unreachable): those tasks run again once their leases expire");
        }
    }
}

/// The settler's end of a type's settle queue.
pub(crate) struct SettleQueue {
    pub(crate) outcomes: mpsc::UnboundedReceiver<Finished>,
    /// [`TypeState::claim_reported`].
    pub(crate) claim_reported: Arc<Notify>,
}

/// An outcome queued for the settler, with the slots it frees once stored and
/// how many outcomes of the same claim are still to come.
pub(crate) struct Finished {
    pub(crate) settlement: Settlement,
    /// The run's span (traced types only): the settler ends it once the outcome is stored.
    pub(crate) span: Option<crate::traces::RunSpan>,
    pub(crate) permits: Permits,
    pub(crate) claim_unreported: Arc<AtomicUsize>,
}
