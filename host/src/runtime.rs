//! The wasmtime sandbox: compiles plugins (with an on-disk cache) and runs one task per fresh instance.
//!
//! One [`Runtime`] owns the engine (pooling allocator, epoch interruption) and
//! the linker (deny-all WASI, the three `hourglass:plugin` imports, and
//! `wasi:http` whose every request passes the type's allow-list in `outgoing`). A
//! [`Component`] is a compiled plugin checked against the world; a [`Handler`]
//! binds it to a task type's limits and config, and [`Handler::run`] runs one
//! task in a new `Store`, so nothing leaks from one task to the next.

mod cache;
mod check;
mod outgoing;
mod pipe;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use bytesize::ByteSize;
use sha2::{Digest, Sha256};
use wasmtime::component::{HasSelf, Linker, ResourceTable};
use wasmtime::{
    Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, ResourceLimiter, Store,
    Trap,
};
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

pub use check::CheckReport;

use crate::config::TypePolicy;
use crate::task::{ClaimedTask, FollowUp};
use crate::task_type::TaskType;
use pipe::CappedPipe;

mod bindings {
    //! Host bindings of `plugin-sdk/wit`, the one contract with plugins.
    wasmtime::component::bindgen!({
        path: "../plugin-sdk/wit",
        world: "task-handler",
        // wasi:http and what it uses come from wasmtime-wasi(-http).
        require_store_data_send: true,
        with: {
            "wasi:http": wasmtime_wasi_http::p2::bindings::http,
            "wasi:io": wasmtime_wasi::p2::bindings::io,
            "wasi:clocks": wasmtime_wasi::p2::bindings::clocks,
        },
    });
}

use bindings::hourglass::plugin::{
    config as wit_config, log as wit_log, schedule as wit_schedule, types as wit_types,
};
use bindings::TaskHandlerPre;

/// The world every plugin must implement.
pub const WORLD: &str = "hourglass:plugin/task-handler@0.1.0";

/// Bytes of a freed instance's linear memory and tables kept resident for the
/// next one: with PAGEMAP_SCAN only dirty pages count (and are memset); without
/// it the lowest addresses are memset whether touched or not, so less is kept.
const KEEP_RESIDENT_MEMORY: usize = 1024 * 1024;
const KEEP_RESIDENT_MEMORY_NO_PAGEMAP: usize = 128 * 1024;
const KEEP_RESIDENT_TABLE: usize = 16 * 1024;
/// Freed slots madvised together.
const DECOMMIT_BATCH: usize = 16;

/// How often the epoch ticks: the granularity of deadlines.
const EPOCH_TICK: Duration = Duration::from_millis(5);
/// Bytes of stdout and of stderr kept per run; the rest is dropped.
const OUTPUT_CAP: usize = 64 * 1024;
/// Limits on follow-ups of one run (mirrored in the WIT docs).
const MAX_FOLLOWUPS: usize = 1000;
const MAX_FOLLOWUP_ID: usize = 1024;
const MAX_FOLLOWUP_PAYLOAD: usize = 1024 * 1024;

/// Sizing of a [`Runtime`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeOptions {
    /// Where compiled plugins are cached (see [`cache`]); `None` disables it.
    pub cache_dir: Option<PathBuf>,
    /// Most instances alive at once (the pool size): the runner's global concurrency.
    pub max_instances: u32,
    /// Largest linear memory of any instance, in bytes (the largest `memory_limit`).
    pub max_memory: u64,
}

impl Default for RuntimeOptions {
    fn default() -> Self {
        RuntimeOptions {
            cache_dir: None,
            max_instances: 64,
            max_memory: ByteSize::mib(64).as_u64(),
        }
    }
}

/// The wasmtime engine and linker shared by all plugins; cheap to clone.
#[derive(Clone)]
pub struct Runtime {
    inner: Arc<RuntimeInner>,
}

struct RuntimeInner {
    engine: Engine,
    linker: Linker<HostState>,
    max_memory: u64,
    cache: Option<cache::CompileCache>,
}

impl fmt::Debug for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Runtime")
            .field("max_memory", &self.inner.max_memory)
            .finish_non_exhaustive()
    }
}

