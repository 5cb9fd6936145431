//! Prometheus metrics and the recent outcomes this host settled.
//!
//! The runner and the registry call the small functions here at the points
//! where something happens; the admin server renders the result
//! (`/metrics` through [`handle`], the dashboard through [`recent`]).
//!
//! Metric names (label `type` is the task type, `plugin` the plugin file's stem):
//!
//! | name | kind | labels |
//! |---|---|---|
//! | `hourglass_tasks_claimed_total` | counter | type |
//! | `hourglass_tasks_succeeded_total` | counter | type |
//! | `hourglass_tasks_failed_total` | counter (failed attempts) | type |
//! | `hourglass_tasks_retried_total` | counter | type |
//! | `hourglass_tasks_dead_total` | counter (dead-lettered) | type |
//! | `hourglass_tasks_fenced_total` | counter (outcomes ignored: lease lost) | type |
//! | `hourglass_tasks_cancelled_total` | counter (running tasks stopped by `hourglass cancel`) | type |
//! | `hourglass_tasks_in_flight` | gauge (claimed here, not yet settled) | type |
//! | `hourglass_task_lateness_seconds` | histogram (start - due) | type |
//! | `hourglass_task_duration_seconds` | histogram (handler run) | type |
//! | `hourglass_redis_errors_total` | counter | |
//! | `hourglass_redis_master_changes_total` | counter | |
//! | `hourglass_type_faulted` | gauge: 1 while the type's keys hold bad data | type |
//! | `hourglass_type_paused` | gauge: 1 while the type is paused | type |
//! | `hourglass_tasks_due` | gauge: due now, not yet claimed (sampled from Redis) | type |
//! | `hourglass_tasks_scheduled` | gauge: due later (sampled from Redis) | type |
//! | `hourglass_oldest_due_age_seconds` | gauge: how long the oldest due task has waited (sampled) | type |
//! | `hourglass_groups_open` | gauge: workflow groups with callbacks of the type not done yet (sampled) | type |
//! | `hourglass_graphs_refused_total` | counter: graphs handlers declared, refused when delivered (id or a task in use) | type |
//! | `hourglass_graphs_running` | gauge: workflow graphs of the home type not done yet (sampled) | type |
//! | `hourglass_graphs_opened_total`, `_completed_total`, `_failed_total` | counters: graphs declared, done, done with a node that did not succeed, Redis-wide (sampled) | type |
//! | `hourglass_plugin_loads_total` | counter | plugin |
//! | `hourglass_plugin_reload_failures_total` | counter | plugin |
//! | `hourglass_plugin_info` | gauge: 1 for the loaded version, 0 for replaced ones | plugin, hash |

use hourglass_task::sync::LockExt;
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use metrics::{Counter, Gauge, Histogram, counter, gauge, histogram};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

use crate::task::{Claim, Ended, RunInfo, Settlement};
use crate::task_type::TaskType;

/// How many settled outcomes [`recent`] remembers.
const RECENT: usize = 50;

/// Histogram buckets in seconds: from 1 ms to 5 minutes.
const BUCKETS: &[f64] = &[0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0];

/// The process-wide Prometheus recorder, installed on first use (the plugin
/// registry and the admin server call it early, before anything is counted).
pub fn handle() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let recorder =
            PrometheusBuilder::new().set_buckets(BUCKETS).expect("the bucket list is not empty").build_recorder();
        let handle = recorder.handle();
        // Fails only when another recorder is installed (an embedding program's): then ours stays empty.
        if metrics::set_global_recorder(recorder).is_err() {
            tracing::warn!("a metrics recorder was already installed; /metrics shows only what it gets");
        }
        describe();
        handle
    })
}

fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!("hourglass_tasks_claimed_total", "Tasks claimed by this host.");
    describe_counter!("hourglass_tasks_succeeded_total", "Tasks that succeeded (committed acks).");
    describe_counter!("hourglass_tasks_failed_total", "Attempts that failed (retried or dead-lettered).");
    describe_counter!("hourglass_tasks_retried_total", "Failed attempts scheduled for a retry.");
    describe_counter!("hourglass_tasks_dead_total", "Tasks dead-lettered.");
    describe_counter!("hourglass_tasks_fenced_total", "Outcomes ignored because the lease had been lost.");
    describe_counter!("hourglass_tasks_cancelled_total", "Running tasks stopped by hourglass cancel.");
    describe_counter!(
        "hourglass_runs_abandoned_total",
        "Runs stopped because this host lost their lease (reaped, or not renewed in time); nothing was settled."
    );
    describe_counter!(
        crate::runtime::FOLLOWUPS_REFUSED_TOTAL,
        "Follow-ups a handler asked for into a type runner.toml does not grant it (may_schedule)."
    );
    describe_counter!(
        "hourglass_followups_kept_existing_total",
        "Create-only follow-ups not delivered because their id was waiting or dead in the target type."
    );
    describe_gauge!(
        "hourglass_tasks_in_flight",
        "Tasks this host claimed and has not settled yet: handlers running, and outcomes being written."
    );
    describe_histogram!("hourglass_task_lateness_seconds", Unit::Seconds, "Start time minus due time.");
    describe_histogram!("hourglass_task_duration_seconds", Unit::Seconds, "Handler run time.");
    describe_counter!("hourglass_redis_errors_total", "Redis calls that failed.");
    describe_counter!(
        "hourglass_redis_master_changes_total",
        "Times this host moved to another Redis master (a failover followed through Sentinel, or a node that answered READONLY)."
    );
    describe_gauge!("hourglass_type_paused", "1 while the type is paused (hourglass pause): nothing of it is claimed.");
    describe_gauge!(
        "hourglass_type_faulted",
        "1 while a type's keys hold bad data and its tasks wait (see the log for the key and the fix)."
    );
    describe_gauge!(
        "hourglass_tasks_due",
        "Tasks due now and not yet claimed, Redis-wide (sampled every few seconds; every host reports the same value)."
    );
    describe_gauge!("hourglass_tasks_scheduled", "Tasks due later, Redis-wide (sampled every few seconds).");
    describe_gauge!(
        "hourglass_groups_open",
        "Workflow groups whose callback is of this type and that are not done yet, Redis-wide (sampled)."
    );
    describe_gauge!(
        "hourglass_graphs_running",
        "Workflow graphs of this home type that are not done yet, Redis-wide (sampled)."
    );
    describe_counter!(
        "hourglass_graphs_opened_total",
        "Workflow graphs declared with this home type, by any client, Redis-wide (sampled from Redis's \
         counter: every host reports the same value)."
    );
    describe_counter!(
        "hourglass_graphs_completed_total",
        "Workflow graphs of this home type done (every node ended or skipped), Redis-wide (sampled)."
    );
    describe_counter!(
        "hourglass_graphs_failed_total",
        "Workflow graphs of this home type done with a node dead, cancelled or skipped, Redis-wide (sampled)."
    );
    describe_gauge!(
        "hourglass_oldest_due_age_seconds",
        Unit::Seconds,
        "Now minus the due time of the oldest task due and not yet claimed; 0 when none (sampled)."
    );
    describe_counter!("hourglass_plugin_loads_total", "Plugin versions compiled and loaded.");
    describe_counter!("hourglass_groups_opened_total", "Workflow groups opened by handlers, by callback type.");
    describe_counter!(
        "hourglass_groups_completed_total",
        "Workflow groups completed on this host, by callback type and what became of the callback \
         (callback, skipped, kept)."
    );
    describe_counter!(
        "hourglass_graphs_refused_total",
        "Workflow graphs handlers declared that were refused when delivered (the graph id or a node's task in use), by home type."
    );
    describe_counter!(
        "hourglass_graphs_done_total",
        "Workflow graphs whose last node ended on this host (its end delivered here), by home type."
    );
    describe_counter!(
        "hourglass_group_work_refused_total",
        "Handler work on a group the group refused (sealed, done, or opened with another callback)."
    );
    describe_counter!("hourglass_plugin_reload_failures_total", "Plugin files that could not be loaded.");
    describe_counter!("hourglass_progress_reports_total", "Progress reports handlers made (the progress import).");
    describe_counter!(
        "hourglass_progress_writes_total",
        "Progress reports written to Redis: the latest of each run, at most every 250 ms."
    );
    describe_gauge!("hourglass_plugin_info", "1 for the plugin version (hash) serving now, 0 for replaced ones.");
}

