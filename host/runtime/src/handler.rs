//! One task type's handler: a compiled plugin bound to the type's limits, and one run of it.
//!
//! [`Handler::run`] is a future. It owns the run's `wasmtime::Store`: when the run ends
//! (returns, traps, or passes its deadline while blocked in a host call) or
//! the future is dropped (shutdown, cancel), the instance, its pooled slot
//! and everything the host held for it are freed at once.
//!
//! By default an instance that returned is not freed but reset to its
//! checkpoint (`wasmtime::Checkpoint`), taken just after it was instantiated, and kept for the
//! type's next task: that task starts from the same state a new instance
//! would, without paying for instantiation (for an interpreter such as
//! CPython, most of a run's cost). Anything abnormal (a trap, the
//! deadline, a cancel, a host budget exceeded) drops it instead.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytesize::ByteSize;
use wasmtime::{Trap, UpdateDeadline};

use super::bindings::hourglass::plugin::types as wit_types;
use super::host_state::{Grants, HostState, RunParts, cap_error};
use super::policy::SandboxPolicy;
use super::progress::{ProgressTo, RunHooks};
use super::run::{HostBudget, MAX_RESOURCES, OUTPUT_CAP, RunMeta};
use super::{Component, EPOCH_TICK, one_line, pipe::CappedPipe, wasi_http};
use hourglass_task::clean::clean_id;
use hourglass_task::task::{ClaimedTask, FollowUp, GraphWork, GroupWork, Progress};

mod kept;
use kept::WarmPool;

/// Sandbox limits of one task type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Execution deadline of one run (instantiation included).
    pub timeout: Duration,
    /// Cap on the instance's linear memory, in bytes.
    pub memory_limit: u64,
    /// Larger payloads fail permanently without running.
    pub max_payload: u64,
    /// What the host may hold for one run outside its linear memory.
    pub host_memory_limit: u64,
}

/// Why a run did not succeed; what the runner does about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// Retry after this delay.
    RetryAfter(Duration),
    /// Dead-letter now.
    Permanent(String),
    /// Retry by the backoff policy (a returned error, a trap, the deadline, ...).
    Error(String),
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::RetryAfter(d) => write!(f, "retry after {}", humantime::format_duration(*d)),
            Failure::Permanent(reason) => write!(f, "permanent failure: {reason}"),
            Failure::Error(message) => write!(f, "{message}"),
        }
    }
}

/// The outcome of one run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskRun {
    /// What the handler returned, or why it stopped.
    pub result: Result<(), Failure>,
    /// Follow-ups to commit with the ack; empty unless `result` is `Ok`.
    pub followups: Vec<FollowUp>,
    /// Workflow group work to commit with the ack; empty unless `result` is `Ok`.
    pub groups: Vec<GroupWork>,
    /// Workflow graphs to declare with the ack; empty unless `result` is `Ok`.
    pub graphs: Vec<GraphWork>,
    /// The last progress the handler reported (kept with a retry).
    pub progress: Option<Progress>,
}

impl TaskRun {
    /// A run that ended with `result` and asked for nothing else.
    pub fn returned(result: Result<(), Failure>) -> TaskRun {
        TaskRun { result, followups: Vec::new(), groups: Vec::new(), graphs: Vec::new(), progress: None }
    }

    fn failed(failure: Failure) -> TaskRun {
        TaskRun::returned(Err(failure))
    }

    /// A run's result with what it asked for: follow-ups and group work kept
    /// only when it succeeded, its last progress whatever the result.
    fn of(
        result: Result<(), Failure>,
        followups: Vec<FollowUp>,
        (groups, graphs): (Vec<GroupWork>, Vec<GraphWork>),
        progress: Option<Progress>,
    ) -> TaskRun {
        match result {
            Ok(()) => TaskRun { result, followups, groups, graphs, progress },
            Err(failure) => TaskRun { progress, ..TaskRun::failed(failure) },
        }
    }
}

/// A component bound to one task type's limits and config values; cheap to clone.
#[derive(Clone)]
pub struct Handler {
    component: Component,
    plugin_name: Arc<str>,
    limits: Limits,
    config: Arc<BTreeMap<String, String>>,
    /// The types its follow-ups may go to.
    grants: Arc<Grants>,
    http: Arc<wasi_http::HttpPolicy>,
    /// Where each run's instance comes from.
    instances: Instances,
    /// Idle instances kept for the next tasks (reset or reused).
    warm: Arc<WarmPool>,
    /// Whether a reset instance's checkpoint follows a warm-up call (`instance_warm_up`).
    warm_up: bool,
}

