//! What the host keeps for one run: its WASI context, limits, budget, and the `hourglass:plugin` imports.
//!
//! Everything the host holds on a guest's behalf lives here and is bounded:
//! linear memory by [`MemoryCap`], the bytes the imports buffer by [`Held`]
//! (part of the type's `host_memory_limit`), log text by [`LOG_CAP`], and
//! wasi:http's own state by the resource-table and field-size caps that
//! [`HostState::new`] derives from the same limit.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;

use bytesize::ByteSize;
use wasmtime::ResourceLimiter;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

use super::bindings::hourglass::plugin::{
    config as wit_config, log as wit_log, progress as wit_progress, schedule as wit_schedule, types as wit_types,
    workflow as wit_workflow,
};
use super::pipe::CappedPipe;
use super::progress::ProgressTo;
use super::run::{HostBudget, MAX_ERROR_TEXT, MAX_RESOURCES, RunMeta};
use super::wasi_http::OutboundHooks;
use hourglass_task::task::{FollowUp, GraphWork, GroupWork, Progress};
use hourglass_task::task_type::TaskType;

mod workflow;

/// Bytes of `log` text one run may emit; later lines are dropped (one warning says so).
pub const LOG_CAP: usize = 64 * 1024;
/// Limits on follow-ups of one run (mirrored in the WIT docs).
pub(crate) const MAX_FOLLOWUPS: usize = 1000;

/// The counter of follow-ups a run asked for into a type its policy does not
/// grant (`type`, `target`), emitted through the `metrics` facade: the host's
/// recorder exports it with its description.
pub const FOLLOWUPS_REFUSED_TOTAL: &str = "hourglass_followups_refused_total";
const MAX_FOLLOWUP_ID: usize = 1024;
const MAX_FOLLOWUP_PAYLOAD: usize = 1024 * 1024;
/// What a buffered follow-up costs beyond its bytes (type name, vector headers).
const FOLLOWUP_OVERHEAD: usize = 128;
/// Bytes the imports hold for a run, charged as they come; past the limit the
/// run fails, naming what filled it.
#[derive(Debug)]
pub(crate) struct Held {
    limit: u64,
    used: u64,
    /// Why the budget ran out, once it did: the run fails with this.
    pub(crate) exceeded: Option<String>,
}

impl Held {
    fn new(limit: u64) -> Held {
        Held { limit, used: 0, exceeded: None }
    }

    /// Charges `bytes` for `what`; an error (the same text the run fails with) once over the limit.
    fn charge(&mut self, bytes: usize, what: &str, budget: HostBudget) -> Result<(), String> {
        self.fits(bytes, what, budget)?;
        self.used = self.used.saturating_add(bytes as u64);
        Ok(())
    }

    /// Whether `bytes` more may be held for a moment (they are not charged):
    /// past the limit, the same error as [`Held::charge`].
    fn fits(&mut self, bytes: usize, what: &str, budget: HostBudget) -> Result<(), String> {
        if self.used.saturating_add(bytes as u64) > self.limit {
            return Err(self.refuse(bytes, what, budget));
        }
        Ok(())
    }

    /// Bytes that may still be held.
    fn left(&self) -> usize {
        usize::try_from(self.limit.saturating_sub(self.used)).unwrap_or(usize::MAX)
    }

    /// The error for `what` wanting `bytes` more than fit; the run fails with it.
    fn refuse(&mut self, bytes: usize, what: &str, budget: HostBudget) -> String {
        let why = format!(
            "host memory budget exceeded: {what} would hold {} of the {} that host_memory_limit = {} leaves them",
            ByteSize::b(self.used.saturating_add(bytes as u64)),
            ByteSize::b(self.limit),
            ByteSize::b(budget.limit())
        );
        self.exceeded.get_or_insert_with(|| why.clone());
        why
    }
}

