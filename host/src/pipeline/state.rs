//! The runner's shared state: the handles the stages take theirs from, and each type's slots, leases held and settle queue.
//!
//! Claim, dispatch and settle read and change this; it imports none of them.

use hourglass_task::sync::LockExt;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::error;

use super::in_flight::InFlight;
use crate::fleet::wakeup::Wakeups;
use crate::observe::health::Health;
use crate::registry::Registry;
use crate::runtime::Runtime;
use crate::store::Store;
use crate::task::Settlement;
use crate::task_type::TaskType;

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
    /// Every claim with runs in progress, so shutdown can wait for them.
    pub(crate) runs: TaskTracker,
    pub(crate) poll_interval: Duration,
    pub(crate) batch_size: usize,
    pub(crate) lease: Duration,
}

/// The global and per-type concurrency slots one task holds until it is settled.
pub(crate) type Permits = (OwnedSemaphorePermit, OwnedSemaphorePermit);

/// Per task type, or per shard of a sharded type: its concurrency slots
/// (shared by a type's shards), running tasks and settle queue.
pub(crate) struct TypeState {
    pub(crate) semaphore: Arc<Semaphore>,
    /// Most tasks one claim takes: see [`claim_size`](super::claim::claim_size).
    pub(crate) claim_size: usize,
    /// The leases held: claimed and not yet settled, dropped or handed back.
    pub(crate) in_flight: Arc<InFlight>,
    pub(crate) settle_tx: Mutex<Option<mpsc::UnboundedSender<Queued>>>,
    /// Notified once the last outcome of a claim is queued: the settler,
    /// lingering for whole claims, then wakes once per claim rather than once
    /// per outcome, each wake a thread woken on another core.
    pub(crate) claim_reported: Arc<Notify>,
    settler: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// The worker ended because the type lost its plugin.
    pub(crate) stopped: AtomicBool,
    pub(crate) metrics: Arc<crate::observe::telemetry::TypeMetrics>,
    /// Where its runs' progress reports go (set as the type starts).
    pub(crate) progress: std::sync::OnceLock<Arc<dyn crate::runtime::ReportProgress>>,
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
            in_flight: Arc::default(),
            settle_tx: Mutex::new(Some(tx)),
            claim_reported,
            settler: Mutex::new(None),
            stopped: AtomicBool::new(false),
            metrics: Arc::new(crate::observe::telemetry::TypeMetrics::new(task_type)),
            progress: std::sync::OnceLock::new(),
        };
        (state, queue)
    }

    /// Keeps the settler's handle, so [`TypeState::close_settler`] can wait for it.
    pub(crate) fn set_settler(&self, settler: tokio::task::JoinHandle<()>) {
        *self.settler.lock_unpoisoned() = Some(settler);
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
    pub(crate) outcomes: mpsc::UnboundedReceiver<Queued>,
    /// [`TypeState::claim_reported`].
    pub(crate) claim_reported: Arc<Notify>,
}

/// An outcome queued for the settler, with the slots it frees once stored and
/// how many outcomes of the same claim are still to come.
pub(crate) struct Queued {
    pub(crate) settlement: Settlement,
    /// The run's span (traced types only): the settler ends it once the outcome is stored.
    pub(crate) span: Option<crate::observe::traces::RunSpan>,
    pub(crate) permits: Permits,
    pub(crate) claim_unreported: Arc<AtomicUsize>,
}