impl Runtime {
    /// Builds the engine, the instance pool and the linker, and starts the epoch ticker.
    pub fn new(opts: RuntimeOptions) -> Result<Runtime> {
        let max_instances = opts.max_instances.max(1);
        let max_memory = opts.max_memory.max(ByteSize::mib(1).as_u64());

        let mut pool = PoolingAllocationConfig::new();
        // A Rust wasip2 component has a handful of core instances, memories and
        // tables (the program, the WASI adapter, shims); leave generous room.
        pool.total_component_instances(max_instances)
            .total_core_instances(max_instances.saturating_mul(16))
            .total_memories(max_instances.saturating_mul(4))
            .total_tables(max_instances.saturating_mul(16))
            .max_core_instances_per_component(16)
            .max_memories_per_component(4)
            .max_tables_per_component(16)
            .max_memory_size(usize::try_from(max_memory).unwrap_or(usize::MAX))
            // A freed slot's dirty pages are found with Linux's PAGEMAP_SCAN
            // (kernel 6.7+) and reset with memset instead of madvise: madvise
            // costs a TLB shoot-down on every core and page faults on the next
            // task. Measured: burst throughput about doubles (BENCHMARKS.md).
            .pagemap_scan(wasmtime::Enabled::Auto)
            .linear_memory_keep_resident(if PoolingAllocationConfig::is_pagemap_scan_available() {
                KEEP_RESIDENT_MEMORY
            } else {
                KEEP_RESIDENT_MEMORY_NO_PAGEMAP
            })
            .table_keep_resident(KEEP_RESIDENT_TABLE)
            // madvise what is left in batches rather than one slot at a time.
            .decommit_batch_size(DECOMMIT_BATCH);

        let mut config = Config::new();
        config.epoch_interruption(true);
        config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        let cache = opts.cache_dir.as_deref().map(cache::CompileCache::open).transpose()?;
        let engine = Engine::new(&config)
            .map_err(wt)
            .with_context(|| {
                // Each pooled memory reserves its own address space (about 4 GiB), so very
                // large pools, or many engines in one process, can run out of it.
                format!(
                    "cannot create the wasmtime engine with a pool of {max_instances} instances \
                     (runner.concurrency; a smaller one reserves less address space)"
                )
            })?;

        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker)
            .map_err(wt)
            .context("cannot link WASI")?;
        add_plugin_imports(&mut linker)
            .map_err(wt)
            .context("cannot link the hourglass:plugin imports")?;
        // Outbound HTTP; every request goes through `outgoing::OutboundHooks`.
        wasmtime_wasi_http::p2::add_only_http_to_linker_sync(&mut linker)
            .map_err(wt)
            .context("cannot link wasi:http")?;