/// The types a handler's follow-ups may go to (`may_schedule`, `may_replace`
/// in runner.toml): a type reaches another type's tasks only where the
/// operator said so.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Grants {
    /// Types it may create tasks in (ids not waiting or dead there).
    schedule: BTreeSet<TaskType>,
    /// Types whose existing tasks it may also replace.
    replace: BTreeSet<TaskType>,
}

impl Grants {
    pub(crate) fn new(policy: &crate::policy::SandboxPolicy) -> Grants {
        let replace: BTreeSet<TaskType> = policy.may_replace.iter().cloned().collect();
        let schedule = policy.may_schedule.iter().cloned().chain(replace.iter().cloned()).collect();
        Grants { schedule, replace }
    }

    /// Whether a follow-up of `from` into `to` may replace an existing task
    /// (`Ok(true)`), may only create one (`Ok(false)`), or is refused.
    fn check(&self, from: &TaskType, to: &TaskType) -> Result<bool, String> {
        if !self.schedule.contains(to) {
            return Err(format!(
                "type \"{from}\" may not schedule \"{to}\" tasks: add \"{to}\" to may_schedule in [types.\"{from}\"] of runner.toml"
            ));
        }
        Ok(self.replace.contains(to))
    }
}

/// Per-run state of a `wasmtime::Store`.
pub(crate) struct HostState {
    /// Built on the run's first WASI call: many handlers make none, and
    /// building it (its random generators seeded) is a measurable part of a
    /// fresh instance's cost.
    wasi: Option<WasiCtx>,
    /// What the WASI context captures the guest's output into.
    output: (CappedPipe, CappedPipe),
    table: ResourceTable,
    pub(crate) limiter: MemoryCap,
    pub(crate) meta: Arc<RunMeta>,
    config: Arc<BTreeMap<String, String>>,
    grants: Arc<Grants>,
    /// Whether this run had a follow-up refused (logged once per run).
    refused_followup: bool,
    pub(crate) followups: Vec<FollowUp>,
    /// Work on workflow groups, one entry per group, in the order first touched.
    groups: Vec<GroupWork>,
    /// Workflow graphs declared, in order.
    graphs: Vec<GraphWork>,
    pub(crate) held: Held,
    budget: HostBudget,
    /// Bytes of `log` text emitted this run, against [`LOG_CAP`].
    logged: usize,
    http: WasiHttpCtx,
    pub(crate) http_hooks: OutboundHooks,
    /// When this run's execution deadline passes; the epoch callback traps after it.
    pub(crate) deadline: Instant,
    /// Where this run's progress reports go (none: checked, then dropped).
    progress: Option<ProgressTo>,
    /// The last progress this run reported (kept with a retry).
    pub(crate) last_progress: Option<Progress>,
}

/// The parts of a [`HostState`] that belong to one task (a warm instance
/// keeps the rest from one task to the next).
pub(crate) struct RunParts {
    pub(crate) meta: Arc<RunMeta>,
    pub(crate) http_hooks: OutboundHooks,
    pub(crate) deadline: Instant,
    pub(crate) progress: Option<ProgressTo>,
}

impl HostState {
    pub(crate) fn new(
        parts: RunParts,
        memory_limit: u64,
        budget: HostBudget,
        config: Arc<BTreeMap<String, String>>,
        grants: Arc<Grants>,
        stdout: &CappedPipe,
        stderr: &CappedPipe,
    ) -> HostState {
        HostState {
            wasi: None,
            output: (stdout.clone(), stderr.clone()),
            table: resource_table(),
            limiter: MemoryCap { limit: memory_limit, exceeded: None },
            meta: parts.meta,
            config,
            grants,
            refused_followup: false,
            followups: Vec::new(),
            groups: Vec::new(),
            graphs: Vec::new(),
            held: Held::new(budget.held_limit()),
            budget,
            logged: 0,
            http: http_ctx(budget),
            http_hooks: parts.http_hooks,
            deadline: parts.deadline,
            progress: parts.progress,
            last_progress: None,
        }
    }