/// Where a handler's runs get their instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Instances {
    /// Instantiated for each run (`instance_reset = false`).
    Fresh,
    /// Kept between runs and reset to its checkpoint after each (the default).
    Reset,
    /// Kept between up to this many consecutive runs as it is (`instance_reuse`).
    Reuse(u32),
}

impl fmt::Debug for Handler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Config values may be secrets: keys only.
        f.debug_struct("Handler")
            .field("component", &self.component)
            .field("plugin_name", &self.plugin_name)
            .field("limits", &self.limits)
            .field("config_keys", &self.config.keys().collect::<Vec<_>>())
            .field("http", &self.http)
            .finish()
    }
}

impl Handler {
    /// Binds `component` to a task type's policy and `config` values.
    pub fn new(
        component: Component,
        plugin_name: impl Into<String>,
        policy: &SandboxPolicy,
        config: Arc<BTreeMap<String, String>>,
    ) -> Handler {
        Handler {
            plugin_name: Arc::from(plugin_name.into()),
            limits: Limits {
                timeout: policy.timeout,
                memory_limit: policy.memory_limit.as_u64(),
                max_payload: policy.max_payload.as_u64(),
                host_memory_limit: policy.host_memory_limit.as_u64(),
            },
            config,
            grants: Arc::new(Grants::new(policy)),
            http: Arc::new(wasi_http::HttpPolicy::new(policy)),
            instances: match policy.instance_reuse {
                n if n > 1 => Instances::Reuse(n),
                _ if policy.instance_reset => Instances::Reset,
                _ => Instances::Fresh,
            },
            warm: Arc::new(WarmPool::new(component.inner.warm_idle.clone(), component.inner.kept_per_handler)),
            warm_up: policy.instance_warm_up,
            component,
        }
    }

    /// The component it runs.
    pub fn component(&self) -> &Component {
        &self.component
    }

    /// Where its runs get their instance, in words for the dashboard.
    pub fn instances(&self) -> String {
        match self.instances {
            Instances::Reset if self.component.resettable() && self.warm_up && self.component.warm_up_usable() => {
                "a kept instance reset after each task to its state after a warm-up call".to_owned()
            }
            Instances::Reset if self.component.resettable() => "a kept instance reset after each task".to_owned(),
            Instances::Reset => "a new instance per task (its instances cannot be reset)".to_owned(),
            Instances::Fresh => "a new instance per task (instance_reset = false)".to_owned(),
            Instances::Reuse(n) => format!("one instance kept as it is for up to {n} tasks (instance_reuse)"),
        }
    }