/// The metric handles of one task type, looked up once so the hot path
/// neither allocates label strings nor searches the registry per task.
#[derive(Clone)]
pub struct TypeMetrics {
    task_type: String,
    claimed: Counter,
    succeeded: Counter,
    failed: Counter,
    retried: Counter,
    dead: Counter,
    fenced: Counter,
    cancelled: Counter,
    abandoned: Counter,
    in_flight: Gauge,
    lateness: Histogram,
    duration: Histogram,
}

impl TypeMetrics {
    /// Registers (or finds) the metrics of `task_type`.
    pub fn new(task_type: &TaskType) -> TypeMetrics {
        handle();
        let t = task_type.to_string();
        TypeMetrics {
            claimed: counter!("hourglass_tasks_claimed_total", "type" => t.clone()),
            succeeded: counter!("hourglass_tasks_succeeded_total", "type" => t.clone()),
            failed: counter!("hourglass_tasks_failed_total", "type" => t.clone()),
            retried: counter!("hourglass_tasks_retried_total", "type" => t.clone()),
            dead: counter!("hourglass_tasks_dead_total", "type" => t.clone()),
            fenced: counter!("hourglass_tasks_fenced_total", "type" => t.clone()),
            cancelled: counter!("hourglass_tasks_cancelled_total", "type" => t.clone()),
            abandoned: counter!("hourglass_runs_abandoned_total", "type" => t.clone()),
            in_flight: gauge!("hourglass_tasks_in_flight", "type" => t.clone()),
            lateness: histogram!("hourglass_task_lateness_seconds", "type" => t.clone()),
            duration: histogram!("hourglass_task_duration_seconds", "type" => t.clone()),
            task_type: t,
        }
    }

    /// After a claim: the tasks taken, and those dead-lettered without running.
    pub fn claimed(&self, claim: &Claim) {
        if !claim.tasks.is_empty() {
            self.claimed.increment(claim.tasks.len() as u64);
        }
        if !claim.dead_lettered.is_empty() {
            self.dead.increment(claim.dead_lettered.len() as u64);
            let now = crate::clock::now_ms();
            let mut recent = RECENT_OUTCOMES.lock_unpoisoned();
            for (id, reason) in last(&claim.dead_lettered) {
                push(
                    &mut recent,
                    Completed {
                        task_type: self.task_type.clone(),
                        id: String::from_utf8_lossy(id).into_owned(),
                        outcome: Ended::Dead.as_str(),
                        attempt: 0,
                        finished_ms: now,
                        error: reason.clone(),
                    },
                );
            }
        }
    }

    /// A run stopped because its lease was lost.
    pub fn abandoned(&self) {
        self.abandoned.increment(1);
    }

    /// Whether the type is paused, as the last claim found it.
    pub fn paused(&self, paused: bool) {
        gauge!("hourglass_type_paused", "type" => self.task_type.clone()).set(if paused { 1.0 } else { 0.0 });
    }

    /// A claim's `n` tasks go to their handlers: in flight until settled
    /// ([`TypeMetrics::settled`]) or ended unsettled ([`TypeMetrics::unsettled`]).
    /// Counted here and there, once per claim and per settle, rather than by
    /// each run: every count is an atomic all handler threads would share.
    pub fn dispatched(&self, n: usize) {
        self.in_flight.increment(n as f64);
    }

    /// A run that ended with nothing to settle (its lease lost, or shutdown ended it).
    pub fn unsettled(&self, run: &RunInfo) {
        self.ran(run);
        self.in_flight.decrement(1.0);
    }

    fn ran(&self, run: &RunInfo) {
        self.lateness.record((run.started_ms - run.due_ms).max(0) as f64 / 1000.0);
        self.duration.record(run.ran_for.as_secs_f64());
    }

