//! What the benchmark knows of each task: a tracing layer that takes the hosts' task events to the run's recorder.
//!
//! The pipeline emits one event when a task starts and one when its outcome
//! is stored, at trace level under the target `hourglass::task` (free when
//! nothing listens). The benchmark listens to those only, so it measures
//! lateness, double runs and lost tasks from what the host itself reports,
//! with no hook of its own in the host.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwapOption;
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, Layer};

/// The `hostile` scenario's type: every run blocks in a host call until its deadline.
pub(crate) const HOSTILE: &str = "hostile";
/// In-process hosts are `bench-0`, `bench-1`, ...: the recorder counts per host by it.
pub(crate) const HOST_ID: &str = "bench-";
/// The target of the pipeline's task events.
pub(crate) const TASK_EVENTS: &str = "hourglass::task";

/// The recorder of the run going on, if any.
static CURRENT: ArcSwapOption<Recorder> = ArcSwapOption::const_empty();

/// Sends the hosts' task events to `recorder` from now on.
pub(crate) fn listen(recorder: &Arc<Recorder>) {
    CURRENT.store(Some(recorder.clone()));
}

pub(crate) fn now_us() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as i64)
}

/// What the observer records of one run: per task index, starts, settles and lateness.
pub(crate) struct Recorder {
    pub(crate) n: usize,
    pub(crate) starts: Vec<AtomicU32>,
    pub(crate) acks: Vec<AtomicU32>,
    /// Start time minus due time, µs (first start only).
    pub(crate) lateness_us: Vec<AtomicI64>,
    pub(crate) acked_total: AtomicU64,
    /// Starts or settles of ids outside 0..n (far-future backlog, warm-up).
    pub(crate) strays: AtomicU64,
    pub(crate) warm_acks: AtomicU64,
    pub(crate) last_ack_us: AtomicI64,
    /// For `reload`: the hash to wait for and when a task first ran on it (µs).
    pub(crate) watch_hash: ArcSwapOption<String>,
    pub(crate) first_on_watched_us: AtomicI64,
    /// Per host: tasks of this run it acked, and warm-up tasks it ran.
    pub(crate) host_acks: Vec<AtomicU64>,
    pub(crate) host_warm: Vec<AtomicU64>,
}

impl Recorder {
    pub(crate) fn new(n: usize, hosts: usize) -> Arc<Recorder> {
        let recorder = Arc::new(Recorder {
            n,
            starts: (0..n).map(|_| AtomicU32::new(0)).collect(),
            acks: (0..n).map(|_| AtomicU32::new(0)).collect(),
            lateness_us: (0..n).map(|_| AtomicI64::new(0)).collect(),
            acked_total: AtomicU64::new(0),
            strays: AtomicU64::new(0),
            warm_acks: AtomicU64::new(0),
            last_ack_us: AtomicI64::new(0),
            watch_hash: ArcSwapOption::const_empty(),
            first_on_watched_us: AtomicI64::new(0),
            host_acks: (0..hosts).map(|_| AtomicU64::new(0)).collect(),
            host_warm: (0..hosts).map(|_| AtomicU64::new(0)).collect(),
        });
        // The arrays may come as untouched zero pages: touch them now, so the
        // RSS a run reports (`rss_growth_mib`) is the host's, not these
        // arrays filling in as tasks run.
        for i in 0..n {
            recorder.starts[i].store(0, Ordering::Relaxed);
            recorder.acks[i].store(0, Ordering::Relaxed);
            recorder.lateness_us[i].store(0, Ordering::Relaxed);
        }
        recorder
    }

