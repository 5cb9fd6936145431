//! The runner: for every type with a plugin, claim due tasks, run them in the sandbox, and settle the outcomes.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, error, info, warn};

use crate::backoff;
use crate::config::Config;
use crate::registry::{Entry, Registry};
use crate::runtime::{Failure, Runtime, RuntimeOptions};
use crate::store::{ClaimLimits, Outcome, RunInfo, SettleResult, Settlement, Store};
use crate::task::ClaimedTask;
use crate::task_type::TaskType;
use crate::wakeup::{self, Wakeups};

/// Scores below this (1973-03-03 in ms) were almost surely written in seconds.
const SECONDS_NOT_MS: i64 = 100_000_000_000;
/// Longest idle sleep when keyspace notifications are live: a safety net, not the wake-up path.
const IDLE_WITH_NOTIFICATIONS: Duration = Duration::from_secs(2);
/// Ids longer than this are dead-lettered at claim time.
const MAX_ID_BYTES: usize = 1024;

/// What the runner tells an [`Observer`]: a task started running, or its outcome was written.
#[derive(Debug, Clone, Copy)]
pub enum Event<'a> {
    /// A handler is about to run the task (on the thread that runs it).
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

/// Runs the host until `shutdown` is cancelled, then drains gracefully:
/// stop claiming, let running tasks finish within the grace period, hand the
/// leases of unfinished ones back to `due`.
///
/// `config_file`, when given, is watched and re-applied on change.
pub async fn run(
    config: Config,
    config_file: Option<PathBuf>,
    store: Store,
    shutdown: CancellationToken,
) -> Result<()> {
    run_observed(config, config_file, store, shutdown, None).await
}

/// [`run`], reporting every task's start and settle to `observer`.
pub async fn run_observed(
    config: Config,
    config_file: Option<PathBuf>,
    store: Store,
    shutdown: CancellationToken,
    observer: Option<Observer>,
) -> Result<()> {
    let largest_memory = std::iter::once(config.defaults.memory_limit)
        .chain(config.types.keys().map(|t| config.policy(t).memory_limit))
        .max()
        .unwrap_or_default();
    let runtime = Runtime::new(RuntimeOptions {
        cache_dir: Some(config.runner.cache_dir.clone()),
        max_instances: u32::try_from(config.runner.concurrency).unwrap_or(u32::MAX),
        max_memory: largest_memory.as_u64(),
    })
    .context("cannot start the Wasm runtime")?;

    let registry = {
        let runtime = runtime.clone();
        let config = config.clone();
        tokio::task::spawn_blocking(move || Registry::load(runtime, config)).await??
    };
    let watcher = registry.watch(config_file, shutdown.clone())?;
    // Many hosts share one Redis: each beats under its id and records it with its leases.
    let host_id = config.runner.host_id.clone().unwrap_or_else(crate::hosts::default_host_id);
    let store = store.with_holder(&host_id);
    let presence = crate::hosts::Presence::start(&store, &host_id).await?;
    let wakeups = wakeup::start(&store, config.runner.wakeup, shutdown.clone()).await?;
    let admin = crate::admin::start(&config, &store, &registry, &shutdown).await?;
    info!(
        plugins = %config.runner.plugins_dir.display(),
        types = ?registry.types().iter().map(TaskType::as_str).collect::<Vec<_>>(),
        "hourglass is running"
    );

    let runner = Runner {
        store,
        registry: registry.clone(),
        wakeups,
        global: Arc::new(Semaphore::new(config.runner.concurrency)),
        stop_claiming: shutdown.clone(),
        tasks: TaskTracker::new(),
        redis_down: Arc::new(AtomicBool::new(false)),
        poll_interval: config.runner.poll_interval,
        batch_size: config.runner.batch_size,
        lease: config.runner.lease,
        observer,
    };
    let workers = TaskTracker::new();
    let mut states: HashMap<TaskType, Arc<TypeState>> = HashMap::new();
    let mut versions = registry.subscribe();
    loop {
        // Start a worker for every type that gained a plugin.
        for task_type in registry.types() {
            if states.get(&task_type).is_some_and(|s| !s.stopped.load(Ordering::Relaxed)) {
                continue;
            }
            let state = Arc::new(TypeState::new(&runner, &task_type, &config));
            states.insert(task_type.clone(), state.clone());
            let r = runner.clone();
            workers.spawn(async move { r.type_worker(task_type, state).await });
        }
        tokio::select! {
            _ = shutdown.cancelled() => break,
            changed = versions.changed() => if changed.is_err() { break },
        }
    }

    info!(grace = ?config.runner.grace_period, "shutting down: no new claims; waiting for running tasks");
    runner.tasks.close();
    let drained = tokio::time::timeout(config.runner.grace_period, runner.tasks.wait()).await.is_ok();
    for state in states.values() {
        state.close_settler().await;
    }
    if !drained {
        for (task_type, state) in &states {
            let leases = state.in_flight_leases();
            if leases.is_empty() {
                continue;
            }
            match runner.store.release(task_type, &leases).await {
                Ok(n) => {
                    warn!(task_type = %task_type, handed_back = n, "grace period over: leases of unfinished tasks handed back")
                }
                Err(e) => {
                    error!(task_type = %task_type, "cannot hand leases back, they will expire: {e:#}")
                }
            }
        }
    }
    workers.close();
    workers.wait().await;
    watcher.abort();
    admin.stop().await;
    presence.stop().await;
    info!("stopped");
    Ok(())
}