        let inner = Arc::new(RuntimeInner {
            engine,
            linker,
            max_memory,
            cache,
        });
        spawn_epoch_ticker(Arc::downgrade(&inner))?;
        Ok(Runtime { inner })
    }

    /// Reads, compiles (through the cache) and checks a plugin file.
    ///
    /// Errors are one line naming the file and what is wrong with it.
    pub fn load(&self, path: &Path) -> Result<Component> {
        let bytes = std::fs::read(path)
            .with_context(|| format!("{}: cannot read plugin", path.display()))?;
        self.load_bytes(path, &bytes)
    }

    /// Like [`Runtime::load`], for bytes already read from `path`.
    pub fn load_bytes(&self, path: &Path, bytes: &[u8]) -> Result<Component> {
        let wasm = self.compile(path, bytes)?;
        let pre = match self.pre(&wasm) {
            Ok(pre) => pre,
            Err(_) => {
                let report = self.report(path, bytes, &wasm);
                bail!("{}: {}", path.display(), report.problem_line());
            }
        };
        Ok(Component {
            inner: Arc::new(ComponentInner {
                pre,
                path: path.to_owned(),
                hash: short_hash(bytes),
                max_memory: self.inner.max_memory,
            }),
        })
    }

    /// Describes a plugin file for `hourglass plugin check`: its imports,
    /// exports, world, and whether it fits [`WORLD`].
    ///
    /// Errors only when the file cannot be read or is not a component at all.
    pub fn check(&self, path: &Path) -> Result<CheckReport> {
        let bytes = std::fs::read(path)
            .with_context(|| format!("{}: cannot read plugin", path.display()))?;
        let wasm = self.compile(path, &bytes)?;
        Ok(self.report(path, &bytes, &wasm))
    }

    fn compile(&self, path: &Path, bytes: &[u8]) -> Result<wasmtime::component::Component> {
        if let Some(problem) = not_a_component(bytes) {
            bail!("{}: {problem}", path.display());
        }
        let compiled = match &self.inner.cache {
            Some(cache) => cache.load(&self.inner.engine, bytes),
            None => wasmtime::component::Component::new(&self.inner.engine, bytes),
        };
        compiled.map_err(|e| {
            let reason = one_line(&format!("{e:#}"));
            anyhow::anyhow!(
                "{}: invalid WebAssembly component: {reason}",
                path.display()
            )
        })
    }

    fn pre(
        &self,
        wasm: &wasmtime::component::Component,
    ) -> wasmtime::Result<TaskHandlerPre<HostState>> {
        TaskHandlerPre::new(self.inner.linker.instantiate_pre(wasm)?)
    }

    fn report(
        &self,
        path: &Path,
        bytes: &[u8],
        wasm: &wasmtime::component::Component,
    ) -> CheckReport {
        let linked = self.inner.linker.instantiate_pre(wasm);
        let typed = match &linked {
            Ok(pre) => TaskHandlerPre::new(pre.clone())
                .err()
                .map(|e| one_line(&format!("{e:#}"))),
            Err(_) => None,
        };
        let link_error = linked.err().map(|e| one_line(&format!("{e:#}")));
        CheckReport::new(
            &self.inner.engine,
            path,
            short_hash(bytes),
            wasm,
            link_error,
            typed,
        )
    }
}

/// The `hourglass:plugin` interfaces (not the world's wasi:http import,
/// which wasmtime-wasi-http provides).
fn add_plugin_imports(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    wit_types::add_to_linker::<HostState, HasSelf<HostState>>(linker, |s| s)?;
    wit_log::add_to_linker::<HostState, HasSelf<HostState>>(linker, |s| s)?;
    wit_schedule::add_to_linker::<HostState, HasSelf<HostState>>(linker, |s| s)?;
    wit_config::add_to_linker::<HostState, HasSelf<HostState>>(linker, |s| s)?;
    Ok(())
}

/// Ticks the engine's epoch until the last [`Runtime`] clone is gone.
fn spawn_epoch_ticker(runtime: Weak<RuntimeInner>) -> Result<()> {
    std::thread::Builder::new()
        .name("hourglass-epoch".into())
        .spawn(move || {
            loop {
                std::thread::sleep(EPOCH_TICK);
                match runtime.upgrade() {
                    Some(inner) => inner.engine.increment_epoch(),
                    None => break,
                }
            }
        })
        .context("cannot start the epoch thread")?;
    Ok(())
}

/// Why `bytes` cannot be a component, judged from the header, for a clear message.
fn not_a_component(bytes: &[u8]) -> Option<&'static str> {
    const MAGIC: &[u8] = b"\0asm";
    if bytes.len() < 8 || &bytes[..4] != MAGIC {
        return Some("not a WebAssembly file (no \\0asm header)");
    }
    match bytes[4..8] {
        [1, 0, 0, 0] => Some(
            "not a WebAssembly component (is it a core module? build with --target wasm32-wasip2)",
        ),
        [_, _, 1, 0] => None,
        _ => Some("not a WebAssembly component (unknown binary version)"),
    }
}

/// The short content hash that names a plugin version (first 12 hex digits of SHA-256).
fn short_hash(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))[..12].to_owned()
}

/// wasmtime has its own error type; keep its message chain when moving to anyhow.
fn wt(e: wasmtime::Error) -> anyhow::Error {
    anyhow::anyhow!("{}", one_line(&format!("{e:#}")))
}