    /// Starts the next task on a warm instance: its own meta, hooks, deadline
    /// and budget; WASI and the resource table carry over.
    pub(crate) fn next_task(&mut self, parts: RunParts) {
        self.meta = parts.meta;
        self.http_hooks = parts.http_hooks;
        self.deadline = parts.deadline;
        self.progress = parts.progress;
        self.last_progress = None;
        self.followups.clear();
        self.groups.clear();
        self.graphs.clear();
        self.refused_followup = false;
        self.held = Held::new(self.budget.held_limit());
        self.logged = 0;
        self.limiter.exceeded = None;
    }

    /// Starts the next task on an instance reset to its checkpoint: like
    /// [`HostState::next_task`], with the task's own output pipes; WASI and
    /// the resource table were emptied by [`HostState::forget_task`].
    pub(crate) fn next_fresh_task(&mut self, parts: RunParts, stdout: &CappedPipe, stderr: &CappedPipe) {
        self.next_task(parts);
        self.output = (stdout.clone(), stderr.clone());
    }

    /// Ends the run's progress: the sink is let go (it holds the run's claim,
    /// which an idle instance must not keep) and the last report returned.
    pub(crate) fn end_progress(&mut self) -> Option<Progress> {
        self.progress = None;
        self.last_progress.take()
    }

    /// Drops what the host held for the last task (its WASI context, the
    /// resources its handles named, its HTTP state) when its instance is
    /// reset: none of it may reach the next task, nor be kept while idle.
    pub(crate) fn forget_task(&mut self) {
        self.wasi = None;
        self.table = resource_table();
        self.http = http_ctx(self.budget);
        self.followups = Vec::new();
        self.groups = Vec::new();
        self.graphs = Vec::new();
        self.held = Held::new(self.budget.held_limit());
        self.progress = None;
        self.last_progress = None;
    }
}

fn resource_table() -> ResourceTable {
    let mut table = ResourceTable::new();
    table.set_max_capacity(MAX_RESOURCES);
    table
}

fn http_ctx(budget: HostBudget) -> WasiHttpCtx {
    let mut http = WasiHttpCtx::new();
    http.set_field_size_limit(budget.field_limit());
    http
}

/// WASI with nothing granted: no files, env, args or network; output captured.
fn deny_all_wasi(stdout: &CappedPipe, stderr: &CappedPipe, budget: HostBudget) -> WasiCtx {
    WasiCtxBuilder::new()
        .stdout(stdout.clone())
        .stderr(stderr.clone())
        .allow_tcp(false)
        .allow_udp(false)
        .allow_ip_name_lookup(false)
        .socket_addr_check(|_, _| Box::pin(async { false }))
        // get-random-bytes builds its answer in host memory first.
        .max_random_size(budget.field_limit() as u64)
        .build()
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        let (stdout, stderr, budget) = (&self.output.0, &self.output.1, self.budget);
        let ctx = self.wasi.get_or_insert_with(|| deny_all_wasi(stdout, stderr, budget));
        WasiCtxView { ctx, table: &mut self.table }
    }
}

impl WasiHttpView for HostState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView { ctx: &mut self.http, table: &mut self.table, hooks: &mut self.http_hooks }
    }
}

/// Caps linear memory and remembers a refused growth, to name it in the error.
pub(crate) struct MemoryCap {
    limit: u64,
    pub(crate) exceeded: Option<usize>,
}

impl ResourceLimiter for MemoryCap {
    fn memory_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        if desired as u64 > self.limit {
            self.exceeded = Some(desired);
            return Ok(false);
        }
        Ok(true)
    }

    fn table_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        Ok(desired <= 1_000_000)
    }
}

impl wit_types::Host for HostState {}