/// Shared handles of the running host.
#[derive(Clone)]
struct Runner {
    store: Store,
    registry: Registry,
    wakeups: Wakeups,
    global: Arc<Semaphore>,
    stop_claiming: CancellationToken,
    /// Every running handler, so shutdown can wait for them.
    tasks: TaskTracker,
    /// Set while Redis is unreachable, so an outage is logged once, not per attempt.
    redis_down: Arc<AtomicBool>,
    poll_interval: Duration,
    batch_size: usize,
    lease: Duration,
    /// Told about every start and settle (benchmarks); `None` in production.
    observer: Option<Observer>,
}

/// Running tasks of one type by (id, lease token), with when their lease was last renewed.
type InFlight = Arc<Mutex<HashMap<(Vec<u8>, u64), Instant>>>;

/// Per task type: its concurrency limit, running tasks and settle queue.
struct TypeState {
    semaphore: Arc<Semaphore>,
    /// Most tasks one claim takes: see [`claim_size`].
    claim_size: usize,
    in_flight: InFlight,
    settle_tx: Mutex<Option<mpsc::UnboundedSender<Finished>>>,
    settler: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// The worker ended because the type lost its plugin.
    stopped: AtomicBool,
    metrics: crate::telemetry::TypeMetrics,
}

/// The global and per-type concurrency slots one task holds until it is settled.
type Permits = (OwnedSemaphorePermit, OwnedSemaphorePermit);

/// An outcome queued for the settler, with the slots it frees once stored and
/// how many outcomes of the same claim are still to come.
struct Finished {
    settlement: Settlement,
    permits: Permits,
    claim_unreported: Arc<AtomicUsize>,
}