/// Joins a multi-line error into one line.
fn one_line(text: &str) -> String {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// A compiled plugin, checked against [`WORLD`]; cheap to clone.
#[derive(Clone)]
pub struct Component {
    inner: Arc<ComponentInner>,
}

struct ComponentInner {
    pre: TaskHandlerPre<HostState>,
    path: PathBuf,
    hash: String,
    max_memory: u64,
}

impl fmt::Debug for Component {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Component")
            .field("path", &self.inner.path)
            .field("hash", &self.inner.hash)
            .finish_non_exhaustive()
    }
}

impl Component {
    /// First 12 hex digits of the SHA-256 of the file: names this version in logs.
    pub fn hash(&self) -> &str {
        &self.inner.hash
    }

    /// The file it was loaded from.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }
}

/// Sandbox limits of one task type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Execution deadline of one run (instantiation included).
    pub timeout: Duration,
    /// Cap on the instance's linear memory, in bytes.
    pub memory_limit: u64,
    /// Larger payloads fail permanently without running.
    pub max_payload: u64,
}

/// A component bound to one task type's limits and config values.
#[derive(Clone)]
pub struct Handler {
    component: Component,
    plugin_name: Arc<str>,
    limits: Limits,
    config: Arc<BTreeMap<String, String>>,
    http: Arc<outgoing::HttpPolicy>,
    /// Most consecutive tasks one instance serves (`instance_reuse`); 0 or 1: a fresh instance each.
    reuse: u32,
}

/// A live instance one worker keeps between tasks of a type that opted into reuse.
pub struct WarmInstance {
    store: Store<HostState>,
    instance: bindings::TaskHandler,
    stdout: CappedPipe,
    stderr: CappedPipe,
    served: u32,
    component: Arc<ComponentInner>,
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
}

impl Handler {
    /// Binds `component` to a task type's policy and `config` values.
    pub fn new(
        component: Component,
        plugin_name: impl Into<String>,
        policy: &TypePolicy,
        config: Arc<BTreeMap<String, String>>,
    ) -> Handler {
        Handler {
            component,
            plugin_name: Arc::from(plugin_name.into()),
            limits: Limits {
                timeout: policy.timeout,
                memory_limit: policy.memory_limit.as_u64(),
                max_payload: policy.max_payload.as_u64(),
            },
            config,
            http: Arc::new(outgoing::HttpPolicy::new(policy)),
            reuse: policy.instance_reuse,
        }
    }

    /// The component it runs.
    pub fn component(&self) -> &Component {
        &self.component
    }

    /// Its sandbox limits.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Runs one task in a fresh instance; blocks until it returns, traps or hits the deadline.
    pub fn run(&self, task: &ClaimedTask) -> TaskRun {
        if let Some(refused) = self.refuse_oversize(task) {
            return refused;
        }
        let (mut store, stdout, stderr) = self.new_store(task);
        let outcome = self
            .component
            .inner
            .pre
            .instantiate(&mut store)
            .and_then(|instance| instance.call_handle(&mut store, &wit_task(task)));
        let (out, out_dropped) = stdout.take();
        let (err, err_dropped) = stderr.take();
        let state = store.into_data();
        emit_output(&state.meta, "stdout", &out, out_dropped);
        emit_output(&state.meta, "stderr", &err, err_dropped);

        let result = self.result_of(outcome, state.limiter.exceeded, &err);
        let followups = if result.is_ok() {
            state.followups
        } else {
            Vec::new()
        };
        TaskRun { result, followups }
    }

    /// A fresh `Store` for `task` with its memory cap and deadline, and the
    /// pipes that capture its stdout and stderr.
    fn new_store(&self, task: &ClaimedTask) -> (Store<HostState>, CappedPipe, CappedPipe) {
        let stdout = CappedPipe::new(OUTPUT_CAP);
        let stderr = CappedPipe::new(OUTPUT_CAP);
        let state = self.host_state(task, &stdout, &stderr);
        let mut store = Store::new(self.component.inner.pre.engine(), state);
        store.limiter(|s| &mut s.limiter);
        store.set_epoch_deadline(deadline_ticks(self.limits.timeout));
        (store, stdout, stderr)
    }