    /// After a settle: counts the committed outcomes and remembers the latest for the dashboard.
    pub fn settled(&self, batch: &[Settlement], results: &[Ended]) {
        let (mut ok, mut failed, mut retried, mut dead, mut fenced) = (0u64, 0u64, 0u64, 0u64, 0u64);
        let mut cancelled = 0u64;
        for (s, r) in batch.iter().zip(results) {
            self.ran(&s.run);
            match r {
                Ended::Fenced => fenced += 1,
                Ended::Succeeded => ok += 1,
                Ended::Cancelled => cancelled += 1,
                Ended::Retried => {
                    failed += 1;
                    retried += 1;
                }
                Ended::Dead => {
                    failed += 1;
                    dead += 1;
                }
                // As Redis counts it: a failed attempt, no death.
                Ended::Rescheduled => failed += 1,
            }
        }
        self.in_flight.decrement(batch.len() as f64);
        for (c, n) in [
            (&self.succeeded, ok),
            (&self.failed, failed),
            (&self.retried, retried),
            (&self.dead, dead),
            (&self.fenced, fenced),
            (&self.cancelled, cancelled),
        ] {
            if n > 0 {
                c.increment(n);
            }
        }
        // Only the newest RECENT can be shown, so only those are copied.
        let skip = batch.len().saturating_sub(RECENT);
        let mut recent = RECENT_OUTCOMES.lock_unpoisoned();
        for (s, r) in batch.iter().zip(results).skip(skip) {
            let ended = *r;
            let error = match ended {
                Ended::Retried | Ended::Dead => s.outcome.error().unwrap_or_default(),
                _ => "",
            };
            push(
                &mut recent,
                Completed {
                    task_type: self.task_type.clone(),
                    id: String::from_utf8_lossy(&s.lease.id).into_owned(),
                    outcome: ended.as_str(),
                    attempt: s.run.attempt,
                    finished_ms: s.run.finished_ms,
                    error: error.to_owned(),
                },
            );
        }
    }
}

/// The newest [`RECENT`] items of a list.
fn last<T>(items: &[T]) -> &[T] {
    &items[items.len().saturating_sub(RECENT)..]
}

/// Whether a type is faulted now (bad data in its keys; see [`crate::observe::health`]).
pub fn type_faulted(task_type: &TaskType, faulted: bool) {
    handle();
    gauge!("hourglass_type_faulted", "type" => task_type.to_string()).set(if faulted { 1.0 } else { 0.0 });
}

/// The backlog of a type as last sampled from Redis (the autoscaling signal):
/// due and waiting, due later, and the age of the oldest due task.
pub fn backlog(task_type: &TaskType, due_now: u64, scheduled_later: u64, oldest_due_age_ms: u64) {
    handle();
    let t = task_type.to_string();
    gauge!("hourglass_tasks_due", "type" => t.clone()).set(due_now as f64);
    gauge!("hourglass_tasks_scheduled", "type" => t.clone()).set(scheduled_later as f64);
    gauge!("hourglass_oldest_due_age_seconds", "type" => t).set(oldest_due_age_ms as f64 / 1000.0);
}

/// The workflow groups with callbacks of a type that are not done, as last sampled from Redis.
pub fn groups_open(task_type: &TaskType, open: u64) {
    handle();
    gauge!("hourglass_groups_open", "type" => task_type.to_string()).set(open as f64);
}

/// A Redis call failed.
pub fn redis_error() {
    handle();
    counter!("hourglass_redis_errors_total").increment(1);
}

/// This host moved to another Redis master.
pub fn redis_master_changed() {
    handle();
    counter!("hourglass_redis_master_changes_total").increment(1);
}

/// A plugin file was compiled and loaded.
pub fn plugin_loaded(plugin: &str) {
    handle();
    counter!("hourglass_plugin_loads_total", "plugin" => plugin.to_owned()).increment(1);
}

/// A create-only follow-up of `from` found its id taken in `to` and left that task as it was.
pub fn followup_kept_existing(from: &TaskType, to: &TaskType) {
    handle();
    counter!("hourglass_followups_kept_existing_total", "type" => from.to_string(), "target" => to.to_string())
        .increment(1);
}

/// A workflow group with callbacks of `callback_type` was opened by a run's work.
pub fn group_opened(callback_type: &TaskType) {
    handle();
    counter!("hourglass_groups_opened_total", "type" => callback_type.to_string()).increment(1);
}