impl TypeState {
    fn new(runner: &Runner, task_type: &TaskType, config: &Config) -> TypeState {
        let (tx, rx) = mpsc::unbounded_channel();
        let in_flight = InFlight::default();
        let metrics = crate::telemetry::TypeMetrics::new(task_type);
        let concurrency = config.policy(task_type).concurrency;
        let state = TypeState {
            semaphore: Arc::new(Semaphore::new(concurrency)),
            claim_size: claim_size(runner.batch_size, concurrency),
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

    fn in_flight_leases(&self) -> Vec<(Vec<u8>, u64)> {
        let map = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        map.keys().cloned().collect()
    }

    /// Closes the settle queue and waits until everything in it is written.
    async fn close_settler(&self) {
        self.settle_tx.lock().unwrap_or_else(|p| p.into_inner()).take();
        let handle = self.settler.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(h) = handle {
            let _ = h.await;
        }
    }
}

impl Runner {
    /// Claims and dispatches the tasks of one type until shutdown or until the type loses its plugin.
    async fn type_worker(self, task_type: TaskType, state: Arc<TypeState>) {
        let wakeup = self.wakeups.of(&task_type);
        let heartbeat = tokio::spawn(self.clone().heartbeat(task_type.clone(), state.clone()));
        let mut outage_backoff = Duration::from_millis(50);
        'claiming: loop {
            if self.stop_claiming.is_cancelled() {
                break;
            }
            let Some(entry) = self.registry.get(&task_type) else {
                info!(task_type = %task_type, "no plugin serves this type any more: claims stopped");
                break;
            };
            // Wait for one slot, then take as many more as are free, up to a batch.
            let Some(mut permits) = self.acquire(&state, 1).await else {
                break;
            };
            permits.extend(self.try_acquire(&state, state.claim_size - 1));

            // Registered before the claim, so a notification during it is not lost.
            let notified = wakeup.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();

            let limits = ClaimLimits {
                max_tasks: permits.len(),
                lease: self.lease,
                max_payload_bytes: entry.policy.max_payload.as_u64(),
                max_id_bytes: MAX_ID_BYTES,
            };
            let claim = match self.store.claim(&task_type, &limits).await {
                Ok(c) => {
                    state.metrics.claimed(&c);
                    self.redis_is_up();
                    outage_backoff = Duration::from_millis(50);
                    c
                }
                Err(e) => {
                    drop(permits);
                    self.redis_is_down(&e);
                    tokio::select! {
                        _ = self.stop_claiming.cancelled() => break 'claiming,
                        _ = tokio::time::sleep(outage_backoff) => {}
                    }
                    outage_backoff = (outage_backoff * 2).min(Duration::from_secs(2));
                    continue;
                }
            };
            for (id, reason) in &claim.dead_lettered {
                error!(task_type = %task_type, task_id = %String::from_utf8_lossy(id), "dead-lettered without running: {reason}");
            }
            let claimed_all = claim.tasks.len() == limits.max_tasks;
            let mut runnable = Vec::with_capacity(claim.tasks.len());
            for task in claim.tasks {
                let Some(task_permits) = permits.pop() else {
                    break;
                };
                runnable.push((task, task_permits));
            }
            drop(permits);
            self.dispatch_batch(&state, &entry, runnable);
            if claimed_all {
                continue; // more may be due right now
            }
            // Sleep until the next due task or lease expiry, or until woken.
            let next = [claim.next_due_ms, claim.next_lease_expiry_ms].into_iter().flatten().min();
            let idle = if self.wakeups.live() { IDLE_WITH_NOTIFICATIONS } else { self.poll_interval };
            let sleep = next
                .map(|at| Duration::from_millis(u64::try_from(at - claim.now_ms).unwrap_or(0)))
                .map_or(idle, |until| until.min(idle));
            if sleep.is_zero() {
                continue;
            }
            tokio::select! {
                _ = self.stop_claiming.cancelled() => break,
                _ = notified => {}
                _ = tokio::time::sleep(sleep) => {}
            }
        }
        heartbeat.abort();
        if !self.stop_claiming.is_cancelled() {
            state.stopped.store(true, Ordering::Relaxed);
        }
    }

    /// Waits for `n` slots of both the global and the type's limit.
    async fn acquire(&self, state: &TypeState, n: usize) -> Option<Vec<Permits>> {
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let permits = tokio::select! {
                _ = self.stop_claiming.cancelled() => return None,
                p = async {
                    let typed = state.semaphore.clone().acquire_owned().await.ok()?;
                    let global = self.global.clone().acquire_owned().await.ok()?;
                    Some((global, typed))
                } => p?,
            };
            out.push(permits);
        }
        Some(out)
    }

    /// Takes up to `n` slots that are free right now.
    fn try_acquire(&self, state: &TypeState, n: usize) -> Vec<Permits> {
        let mut out = Vec::new();
        while out.len() < n {
            let Ok(typed) = state.semaphore.clone().try_acquire_owned() else {
                break;
            };
            let Ok(global) = self.global.clone().try_acquire_owned() else {
                break;
            };
            out.push((global, typed));
        }
        out
    }