    /// Its sandbox limits.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    fn budget(&self) -> HostBudget {
        HostBudget::new(self.limits.host_memory_limit)
    }

    fn memory_limit(&self) -> u64 {
        self.limits.memory_limit.min(self.component.inner.max_memory)
    }

    /// Runs one task, in a fresh instance (or, when the type opted into
    /// `instance_reuse`, a warm one), until it returns, traps or passes its
    /// deadline, inside the run's span (`trace`, when tracing is on: the
    /// plugin's outbound requests become its child spans). The deadline ends
    /// the run wherever it is: in guest code (the epoch callback traps it) or
    /// blocked in a host call (the future is dropped, which cancels the call
    /// and frees the instance).
    pub async fn run(&self, task: &ClaimedTask, hooks: RunHooks) -> TaskRun {
        if let Some(refused) = self.refuse_oversize(task) {
            return refused;
        }
        let started = Instant::now();
        let run = self.run_in_instance(task, hooks).await;
        self.component.record_run(started.elapsed());
        run
    }

    /// [`Handler::run`] once the payload is accepted.
    async fn run_in_instance(&self, task: &ClaimedTask, hooks: RunHooks) -> TaskRun {
        match self.instances {
            Instances::Reset if self.component.resettable() => return self.run_kept(task, hooks, true).await,
            Instances::Reuse(_) => return self.run_kept(task, hooks, false).await,
            Instances::Fresh | Instances::Reset => {}
        }
        let deadline = Instant::now() + self.limits.timeout;
        let parts = self.run_parts(task, deadline, hooks);
        let meta = parts.meta.clone();
        let stdout = CappedPipe::new(OUTPUT_CAP);
        let stderr = CappedPipe::new(OUTPUT_CAP);
        let mut store = self.new_store(parts, &stdout, &stderr);
        // Borrowed, not cloned: a clone counts on the component's shared Arc from every thread.
        let pre = &self.component.inner.pre;
        let wit = wit_task(task);
        let call = async move {
            let outcome = match pre.instantiate_async(&mut store).await {
                Ok(instance) => instance.call_handle(&mut store, &wit).await,
                Err(e) => Err(e),
            };
            (outcome, store.into_data())
        };
        let finished = tokio::time::timeout(self.hard_limit(), call).await;
        let (out, out_dropped) = stdout.take();
        let (err, err_dropped) = stderr.take();
        meta.emit_output("stdout", &out, out_dropped);
        meta.emit_output("stderr", &err, err_dropped);
        let Ok((outcome, mut state)) = finished else {
            return TaskRun::failed(self.deadline_failure());
        };
        let work = state.take_work();
        let result = self.result_of(outcome, state.limiter.exceeded, state.held.exceeded, &err);
        TaskRun::of(result, state.followups, work, state.last_progress)
    }

    /// How long the future may take in all: the deadline plus two epoch ticks,
    /// so guest code is trapped by the epoch callback (with its stderr and a
    /// clear reason) and only a run blocked in a host call is cut by the timeout.
    fn hard_limit(&self) -> Duration {
        self.limits.timeout + EPOCH_TICK * 2
    }

    fn deadline_failure(&self) -> Failure {
        Failure::Error(format!("deadline of {} exceeded", humantime::format_duration(self.limits.timeout)))
    }

    /// A fresh `wasmtime::Store` with the run's memory cap, budget and deadline; guest
    /// code yields to the executor every epoch tick and traps past the deadline.
    fn new_store(&self, parts: RunParts, stdout: &CappedPipe, stderr: &CappedPipe) -> wasmtime::Store<HostState> {
        let state = HostState::new(
            parts,
            self.memory_limit(),
            self.budget(),
            self.config.clone(),
            self.grants.clone(),
            stdout,
            stderr,
        );
        let mut store = wasmtime::Store::new(self.component.inner.pre.engine(), state);
        store.limiter(|s| &mut s.limiter);
        store.epoch_deadline_callback(|ctx| {
            if Instant::now() >= ctx.data().deadline {
                return Ok(UpdateDeadline::Interrupt);
            }
            // Yield through tokio, so a guest spinning in a loop shares its
            // executor thread with other runs every tick.
            Ok(UpdateDeadline::YieldCustom(1, Box::pin(tokio::task::yield_now())))
        });
        store.set_epoch_deadline(1);
        store
    }

    /// A payload over `max_payload` fails permanently without running.
    fn refuse_oversize(&self, task: &ClaimedTask) -> Option<TaskRun> {
        if task.payload.len() as u64 > self.limits.max_payload {
            return Some(TaskRun::failed(Failure::Permanent(format!(
                "payload of {} bytes exceeds max_payload of {}",
                task.payload.len(),
                ByteSize::b(self.limits.max_payload)
            ))));
        }
        None
    }

    /// The parts of the state that belong to one task: who logs, the outbound HTTP hooks, the deadline.
    fn run_parts(&self, task: &ClaimedTask, deadline: Instant, hooks: RunHooks) -> RunParts {
        self.parts(task, deadline, hooks, false)
    }

    /// [`Handler::run_parts`] of a warm-up call (of `task`'s type): it logs
    /// nothing and its outbound requests are refused.
    fn warm_up_parts(&self, task: &ClaimedTask, deadline: Instant) -> RunParts {
        self.parts(task, deadline, RunHooks::default(), true)
    }

    fn parts(&self, task: &ClaimedTask, deadline: Instant, hooks: RunHooks, warm_up: bool) -> RunParts {
        let meta = Arc::new(RunMeta {
            plugin: self.plugin_name.clone(),
            plugin_hash: self.component.hash().to_owned(),
            // A shard's tasks are its type's: grants and logs name the type.
            task_type: task.task_type.base(),
            task_id: clean_id(&task.id),
            attempt: if warm_up { 0 } else { task.attempt },
            warm_up,
        });
        let http_hooks = wasi_http::OutboundHooks::new(
            self.http.clone(),
            deadline,
            self.budget(),
            wasi_http::Caller { plugin: self.plugin_name.clone(), meta: meta.clone(), trace: hooks.trace },
        );
        // The warm-up's reports are nobody's: checked, then dropped.
        let progress =
            hooks.progress.filter(|_| !warm_up).map(|sink| ProgressTo::new(sink, task.lease(), task.attempt));
        RunParts { meta, http_hooks, deadline, progress }
    }

    /// What a call's outcome means for the task. A run that filled its host
    /// budget fails whatever the guest returned (it may have ignored the error).
    fn result_of(
        &self,
        outcome: wasmtime::Result<Result<(), wit_types::Failure>>,
        memory_wanted: Option<usize>,
        budget_exceeded: Option<String>,
        stderr: &str,
    ) -> Result<(), Failure> {
        if let Some(why) = budget_exceeded {
            return Err(Failure::Error(why));
        }
        match outcome {
            Ok(Ok(())) => Ok(()),
            Ok(Err(wit_types::Failure::RetryAfter(ms))) => Err(Failure::RetryAfter(Duration::from_millis(ms))),
            Ok(Err(wit_types::Failure::Permanent(reason))) => Err(Failure::Permanent(cap_error(reason))),
            Ok(Err(wit_types::Failure::Error(message))) => Err(Failure::Error(cap_error(message))),
            Err(e) => Err(Failure::Error(cap_error(self.describe_crash(&e, memory_wanted, stderr)))),
        }
    }

    /// One line saying why the guest stopped abnormally.
    fn describe_crash(&self, e: &wasmtime::Error, memory_wanted: Option<usize>, stderr: &str) -> String {
        if let Some(wanted) = memory_wanted {
            return format!(
                "memory limit of {} exceeded (the guest asked for {}): {}",
                ByteSize::b(self.memory_limit()),
                ByteSize::b(wanted as u64),
                crash_reason(e)
            );
        }
        let chain = format!("{e:#}");
        let budget = self.budget();
        if chain.contains("total size of fields exceeds limit") {
            return format!(
                "host memory budget exceeded: a header fields resource over {} (its share of host_memory_limit = {})",
                ByteSize::b(budget.field_limit() as u64),
                ByteSize::b(budget.limit())
            );
        }
        if chain.contains("resource table has no free keys") {
            return format!(
                "host memory budget exceeded: more than {MAX_RESOURCES} live resources (streams, HTTP requests, header fields ...)"
            );
        }
        match e.downcast_ref::<Trap>() {
            Some(Trap::Interrupt) => self.deadline_failure().to_string(),
            Some(Trap::StackOverflow) => "stack overflow (wasm trap: call stack exhausted)".to_owned(),
            Some(Trap::UnreachableCodeReached) => match panic_message(stderr) {
                Some(message) => format!("guest panicked: {message}"),
                None => "guest aborted (wasm trap: unreachable instruction executed)".to_owned(),
            },
            _ => crash_reason(e),
        }
    }
}