    /// A payload over `max_payload` fails permanently without running.
    fn refuse_oversize(&self, task: &ClaimedTask) -> Option<TaskRun> {
        if task.payload.len() as u64 > self.limits.max_payload {
            let failure = Failure::Permanent(format!(
                "payload of {} bytes exceeds max_payload of {}",
                task.payload.len(),
                ByteSize::b(self.limits.max_payload)
            ));
            return Some(TaskRun {
                result: Err(failure),
                followups: Vec::new(),
            });
        }
        None
    }

    /// The parts of the state that belong to one task: who logs, and the outbound HTTP deadline.
    fn task_state(&self, task: &ClaimedTask) -> (RunMeta, outgoing::OutboundHooks) {
        let meta = RunMeta {
            plugin: self.plugin_name.clone(),
            plugin_hash: self.component.hash().to_owned(),
            task_type: task.task_type.to_string(),
            task_id: String::from_utf8_lossy(&task.id).into_owned(),
            attempt: task.attempt,
        };
        let http_hooks = outgoing::OutboundHooks::new(
            self.http.clone(),
            std::time::Instant::now() + self.limits.timeout,
            outgoing::Caller {
                plugin: self.plugin_name.clone(),
                task_type: task.task_type.to_string(),
                task_id: String::from_utf8_lossy(&task.id).into_owned(),
            },
        );
        (meta, http_hooks)
    }

    /// The per-run state of a fresh `Store` for `task`, its output going to the pipes.
    fn host_state(&self, task: &ClaimedTask, stdout: &CappedPipe, stderr: &CappedPipe) -> HostState {
        let (meta, http_hooks) = self.task_state(task);
        HostState {
            wasi: deny_all_wasi(stdout, stderr),
            table: ResourceTable::new(),
            limiter: MemoryCap {
                limit: self
                    .limits
                    .memory_limit
                    .min(self.component.inner.max_memory),
                exceeded: None,
            },
            meta,
            config: self.config.clone(),
            followups: Vec::new(),
            http: WasiHttpCtx::new(),
            http_hooks,
        }
    }

    /// What a call's outcome means for the task.
    fn result_of(
        &self,
        outcome: wasmtime::Result<Result<(), wit_types::Failure>>,
        memory_wanted: Option<usize>,
        err: &str,
    ) -> Result<(), Failure> {
        match outcome {
            Ok(Ok(())) => Ok(()),
            Ok(Err(wit_types::Failure::RetryAfter(ms))) => {
                Err(Failure::RetryAfter(Duration::from_millis(ms)))
            }
            Ok(Err(wit_types::Failure::Permanent(reason))) => Err(Failure::Permanent(reason)),
            Ok(Err(wit_types::Failure::Error(message))) => Err(Failure::Error(message)),
            Err(e) => Err(Failure::Error(self.describe_crash(
                &e,
                memory_wanted,
                err,
            ))),
        }
    }