    /// Runs the tasks of one claim on a few blocking workers and queues each
    /// outcome for settling as soon as it is known.
    ///
    /// Starting one thread hop per task costs more than a small handler runs,
    /// so a claim's tasks share `min(n, cores)` workers that take them in
    /// turn. When no task finishes for a tick (handlers waiting on I/O or
    /// sleeping), the batch adds as many workers again, up to one per task, so
    /// slow tasks still run side by side up to the concurrency limits.
    fn dispatch_batch(&self, state: &Arc<TypeState>, entry: &Entry, tasks: Vec<(ClaimedTask, Permits)>) {
        if tasks.is_empty() {
            return;
        }
        let now = Instant::now();
        {
            let mut in_flight = state.in_flight.lock().unwrap_or_else(|p| p.into_inner());
            for (task, _) in &tasks {
                in_flight.insert((task.id.clone(), task.token), now);
            }
        }
        for (task, _) in tasks.iter().filter(|(t, _)| t.due_ms < SECONDS_NOT_MS) {
            warn!(
                task_type = %task.task_type, task_id = %String::from_utf8_lossy(&task.id), attempt = task.attempt, score = task.due_ms,
                "due score looks like seconds, not milliseconds; running it now anyway"
            );
        }
        let n = tasks.len();
        let task_type = tasks[0].0.task_type.clone();
        let batch = Arc::new(Batch {
            task_type,
            queue: Mutex::new(tasks.into()),
            running: Mutex::new(Vec::new()),
            finished: AtomicUsize::new(0),
            unreported: Arc::new(AtomicUsize::new(n)),
            entry: entry.clone(),
            state: state.clone(),
            observer: self.observer.clone(),
        });
        self.tasks.spawn(async move {
            let mut workers = tokio::task::JoinSet::new();
            let add_workers = |workers: &mut tokio::task::JoinSet<()>, k: usize| {
                for _ in 0..k {
                    let batch = batch.clone();
                    workers.spawn_blocking(move || batch.work());
                }
            };
            add_workers(&mut workers, n.min(run_parallelism()));
            let mut finished_before = 0;
            let mut tick = tokio::time::interval(FANOUT_TICK);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            // Done when every task is settled, even if a worker is still stuck in a host call.
            while batch.finished.load(Ordering::Acquire) < n {
                tokio::select! {
                    Some(_) = workers.join_next() => {}
                    _ = tick.tick() => {
                        let finished = batch.finished.load(Ordering::Acquire);
                        let queued = batch.queue.lock().unwrap_or_else(|p| p.into_inner()).len();
                        if finished == finished_before && queued > 0 && workers.len() < n {
                            let more = workers.len().min(queued).max(1);
                            add_workers(&mut workers, more);
                        }
                        finished_before = finished;
                        // The epoch deadline stops guest code; this bounds time spent in host calls too.
                        let limit = batch.entry.policy.timeout + Duration::from_secs(1);
                        if batch.fail_running(|r| r.since.elapsed() > limit) > 0 && queued > 0 {
                            add_workers(&mut workers, 1);
                        }
                    }
                }
            }
            workers.detach_all();
        });
    }