impl wit_log::Host for HostState {
    fn log(&mut self, level: wit_log::Level, message: String) {
        if self.logged >= LOG_CAP {
            return;
        }
        self.logged += message.len();
        let level = match level {
            wit_log::Level::Trace => tracing::Level::TRACE,
            wit_log::Level::Debug => tracing::Level::DEBUG,
            wit_log::Level::Info => tracing::Level::INFO,
            wit_log::Level::Warn => tracing::Level::WARN,
            wit_log::Level::Error => tracing::Level::ERROR,
        };
        if self.logged > LOG_CAP {
            let keep = floor_char_boundary(&message, message.len() - (self.logged - LOG_CAP));
            self.meta.emit(level, None, &message[..keep]);
            self.meta.warn(format_args!(
                "log output of this run reached {}: its further log lines are dropped",
                ByteSize::b(LOG_CAP as u64)
            ));
            return;
        }
        self.meta.emit(level, None, &message);
    }
}

impl HostState {
    /// The run's work on groups and the graphs it declared, taken for its ack.
    pub(crate) fn take_work(&mut self) -> (Vec<GroupWork>, Vec<GraphWork>) {
        (std::mem::take(&mut self.groups), std::mem::take(&mut self.graphs))
    }

    /// Whether this run may schedule into `to`, and replace there; a refusal
    /// is counted, and logged once per run.
    fn granted(&mut self, to: &TaskType) -> Result<bool, String> {
        match self.grants.check(&self.meta.task_type, to) {
            Ok(replace) => Ok(replace),
            Err(why) => {
                metrics::counter!(FOLLOWUPS_REFUSED_TOTAL, "type" => self.meta.task_type.to_string(), "target" => to.to_string())
                    .increment(1);
                if !std::mem::replace(&mut self.refused_followup, true) {
                    self.meta
                        .warn(format_args!("follow-up refused (further refusals of this run are not logged): {why}"));
                }
                Err(why)
            }
        }
    }

    /// A follow-up checked against the run's limits and grants, its bytes charged.
    fn followup(&mut self, task_type: String, id: Vec<u8>, payload: Vec<u8>, due_ms: u64) -> Result<FollowUp, String> {
        if let Some(why) = &self.held.exceeded {
            return Err(why.clone());
        }
        let children: usize = self.groups.iter().map(|g| g.children.len()).sum();
        if self.followups.len() + children >= MAX_FOLLOWUPS {
            return Err(format!("at most {MAX_FOLLOWUPS} follow-ups and group children per run"));
        }
        let task_type: TaskType = task_type.parse().map_err(|e| format!("{e}"))?;
        let replace = self.granted(&task_type)?;
        if id.len() > MAX_FOLLOWUP_ID {
            return Err(format!("id of {} bytes is over the limit of {MAX_FOLLOWUP_ID}", id.len()));
        }
        if payload.len() > MAX_FOLLOWUP_PAYLOAD {
            return Err(format!("payload of {} bytes is over the limit of 1 MiB", payload.len()));
        }
        let bytes = id.len() + payload.len() + FOLLOWUP_OVERHEAD;
        self.held.charge(bytes, "follow-ups", self.budget)?;
        let due_ms = i64::try_from(due_ms).unwrap_or(i64::MAX);
        Ok(FollowUp { task_type, id, payload, due_ms, replace })
    }
}

impl wit_schedule::Host for HostState {
    fn schedule(&mut self, task_type: String, id: Vec<u8>, payload: Vec<u8>, due_ms: u64) -> Result<(), String> {
        let followup = self.followup(task_type, id, payload, due_ms)?;
        self.followups.push(followup);
        Ok(())
    }
}

impl wit_progress::Host for HostState {
    fn report(&mut self, percent: u8, detail: String) -> Result<(), String> {
        let progress = super::progress::checked(percent, detail)?;
        if let Some(to) = &mut self.progress {
            to.report(progress.clone());
        }
        self.last_progress = Some(progress);
        Ok(())
    }
}

impl wit_config::Host for HostState {
    fn get(&mut self, key: String) -> Option<String> {
        self.config.get(&key).cloned()
    }
}

