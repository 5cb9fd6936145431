//! Kept instances: a handler's idle instances, reset to their checkpoint or reused as they are, and a run on one.

use hourglass_task::sync::LockExt;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use wasmtime::Checkpoint;

use super::{Handler, Instances, TaskRun, wit_task};
use crate::bindings::TaskHandler;
use crate::host_state::HostState;
use crate::progress::RunHooks;
use crate::run::OUTPUT_CAP;
use crate::{one_line, pipe::CappedPipe};
use hourglass_task::task::ClaimedTask;

/// Longest each warm-up call may take (or the type's `timeout`, if shorter):
/// past it the plugin's instances are checkpointed without a warm-up.
const WARM_UP_LIMIT: std::time::Duration = std::time::Duration::from_secs(2);
/// Calls of the warm-up before the checkpoint: CPython's second call still
/// fills caches its first did not (a reset Python no-op 27.4 µs after two
/// against 31.0 after one, BENCHMARKS.md round 28); StarlingMonkey gains
/// nothing from a second (38.5 µs against 38.2) and loses from a third (43.2).
const WARM_UP_CALLS: u32 = 2;

/// The task of a warm-up call: no task's data, attempt 0 (a real task's is 1 or more).
fn warm_up_task(task: &ClaimedTask) -> crate::bindings::hourglass::plugin::types::Task {
    let mut wit = wit_task(task);
    wit.id = WARM_UP_ID.as_bytes().to_vec();
    wit.payload = Vec::new();
    wit.attempt = 0;
    wit.due_ms = 0;
    wit
}

/// The id of the warm-up call's task.
const WARM_UP_ID: &str = "hourglass:warm-up";

/// Tasks one reset instance serves before it is dropped and instantiated
/// anew, so nothing a store accumulates outside the instance grows unbounded.
const RESETS_PER_INSTANCE: u32 = 10_000;

/// The idle instances of one handler. Each holds a pooled instance slot,
/// so all handlers together keep at most `WARM_IDLE_MAX` (counted in `shared`).
pub(super) struct WarmPool {
    idle: Mutex<Vec<WarmInstance>>,
    shared: Arc<AtomicUsize>,
    /// Most idle instances it keeps, and most checkpointed ones it has.
    cap: usize,
    /// Instances of this handler with a checkpoint, idle or running. Past
    /// `cap` a new instance takes none (and is dropped after
    /// its run): it could not be kept, so recording it would be wasted.
    checkpointed: Arc<AtomicUsize>,
}

impl WarmPool {
    /// An empty pool whose idle instances count in `shared`, over all handlers.
    pub(super) fn new(shared: Arc<AtomicUsize>, cap: usize) -> WarmPool {
        WarmPool { idle: Mutex::default(), shared, cap, checkpointed: Arc::default() }
    }
}

/// Counts one checkpointed instance in its handler's pool while it lives.
struct Checkpointed(Arc<AtomicUsize>);

impl Checkpointed {
    /// A place for one more checkpointed instance, if the handler has one.
    fn claim(count: &Arc<AtomicUsize>, cap: usize) -> Option<Checkpointed> {
        count.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| (n < cap).then_some(n + 1)).ok()?;
        Some(Checkpointed(count.clone()))
    }
}