    /// Writes outcomes in batches (one script call per batch), retrying
    /// through Redis outages so that no outcome is dropped.
    async fn settler(
        self,
        task_type: TaskType,
        in_flight: InFlight,
        metrics: crate::telemetry::TypeMetrics,
        mut rx: mpsc::UnboundedReceiver<Finished>,
    ) {
        let mut gathered = Gathered::default();
        while let Some(first) = rx.recv().await {
            gathered.push(first);
            // Take what is queued; while the claims in hand still have tasks
            // running, linger briefly for them, so that one script call
            // settles whole claims rather than one or two tasks. Later
            // claims are not waited for: their slots are what the next
            // claim is made of, so merging them would stall the pipeline.
            let linger_until = tokio::time::Instant::now() + SETTLE_LINGER;
            while gathered.batch.len() < SETTLE_MAX {
                let next = match rx.try_recv() {
                    Ok(next) => Some(next),
                    Err(mpsc::error::TryRecvError::Disconnected) => None,
                    Err(mpsc::error::TryRecvError::Empty) if gathered.claims_reported() => None,
                    Err(mpsc::error::TryRecvError::Empty) => {
                        tokio::time::timeout_at(linger_until, rx.recv()).await.ok().flatten()
                    }
                };
                let Some(next) = next else { break };
                gathered.push(next);
            }
            let Gathered { batch, permits, .. } = std::mem::take(&mut gathered);
            let mut backoff = Duration::from_millis(50);
            let results = loop {
                let events = self.registry.config().events_maxlen(&task_type);
                match self.store.settle_with_events(&task_type, &batch, events).await {
                    Ok(r) => {
                        self.redis_is_up();
                        break r;
                    }
                    Err(e) => {
                        self.redis_is_down(&e);
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_secs(2));
                    }
                }
            };
            if let Some(observe) = &self.observer {
                for (s, r) in batch.iter().zip(&results) {
                    let (acked, fenced) = (matches!(s.outcome, Outcome::Ack { .. }), matches!(r, SettleResult::Fenced));
                    observe(Event::Settled { task_type: &task_type, id: &s.id, acked, fenced });
                }
            }
            for (s, r) in batch.iter().zip(&results) {
                if matches!(r, SettleResult::Fenced) {
                    warn!(task_type = %task_type, task_id = %String::from_utf8_lossy(&s.id), attempt = s.run.attempt,
                        "outcome ignored: the lease had expired and the task was claimed again");
                }
            }
            metrics.settled(&batch, &results);
            {
                let mut map = in_flight.lock().unwrap_or_else(|p| p.into_inner());
                for s in &batch {
                    map.remove(&(s.id.clone(), s.token));
                }
            }
            drop(permits); // frees the concurrency slots only now that the outcome is stored
        }
    }

    /// Extends the leases of tasks that run long, so they are not re-delivered.
    /// It also moves on follow-ups left in the type's outbox by a host that
    /// died between its ack and the delivery (at start, then every tick).
    async fn heartbeat(self, task_type: TaskType, state: Arc<TypeState>) {
        let every = self.lease / 3;
        loop {
            match self.store.flush_outbox(&task_type).await {
                Ok(0) => {}
                Ok(n) => info!(task_type = %task_type, delivered = n, "delivered follow-ups left in the outbox"),
                Err(e) => self.redis_is_down(&e),
            }
            tokio::time::sleep(every).await;
            let due: Vec<(Vec<u8>, u64)> = {
                let map = state.in_flight.lock().unwrap_or_else(|p| p.into_inner());
                map.iter().filter(|(_, renewed)| renewed.elapsed() >= every).map(|(k, _)| k.clone()).collect()
            };
            if due.is_empty() {
                continue;
            }
            match self.store.extend(&task_type, &due, self.lease.as_millis() as u64).await {
                Ok(extended) => {
                    let mut map = state.in_flight.lock().unwrap_or_else(|p| p.into_inner());
                    for (key, ok) in due.iter().zip(extended) {
                        if ok {
                            if let Some(renewed) = map.get_mut(key) {
                                *renewed = Instant::now();
                            }
                        } else {
                            let id = &key.0;
                            warn!(task_type = %task_type, task_id = %String::from_utf8_lossy(id), "lease lost while running");
                        }
                    }
                }
                Err(e) => self.redis_is_down(&e),
            }
        }
    }

    fn redis_is_down(&self, e: &anyhow::Error) {
        crate::telemetry::redis_error();
        if !self.redis_down.swap(true, Ordering::Relaxed) {
            error!("Redis is unreachable; retrying with backoff until it is back: {e:#}");
        }
    }

    fn redis_is_up(&self) {
        if self.redis_down.swap(false, Ordering::Relaxed) {
            info!("Redis is reachable again; resuming");
        }
    }
}

/// Outcomes the settler has taken from its queue for one script call.
#[derive(Default)]
struct Gathered {
    batch: Vec<Settlement>,
    permits: Vec<Permits>,
    /// Unreported-outcome counters of the claims in `batch`, each once.
    claims: Vec<Arc<AtomicUsize>>,
}

impl Gathered {
    fn push(&mut self, finished: Finished) {
        self.batch.push(finished.settlement);
        self.permits.push(finished.permits);
        if !self.claims.iter().any(|c| Arc::ptr_eq(c, &finished.claim_unreported)) {
            self.claims.push(finished.claim_unreported);
        }
    }

    /// Every outcome of the claims in hand is queued (and so taken or about to be).
    fn claims_reported(&self) -> bool {
        self.claims.iter().all(|c| c.load(Ordering::Acquire) == 0)
    }
}