/// Cuts a guest's error text to [`MAX_ERROR_TEXT`] bytes (on a character
/// boundary), saying how much was cut: it is logged and stored in Redis.
pub(crate) fn cap_error(text: String) -> String {
    if text.len() <= MAX_ERROR_TEXT {
        return text;
    }
    let keep = floor_char_boundary(&text, MAX_ERROR_TEXT);
    format!("{}… ({} more bytes cut)", &text[..keep], text.len() - keep)
}

/// The largest index `<= at` that is a character boundary of `s`.
fn floor_char_boundary(s: &str, at: usize) -> usize {
    let mut i = at.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_text_is_cut_on_a_character_boundary() {
        assert_eq!(cap_error("short".into()), "short");
        let long = "é".repeat(MAX_ERROR_TEXT); // two bytes each
        let cut = cap_error(long.clone());
        assert!(cut.len() < MAX_ERROR_TEXT + 64, "{}", cut.len());
        assert!(cut.ends_with(&format!("({} more bytes cut)", long.len() - MAX_ERROR_TEXT)), "{cut}");
    }

    /// A state as a fresh instance's store gets it, capturing into `stdout` and `stderr`.
    fn fresh_state(stdout: &CappedPipe, stderr: &CappedPipe) -> HostState {
        let budget = HostBudget::new(4 * 1024 * 1024);
        let meta = Arc::new(RunMeta {
            plugin: "chaos".into(),
            plugin_hash: String::new(),
            task_type: "chaos".parse().expect("a valid type"),
            task_id: "t-1".into(),
            warm_up: false,
            attempt: 1,
        });
        let policy = crate::policy::SandboxPolicy {
            timeout: std::time::Duration::from_secs(1),
            memory_limit: ByteSize::mib(1),
            host_memory_limit: ByteSize::mib(4),
            max_payload: ByteSize::kib(1),
            instance_reuse: 0,
            instance_reset: true,
            instance_warm_up: true,
            allowed_outbound_hosts: Default::default(),
            http_timeout: std::time::Duration::from_secs(1),
            http_max_response: ByteSize::kib(1),
            http_concurrency: 1,
            may_schedule: Vec::new(),
            may_replace: Vec::new(),
        };
        let caller = crate::wasi_http::Caller { plugin: "chaos".into(), meta: meta.clone(), trace: None };
        let http_policy = Arc::new(crate::wasi_http::HttpPolicy::new(&policy));
        let http_hooks = OutboundHooks::new(http_policy, Instant::now(), budget, caller);
        let parts = RunParts { meta, http_hooks, deadline: Instant::now(), progress: None };
        HostState::new(parts, 1 << 20, budget, Arc::default(), Arc::default(), stdout, stderr)
    }

    #[test]
    fn wasi_is_built_on_the_first_wasi_call_and_kept_for_the_next() {
        let (stdout, stderr) = (CappedPipe::new(64), CappedPipe::new(64));
        let mut state = fresh_state(&stdout, &stderr);
        assert!(state.wasi.is_none(), "a run that makes no WASI call must not pay for a WASI context");
        let first: *const WasiCtx = state.ctx().ctx;
        assert!(state.wasi.is_some());
        let again: *const WasiCtx = state.ctx().ctx;
        assert_eq!(first, again, "later calls (and a warm instance's next task) use the same context");
    }

    #[test]
    fn held_bytes_fail_once_over_and_say_what_filled_them() {
        let b = HostBudget::new(4 * 1024 * 1024);
        let mut held = Held::new(1000);
        assert!(held.charge(600, "follow-ups", b).is_ok());
        let err = held.charge(600, "follow-ups", b).unwrap_err();
        assert!(err.contains("follow-ups would hold 1.2 KiB of the 1000 B"), "{err}");
        assert_eq!(held.exceeded.as_deref(), Some(err.as_str()));
    }
}