impl Drop for Checkpointed {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Drop for WarmPool {
    fn drop(&mut self) {
        let n = self.idle.get_mut().map_or(0, |idle| idle.len());
        self.shared.fetch_sub(n, Ordering::Relaxed);
    }
}

/// A live instance kept between tasks: reset to `checkpoint` after each, or
/// (a type that opted into reuse) as it is.
struct WarmInstance {
    store: wasmtime::Store<HostState>,
    instance: TaskHandler,
    stdout: CappedPipe,
    stderr: CappedPipe,
    served: u32,
    /// Its checkpoint, and its place among the handler's checkpointed instances.
    checkpoint: Option<(Arc<Checkpoint>, Checkpointed)>,
}

impl Handler {
    /// [`Handler::run`] on a kept instance: taken from the idle ones (or
    /// made), and put back after the run when it may serve another task.
    ///
    /// `reset` (the default): the instance is put back in its state just
    /// after instantiation ([`Checkpoint`]) after every run that returned,
    /// and what the host held for the run is dropped, so the next task sees
    /// what a new instance would. A run that did not return normally (a trap,
    /// the deadline, a cancel, a host budget or memory cap exceeded) drops
    /// the instance.
    ///
    /// Otherwise (`instance_reuse`) what reuse gives up: the instance's linear
    /// memory, globals and WASI state carry over from one task to the next,
    /// so a task can see data an earlier task of the same type left behind,
    /// and a handler that corrupts its own state without failing affects the
    /// tasks after it. Any failure discards it.
    pub(super) async fn run_kept(&self, task: &ClaimedTask, hooks: RunHooks, reset: bool) -> TaskRun {
        let mut idle = self.warm.idle.lock_unpoisoned().pop();
        if idle.is_some() {
            self.warm.shared.fetch_sub(1, Ordering::Relaxed);
        } else if reset && self.warm_up {
            // Before the task's deadline starts: the warm-up is not the task's time.
            idle = self.warmed_up(task).await;
        }
        let deadline = Instant::now() + self.limits.timeout;
        let parts = self.run_parts(task, deadline, hooks);
        let meta = parts.meta.clone();
        let wit = wit_task(task);
        let pre = self.component.inner.pre.clone();
        // The pipes outlive a dropped call, so output is shown even after a timeout.
        let (warm, stdout, stderr) = match idle {
            Some(mut w) => {
                if reset {
                    // A reset instance writes to this task's own pipes.
                    w.stdout = CappedPipe::new(OUTPUT_CAP);
                    w.stderr = CappedPipe::new(OUTPUT_CAP);
                    w.store.data_mut().next_fresh_task(parts, &w.stdout, &w.stderr);
                } else {
                    w.store.data_mut().next_task(parts);
                }
                w.store.set_epoch_deadline(1);
                let (stdout, stderr) = (w.stdout.clone(), w.stderr.clone());
                (Ok(w), stdout, stderr)
            }
            None => {
                let stdout = CappedPipe::new(OUTPUT_CAP);
                let stderr = CappedPipe::new(OUTPUT_CAP);
                let store = self.new_store(parts, &stdout, &stderr);
                (Err(store), stdout, stderr)
            }
        };
        let (out_pipe, err_pipe) = (stdout.clone(), stderr.clone());
        let component = self.component.clone();
        let (checkpointed, cap) = (self.warm.checkpointed.clone(), self.warm.cap);
        let call = async move {
            let mut w = match warm {
                Ok(w) => w,
                Err(mut store) => match pre.instantiate_async(&mut store).await {
                    Ok(instance) => {
                        let checkpoint = match reset.then(|| Checkpointed::claim(&checkpointed, cap)).flatten() {
                            Some(place) => component.checkpoint(&mut store).map(|c| (c, place)),
                            None => None,
                        };
                        WarmInstance { store, instance, stdout, stderr, served: 0, checkpoint }
                    }
                    Err(e) => {
                        let state = store.into_data();
                        return (
                            Err(e),
                            state.limiter.exceeded,
                            state.held.exceeded,
                            Vec::new(),
                            (Vec::new(), Vec::new()),
                            None,
                            None,
                        );
                    }
                },
            };
            let outcome = w.instance.call_handle(&mut w.store, &wit).await;
            let state = w.store.data_mut();
            let (exceeded, held) = (state.limiter.exceeded, state.held.exceeded.take());
            let followups = std::mem::take(&mut state.followups);
            let work = state.take_work();
            let progress = state.end_progress();
            (outcome, exceeded, held, followups, work, progress, Some(w))
        };
        let finished = tokio::time::timeout(self.hard_limit(), call).await;
        let (out, out_dropped) = out_pipe.take();
        let (err, err_dropped) = err_pipe.take();
        meta.emit_output("stdout", &out, out_dropped);
        meta.emit_output("stderr", &err, err_dropped);
        let Ok((outcome, memory_wanted, held, followups, work, progress, warm)) = finished else {
            return TaskRun::failed(self.deadline_failure());
        };
        // Whether the guest returned (success or a failure it reported) within
        // its caps: only then is its instance in a state that may be kept.
        let returned = outcome.is_ok() && memory_wanted.is_none() && held.is_none();
        let result = self.result_of(outcome, memory_wanted, held, &err);
        if let Some(mut w) = warm {
            if reset && returned {
                if self.reset(&mut w) {
                    self.keep_warm(w);
                }
            } else if !reset && result.is_ok() {
                w.served += 1;
                self.keep_warm(w);
            }
        }
        TaskRun::of(result, followups, work, progress)
    }