/// Most tasks one claim of a type takes: `batch_size`, but no more than a
/// quarter of the type's slots. A claim's slots come back only when its
/// tasks are settled, so a claim that takes every slot leaves Redis idle
/// while the tasks run and the host idle while Redis claims and settles;
/// with quarters, up to four claims overlap (one being claimed, some
/// running, one being settled).
fn claim_size(batch_size: usize, type_concurrency: usize) -> usize {
    batch_size.min(type_concurrency / 4).max(1)
}

/// Most outcomes one settle call writes.
const SETTLE_MAX: usize = 512;
/// How long the settler waits for more outcomes of running tasks before writing what it has.
const SETTLE_LINGER: Duration = Duration::from_micros(500);

/// How often a batch checks for stalled workers and overdue tasks.
const FANOUT_TICK: Duration = Duration::from_millis(2);

/// Blocking workers a batch starts with: the machine's cores.
fn run_parallelism() -> usize {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(2, |n| n.get()))
}

/// The tasks of one claim, shared by the workers that run them.
struct Batch {
    queue: Mutex<std::collections::VecDeque<(ClaimedTask, Permits)>>,
    /// Tasks a worker is running now; the supervisor may fail one that overruns.
    running: Mutex<Vec<Running>>,
    /// Tasks whose outcome is queued for settling.
    finished: AtomicUsize,
    /// Tasks whose outcome is not yet queued (counted down just before it
    /// is, so the settler never lingers for an outcome already in its queue).
    unreported: Arc<AtomicUsize>,
    task_type: TaskType,
    entry: Entry,
    state: Arc<TypeState>,
    observer: Option<Observer>,
}

/// A task on a worker: enough to settle it if its worker never comes back.
struct Running {
    token: u64,
    id: Vec<u8>,
    attempt: u32,
    due_ms: i64,
    started_ms: i64,
    since: Instant,
    permits: Permits,
}

impl Batch {
    /// A worker: runs queued tasks one after another until none is left.
    fn work(&self) {
        let handler = &self.entry.handler;
        // A live instance kept between tasks when the type opted into reuse.
        let mut warm = None;
        loop {
            let Some((task, permits)) = self.queue.lock().unwrap_or_else(|p| p.into_inner()).pop_front() else {
                break;
            };
            if let Some(observe) = &self.observer {
                observe(Event::Started {
                    task_type: &task.task_type,
                    id: &task.id,
                    due_ms: task.due_ms,
                    plugin_hash: &self.entry.hash,
                });
            }
            let started_ms = crate::cli::now_ms();
            self.running.lock().unwrap_or_else(|p| p.into_inner()).push(Running {
                token: task.token,
                id: task.id.clone(),
                attempt: task.attempt,
                due_ms: task.due_ms,
                started_ms,
                since: Instant::now(),
                permits,
            });
            let measured = self.state.metrics.started(&task, started_ms);
            let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| handler.run_reusing(&mut warm, &task)));
            drop(measured);
            let (result, followups) = match run {
                Ok(run) => (run.result, run.followups),
                Err(_) => {
                    warm = None;
                    (Err(Failure::Error("handler thread failed: panic in the host".into())), Vec::new())
                }
            };
            let finished_ms = crate::cli::now_ms();
            let running = {
                let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
                running.iter().position(|r| r.token == task.token).map(|i| running.swap_remove(i))
            };
            // `None`: the supervisor already failed it for overrunning its deadline.
            let Some(running) = running else { continue };
            let outcome = decide(&self.entry, &task, result, followups, started_ms);
            let info = RunInfo { attempt: task.attempt, due_ms: task.due_ms, started_ms, finished_ms };
            self.send(Settlement { id: task.id, token: task.token, outcome, run: info }, running.permits);
        }
    }

    /// Queues an outcome for the settler (which frees the permits once it is stored).
    fn send(&self, settlement: Settlement, permits: Permits) {
        self.unreported.fetch_sub(1, Ordering::AcqRel);
        if let Some(tx) = self.state.settle_tx.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            let _ = tx.send(Finished { settlement, permits, claim_unreported: self.unreported.clone() });
        }
        self.finished.fetch_add(1, Ordering::Release);
    }

    /// Settles the running tasks that `overdue` picks as failed (deadline
    /// exceeded); their workers' late results are dropped. Returns how many.
    fn fail_running(&self, overdue: impl Fn(&Running) -> bool) -> usize {
        let failed: Vec<Running> = {
            let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
            let (out, keep) = std::mem::take(&mut *running).into_iter().partition(|r| overdue(r));
            *running = keep;
            out
        };
        let n = failed.len();
        let timeout = self.entry.policy.timeout;
        for r in failed {
            let task = ClaimedTask { task_type: self.task_type.clone(), id: r.id, payload: Vec::new(), attempt: r.attempt, due_ms: r.due_ms, token: r.token };
            let failure = Failure::Error(format!("deadline of {timeout:?} exceeded"));
            let outcome = decide(&self.entry, &task, Err(failure), Vec::new(), r.started_ms);
            let info =
                RunInfo { attempt: r.attempt, due_ms: r.due_ms, started_ms: r.started_ms, finished_ms: crate::cli::now_ms() };
            self.send(Settlement { id: task.id, token: task.token, outcome, run: info }, r.permits);
        }
        n
    }
}