/// The trap's own description, or the error chain on one line.
fn crash_reason(e: &wasmtime::Error) -> String {
    if let Some(trap) = e.downcast_ref::<Trap>() {
        return trap.to_string();
    }
    if let Some(exit) = e.downcast_ref::<wasmtime_wasi::I32Exit>() {
        return format!("guest exited with status {}", exit.0);
    }
    one_line(&format!("{e:#}"))
}

/// The message of a Rust panic as printed to stderr by the guest's panic hook.
fn panic_message(stderr: &str) -> Option<String> {
    let mut lines = stderr.lines();
    let at = lines.position(|l| l.contains("panicked at"))?;
    let header = stderr.lines().nth(at)?;
    let message = lines.next().filter(|l| !l.starts_with("note:")).unwrap_or_default();
    let place = header.split_once("panicked at ").map(|(_, p)| p.trim_end_matches(':')).unwrap_or_default();
    Some(if message.is_empty() { header.to_owned() } else { format!("{message} (at {place})") })
}

fn wit_task(task: &ClaimedTask) -> wit_types::Task {
    wit_types::Task {
        id: task.id.clone(),
        task_type: task.task_type.base().to_string(),
        payload: task.payload.clone(),
        attempt: task.attempt,
        due_ms: u64::try_from(task.due_ms).unwrap_or(0),
    }
}