    /// Like [`Handler::run`], but when the type opted into `instance_reuse`,
    /// runs the task on the live instance in `warm` (creating it if needed)
    /// and keeps it there for the next task, up to the configured count. A
    /// trap or any failure discards the instance.
    ///
    /// What reuse gives up: the instance's linear memory, globals and WASI
    /// state carry over from one task to the next, so a task can see data an
    /// earlier task of the same type left behind, and a handler that corrupts
    /// its own state without failing affects the tasks after it.
    pub fn run_reusing(&self, warm: &mut Option<WarmInstance>, task: &ClaimedTask) -> TaskRun {
        if self.reuse <= 1 {
            return self.run(task);
        }
        if let Some(refused) = self.refuse_oversize(task) {
            return refused;
        }
        let mut w = match warm.take() {
            Some(w) if Arc::ptr_eq(&w.component, &self.component.inner) => w,
            _ => {
                let (mut store, stdout, stderr) = self.new_store(task);
                match self.component.inner.pre.instantiate(&mut store) {
                    Ok(instance) => WarmInstance {
                        store,
                        instance,
                        stdout,
                        stderr,
                        served: 0,
                        component: self.component.inner.clone(),
                    },
                    Err(e) => {
                        let (err, _) = stderr.take();
                        let exceeded = store.data().limiter.exceeded;
                        let result = self.result_of(Err(e), exceeded, &err);
                        return TaskRun { result, followups: Vec::new() };
                    }
                }
            }
        };
        {
            // Per-task parts of the state; WASI and its resource table carry over.
            let fresh = self.task_state(task);
            let state = w.store.data_mut();
            state.meta = fresh.0;
            state.http_hooks = fresh.1;
            state.followups.clear();
            state.limiter.exceeded = None;
        }
        w.store.set_epoch_deadline(deadline_ticks(self.limits.timeout));
        let outcome = w.instance.call_handle(&mut w.store, &wit_task(task));
        let (out, out_dropped) = w.stdout.take();
        let (err, err_dropped) = w.stderr.take();
        emit_output(&w.store.data().meta, "stdout", &out, out_dropped);
        emit_output(&w.store.data().meta, "stderr", &err, err_dropped);
        let exceeded = w.store.data().limiter.exceeded;
        let result = self.result_of(outcome, exceeded, &err);
        let followups = if result.is_ok() {
            std::mem::take(&mut w.store.data_mut().followups)
        } else {
            Vec::new()
        };
        w.served += 1;
        if result.is_ok() && w.served < self.reuse {
            *warm = Some(w);
        }
        TaskRun { result, followups }
    }

    /// One line saying why the guest stopped abnormally.
    fn describe_crash(
        &self,
        e: &wasmtime::Error,
        memory_wanted: Option<usize>,
        stderr: &str,
    ) -> String {
        if let Some(wanted) = memory_wanted {
            let limit = self
                .limits
                .memory_limit
                .min(self.component.inner.max_memory);
            return format!(
                "memory limit of {} exceeded (the guest asked for {}): {}",
                ByteSize::b(limit),
                ByteSize::b(wanted as u64),
                crash_reason(e)
            );
        }
        match e.downcast_ref::<Trap>() {
            Some(Trap::Interrupt) => {
                format!(
                    "deadline of {} exceeded",
                    humantime::format_duration(self.limits.timeout)
                )
            }
            Some(Trap::StackOverflow) => {
                "stack overflow (wasm trap: call stack exhausted)".to_owned()
            }
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
    let message = lines
        .next()
        .filter(|l| !l.starts_with("note:"))
        .unwrap_or_default();
    let place = header
        .split_once("panicked at ")
        .map(|(_, p)| p.trim_end_matches(':'))
        .unwrap_or_default();
    Some(if message.is_empty() {
        header.to_owned()
    } else {
        format!("{message} (at {place})")
    })
}

fn deadline_ticks(timeout: Duration) -> u64 {
    let ticks = timeout.as_nanos() / EPOCH_TICK.as_nanos();
    // +1: the current tick may be nearly over already.
    u64::try_from(ticks).unwrap_or(u64::MAX).saturating_add(1)
}

fn wit_task(task: &ClaimedTask) -> wit_types::Task {
    wit_types::Task {
        id: task.id.clone(),
        task_type: task.task_type.to_string(),
        payload: task.payload.clone(),
        attempt: task.attempt,
        due_ms: u64::try_from(task.due_ms).unwrap_or(0),
    }
}

/// WASI with nothing granted: no files, env, args or network; output captured.
fn deny_all_wasi(stdout: &CappedPipe, stderr: &CappedPipe) -> WasiCtx {
    WasiCtxBuilder::new()
        .stdout(stdout.clone())
        .stderr(stderr.clone())
        .allow_tcp(false)
        .allow_udp(false)
        .allow_ip_name_lookup(false)
        .socket_addr_check(|_, _| Box::pin(async { false }))
        .build()
}

/// Emits captured output as log lines, one event per line.
fn emit_output(meta: &RunMeta, stream: &'static str, text: &str, dropped: usize) {
    for line in text.lines() {
        meta.emit(tracing::Level::INFO, Some(stream), format_args!("{line}"));
    }
    if dropped > 0 {
        let message = format_args!(
            "{} of output over the {} cap was dropped",
            ByteSize::b(dropped as u64),
            ByteSize::b(OUTPUT_CAP as u64)
        );
        meta.emit(tracing::Level::WARN, Some(stream), message);
    }
}

/// Who is logging: attached to every guest log line.
struct RunMeta {
    plugin: Arc<str>,
    plugin_hash: String,
    task_type: String,
    task_id: String,
    attempt: u32,
}

impl RunMeta {
    /// One guest log line (`stream`: captured stdout or stderr; `None`: the log import).
    fn emit(&self, level: tracing::Level, stream: Option<&str>, message: std::fmt::Arguments<'_>) {
        // tracing needs each level spelled out at its call site.
        macro_rules! event {
            ($level:expr) => {
                tracing::event!(
                    target: "hourglass::plugin",
                    $level,
                    plugin = %self.plugin,
                    plugin_hash = %self.plugin_hash,
                    task_type = %self.task_type,
                    task_id = %self.task_id,
                    attempt = self.attempt,
                    stream,
                    "{message}"
                )
            };
        }
        match level {
            tracing::Level::TRACE => event!(tracing::Level::TRACE),
            tracing::Level::DEBUG => event!(tracing::Level::DEBUG),
            tracing::Level::INFO => event!(tracing::Level::INFO),
            tracing::Level::WARN => event!(tracing::Level::WARN),
            _ => event!(tracing::Level::ERROR),
        }
    }
}

/// Per-run state of a `Store`.
struct HostState {
    wasi: WasiCtx,
    table: ResourceTable,
    limiter: MemoryCap,
    meta: RunMeta,
    config: Arc<BTreeMap<String, String>>,
    followups: Vec<FollowUp>,
    http: WasiHttpCtx,
    http_hooks: outgoing::OutboundHooks,
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl WasiHttpView for HostState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: &mut self.http_hooks,
        }
    }
}