/// Turns a handler's result into what to write: ack, retry with backoff, or dead letter.
fn decide(
    entry: &Entry,
    task: &ClaimedTask,
    result: Result<(), Failure>,
    followups: Vec<crate::task::FollowUp>,
    started_ms: i64,
) -> Outcome {
    let policy = &entry.policy;
    let id = String::from_utf8_lossy(&task.id);
    let lateness_ms = started_ms - task.due_ms;
    match result {
        Ok(()) => {
            debug!(task_type = %task.task_type, task_id = %id, attempt = task.attempt, lateness_ms, "succeeded");
            Outcome::Ack { followups }
        }
        Err(Failure::Permanent(reason)) => {
            error!(task_type = %task.task_type, task_id = %id, attempt = task.attempt, "dead-lettered: permanent failure: {reason}");
            Outcome::Dead { error: format!("permanent: {reason}") }
        }
        Err(failure) if task.attempt >= policy.max_attempts => {
            error!(task_type = %task.task_type, task_id = %id, attempt = task.attempt,
                "dead-lettered after {} attempts: {failure}", task.attempt);
            Outcome::Dead { error: failure.to_string() }
        }
        Err(failure) => {
            let delay = match &failure {
                Failure::RetryAfter(d) => *d,
                _ => backoff::retry_delay(policy.backoff_base, policy.backoff_cap, task.attempt),
            };
            warn!(task_type = %task.task_type, task_id = %id, attempt = task.attempt, retry_in = ?delay, "failed: {failure}");
            Outcome::Retry { delay, error: failure.to_string() }
        }
    }
}

/// `hourglass run`: resolve the Redis URL (starting a managed Redis if asked),
/// install signal handlers, and run until SIGINT/SIGTERM.
pub async fn run_from_cli(
    mut config: Config,
    target: crate::target::Target,
    plugins: Option<PathBuf>,
    config_file: Option<PathBuf>,
) -> Result<()> {
    if let Some(dir) = plugins {
        config.runner.plugins_dir = dir;
    }
    let managed = match target.single_url() {
        Some(url) => crate::managed::ensure(&config.redis, url).await?,
        None => None,
    };
    let store = Store::connect_to(&target, &config.redis.prefix).await?;
    let shutdown = CancellationToken::new();
    tokio::spawn(watch_signals(shutdown.clone()));
    let result = run(config, config_file, store, shutdown).await;
    if let Some(m) = managed {
        m.stop().await;
    }
    result
}

/// First SIGINT/SIGTERM: graceful shutdown. Second: exit at once.
async fn watch_signals(shutdown: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
        error!("cannot install signal handlers");
        return;
    };
    tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
    info!("signal received: shutting down gracefully (signal again to exit at once)");
    shutdown.cancel();
    tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
    warn!("second signal: exiting now; leases of running tasks will expire and be re-delivered");
    std::process::exit(130);
}

#[cfg(test)]
mod tests {
    use super::claim_size;

    #[test]
    fn a_claim_takes_a_quarter_of_the_type_slots_at_most() {
        assert_eq!(claim_size(256, 256), 64, "the defaults: four claims of 64 overlap");
        assert_eq!(claim_size(256, 128), 32);
        assert_eq!(claim_size(10, 128), 10, "batch_size still caps it");
        assert_eq!(claim_size(256, 3), 1, "a tiny type still claims");
        assert_eq!(claim_size(256, 1), 1);
    }
}