    /// A new instance that has handled the warm-up task, with its checkpoint
    /// taken after that call. `None` when the handler has no place for one
    /// more checkpointed instance, the instance cannot be made, or the
    /// plugin's warm-up cannot be used: the caller then checkpoints a new
    /// instance right after instantiation, as with `instance_warm_up = false`.
    async fn warmed_up(&self, task: &ClaimedTask) -> Option<WarmInstance> {
        if !self.component.warm_up_usable() {
            return None;
        }
        let place = Checkpointed::claim(&self.warm.checkpointed, self.warm.cap)?;
        let limit = self.limits.timeout.min(WARM_UP_LIMIT);
        let (stdout, stderr) = (CappedPipe::new(OUTPUT_CAP), CappedPipe::new(OUTPUT_CAP));
        let mut store = self.new_store(self.warm_up_parts(task, Instant::now() + limit), &stdout, &stderr);
        let pre = self.component.inner.pre.clone();
        let instance = match pre.instantiate_async(&mut store).await {
            Ok(instance) => instance,
            // Not the warm-up's doing (a full pool, say): the task's own instantiation reports it.
            Err(_) => return None,
        };
        let wit = warm_up_task(task);
        let calls = async {
            let mut last = instance.call_handle(&mut store, &wit).await;
            for _ in 1..WARM_UP_CALLS {
                if last.is_err() {
                    break;
                }
                last = instance.call_handle(&mut store, &wit).await;
            }
            last
        };
        // What the handler returns does not matter, only that it returned.
        let why = match tokio::time::timeout(limit * 2 * WARM_UP_CALLS, calls).await {
            Err(_) => format!("it did not return within {limit:?}"),
            Ok(Err(e)) => format!("it stopped abnormally: {}", one_line(&format!("{e:#}"))),
            Ok(Ok(_)) if store.data().limiter.exceeded.is_some() || store.data().held.exceeded.is_some() => {
                "it went past its memory caps".to_owned()
            }
            Ok(Ok(_)) => {
                store.data_mut().forget_task();
                match self.component.checkpoint_after_warm_up(&mut store) {
                    Ok(checkpoint) => {
                        let checkpoint = Some((checkpoint, place));
                        return Some(WarmInstance { store, instance, stdout, stderr, served: 0, checkpoint });
                    }
                    Err(e) => format!("its state after it cannot be checkpointed ({})", one_line(&format!("{e:#}"))),
                }
            }
        };
        self.component.refuse_warm_up(why);
        None
    }

    /// Puts a kept instance back in its checkpointed state (after instantiation
    /// and, unless it was refused or turned off, the warm-up call), and drops
    /// what the host held for its last task. False: it must be dropped
    /// (it has no checkpoint, served its share, or could not be reset).
    fn reset(&self, w: &mut WarmInstance) -> bool {
        let Some((checkpoint, _)) = &w.checkpoint else { return false };
        w.served += 1;
        if w.served >= RESETS_PER_INSTANCE {
            return false;
        }
        if let Err(e) = checkpoint.restore(&mut w.store) {
            tracing::warn!(plugin = %self.plugin_name, "dropped an instance that could not be reset: {}", one_line(&format!("{e:#}")));
            return false;
        }
        w.store.data_mut().forget_task();
        true
    }

    /// Keeps a warm instance for the next task unless it served its share or
    /// too many are idle (each holds a pooled instance slot).
    fn keep_warm(&self, w: WarmInstance) {
        if let Instances::Reuse(n) = self.instances
            && w.served >= n
        {
            return;
        }
        let mut idle = self.warm.idle.lock_unpoisoned();
        if idle.len() >= self.warm.cap {
            return;
        }
        if self.warm.shared.fetch_add(1, Ordering::Relaxed) >= crate::WARM_IDLE_MAX {
            self.warm.shared.fetch_sub(1, Ordering::Relaxed);
            return;
        }
        idle.push(w);
    }
}