/// A workflow group completed; `fired` says what it did with its callback.
pub fn group_completed(callback_type: &TaskType, fired: &'static str) {
    handle();
    counter!("hourglass_groups_completed_total", "type" => callback_type.to_string(), "callback" => fired).increment(1);
}

/// The workflow graphs of home type `t`, Redis-wide, as sampled from its stats.
pub fn graphs(t: &TaskType, running: u64, opened: u64, completed: u64, failed: u64) {
    handle();
    let ty = t.to_string();
    gauge!("hourglass_graphs_running", "type" => ty.clone()).set(running as f64);
    // Redis keeps these counters; each sample mirrors them (absolute), as every host does.
    counter!("hourglass_graphs_opened_total", "type" => ty.clone()).absolute(opened);
    counter!("hourglass_graphs_completed_total", "type" => ty.clone()).absolute(completed);
    counter!("hourglass_graphs_failed_total", "type" => ty).absolute(failed);
}

/// A workflow graph a run declared, of home type `home`, was refused when delivered (its id or a node's task in use).
pub fn graph_refused(home: &TaskType) {
    handle();
    counter!("hourglass_graphs_refused_total", "type" => home.to_string()).increment(1);
}

/// A workflow graph of home type `home` finished: its last node ended.
pub fn graph_done(home: &TaskType) {
    handle();
    counter!("hourglass_graphs_done_total", "type" => home.to_string()).increment(1);
}

/// A run of `from` worked on a group that refused it (sealed, done, another callback).
pub fn group_refused(from: &TaskType) {
    handle();
    counter!("hourglass_group_work_refused_total", "type" => from.to_string()).increment(1);
}

/// A plugin file could not be loaded (unreadable or rejected).
pub fn plugin_load_failed(plugin: &str) {
    handle();
    counter!("hourglass_plugin_reload_failures_total", "plugin" => plugin.to_owned()).increment(1);
}

/// The plugin versions serving now (plugin name → hash), after every reload.
pub fn plugins_serving(now: BTreeMap<String, String>) {
    handle();
    static SERVING: Mutex<BTreeMap<String, String>> = Mutex::new(BTreeMap::new());
    let mut before = SERVING.lock_unpoisoned();
    for (plugin, hash) in before.iter() {
        if now.get(plugin) != Some(hash) {
            gauge!("hourglass_plugin_info", "plugin" => plugin.clone(), "hash" => hash.clone()).set(0.0);
        }
    }
    for (plugin, hash) in &now {
        gauge!("hourglass_plugin_info", "plugin" => plugin.clone(), "hash" => hash.clone()).set(1.0);
    }
    *before = now;
}

/// One outcome settled by this host (or dead-lettered at claim).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Completed {
    /// Task type.
    pub task_type: String,
    /// Task id (lossy UTF-8).
    pub id: String,
    /// What [`Ended::as_str`] calls it: `succeeded`, `retried`, `dead`, `cancelled`, `rescheduled` or `fenced`.
    pub outcome: &'static str,
    /// The attempt that ended (0 when it never ran).
    pub attempt: u32,
    /// When the handler finished, ms since the epoch.
    pub finished_ms: i64,
    /// The error, if it failed.
    pub error: String,
}

static RECENT_OUTCOMES: Mutex<VecDeque<Completed>> = Mutex::new(VecDeque::new());

fn push(recent: &mut VecDeque<Completed>, c: Completed) {
    if recent.len() == RECENT {
        recent.pop_front();
    }
    recent.push_back(c);
}

/// The latest outcomes settled by this host, newest first.
pub fn recent() -> Vec<Completed> {
    RECENT_OUTCOMES.lock_unpoisoned().iter().rev().cloned().collect()
}

/// Runs the recorder's upkeep every second until `stop`: a histogram keeps
/// each sample (about 24 bytes) until upkeep folds it into its buckets, so
/// this bounds what they hold to a second of tasks.
pub async fn upkeep(stop: tokio_util::sync::CancellationToken) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(1)) => handle().run_upkeep(),
        }
    }
}