/// Caps linear memory and remembers a refused growth, to name it in the error.
struct MemoryCap {
    limit: u64,
    exceeded: Option<usize>,
}

impl ResourceLimiter for MemoryCap {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired as u64 > self.limit {
            self.exceeded = Some(desired);
            return Ok(false);
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= 1_000_000)
    }
}

impl wit_types::Host for HostState {}

impl wit_log::Host for HostState {
    fn log(&mut self, level: wit_log::Level, message: String) {
        let level = match level {
            wit_log::Level::Trace => tracing::Level::TRACE,
            wit_log::Level::Debug => tracing::Level::DEBUG,
            wit_log::Level::Info => tracing::Level::INFO,
            wit_log::Level::Warn => tracing::Level::WARN,
            wit_log::Level::Error => tracing::Level::ERROR,
        };
        self.meta.emit(level, None, format_args!("{message}"));
    }
}

impl wit_schedule::Host for HostState {
    fn schedule(
        &mut self,
        task_type: String,
        id: Vec<u8>,
        payload: Vec<u8>,
        due_ms: u64,
    ) -> Result<(), String> {
        if self.followups.len() >= MAX_FOLLOWUPS {
            return Err(format!("at most {MAX_FOLLOWUPS} follow-ups per run"));
        }
        let task_type: TaskType = task_type.parse().map_err(|e| format!("{e}"))?;
        if id.len() > MAX_FOLLOWUP_ID {
            return Err(format!(
                "id of {} bytes is over the limit of {MAX_FOLLOWUP_ID}",
                id.len()
            ));
        }
        if payload.len() > MAX_FOLLOWUP_PAYLOAD {
            return Err(format!(
                "payload of {} bytes is over the limit of 1 MiB",
                payload.len()
            ));
        }
        let due_ms = i64::try_from(due_ms).unwrap_or(i64::MAX);
        self.followups.push(FollowUp {
            task_type,
            id,
            payload,
            due_ms,
        });
        Ok(())
    }
}

impl wit_config::Host for HostState {
    fn get(&mut self, key: String) -> Option<String> {
        self.config.get(&key).cloned()
    }
}