    /// Task `task` (an index of this run's, else a warm-up task or a stray) started;
    /// `watched`: on the plugin version `reload` waits for.
    fn started(&self, task: Option<usize>, warm: bool, due_ms: i64, watched: bool) {
        let now = now_us();
        if watched {
            let _ = self.first_on_watched_us.compare_exchange(0, now, Ordering::Relaxed, Ordering::Relaxed);
        }
        match task {
            Some(i) => {
                if self.starts[i].fetch_add(1, Ordering::Relaxed) == 0 {
                    self.lateness_us[i].store(now - due_ms * 1000, Ordering::Relaxed);
                }
            }
            None if warm => {}
            None => {
                self.strays.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Task `task`'s success was stored by host `host` (fenced outcomes and failures are not counted).
    fn acked(&self, host: usize, task: Option<usize>, warm: bool) {
        match task {
            Some(i) => {
                self.acks[i].fetch_add(1, Ordering::Relaxed);
                self.host_acks[host].fetch_add(1, Ordering::Relaxed);
                self.acked_total.fetch_add(1, Ordering::Relaxed);
                self.last_ack_us.fetch_max(now_us(), Ordering::Relaxed);
            }
            None if warm => {
                self.warm_acks.fetch_add(1, Ordering::Relaxed);
                self.host_warm[host].fetch_add(1, Ordering::Relaxed);
            }
            None => {
                self.strays.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// The index of a benchmark id (16 hex digits), if it is one of this run's.
    fn index(&self, id: &[u8]) -> Option<usize> {
        if id.len() != 16 {
            return None;
        }
        let text = std::str::from_utf8(id).ok()?;
        let i = usize::try_from(u64::from_str_radix(text, 16).ok()?).ok()?;
        (i < self.n).then_some(i)
    }

    /// Tasks never started (lost) and tasks started more than once (doubled).
    pub(crate) fn lost_doubled(&self) -> (u64, u64) {
        let mut lost = 0;
        let mut doubled = 0;
        for (s, a) in self.starts.iter().zip(&self.acks) {
            let (s, a) = (s.load(Ordering::Relaxed), a.load(Ordering::Relaxed));
            if s == 0 || a == 0 {
                lost += 1;
            } else if s > 1 || a > 1 {
                doubled += 1;
            }
        }
        (lost, doubled + self.strays.load(Ordering::Relaxed))
    }

    /// Tasks of this run each host acked, in host order.
    pub(crate) fn per_host(&self) -> Vec<u64> {
        self.host_acks.iter().map(|a| a.load(Ordering::Relaxed)).collect()
    }
}

/// The tracing layer that feeds the current recorder.
pub(crate) struct TaskEvents;

impl<S: tracing::Subscriber> Layer<S> for TaskEvents {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        if event.metadata().target() != TASK_EVENTS {
            return;
        }
        // A guard, not a clone: a clone would count on the Arc's one shared
        // counter from every handler thread (what the host avoids, round 13).
        let current = CURRENT.load();
        let Some(recorder) = current.as_deref() else { return };
        let mut fields = Fields { recorder: Some(recorder), ..Fields::default() };
        event.record(&mut fields);
        if fields.hostile {
            return;
        }
        match (fields.kind, fields.host) {
            (Kind::Started, Some(_)) => recorder.started(fields.task, fields.warm, fields.due_ms, fields.watched),
            (Kind::Succeeded, Some(host)) if host < recorder.host_acks.len() => {
                recorder.acked(host, fields.task, fields.warm)
            }
            _ => {}
        }
    }
}

/// Which task event it is (only successes of settled tasks count).
#[derive(Default, Clone, Copy)]
enum Kind {
    #[default]
    Other,
    Started,
    Succeeded,
}

/// What one task event says, read as its fields arrive (the pipeline sends
/// them as `&str` and integers, so nothing is formatted or allocated here).
#[derive(Default)]
struct Fields<'r> {
    recorder: Option<&'r Recorder>,
    kind: Kind,
    settled: bool,
    host: Option<usize>,
    hostile: bool,
    /// This run's task index, or `None` (warm-up, backlog or another run's id).
    task: Option<usize>,
    warm: bool,
    /// Started on the plugin version `reload` waits for.
    watched: bool,
    due_ms: i64,
}

impl Visit for Fields<'_> {
    fn record_i64(&mut self, field: &Field, value: i64) {
        if field.name() == "due_ms" {
            self.due_ms = value;
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "event" if value == "started" => self.kind = Kind::Started,
            "event" => self.settled = value == "settled",
            "outcome" if self.settled && value == "succeeded" => self.kind = Kind::Succeeded,
            "host" => self.host = value.strip_prefix(HOST_ID).and_then(|k| k.parse().ok()),
            "task_type" => self.hostile = value == HOSTILE,
            "task_id" => {
                self.warm = value.starts_with("warm");
                self.task = self.recorder.and_then(|r| r.index(value.as_bytes()));
            }
            "plugin_hash" => {
                let watched = self.recorder.map(|r| r.watch_hash.load());
                self.watched = watched.is_some_and(|w| w.as_deref().is_some_and(|w| w == value));
            }
            _ => {}
        }
    }

    fn record_debug(&mut self, _: &Field, _: &dyn std::fmt::Debug) {}
}
