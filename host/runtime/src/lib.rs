//! The wasmtime sandbox: compiles plugins (with an on-disk cache) and runs one task per fresh instance.
//!
//! This crate links no Redis: it is handed tasks (`hourglass-task`'s
//! `ClaimedTask`) and returns what each run asked for ([`TaskRun`]); the
//! host's pipeline claims and settles them. Cargo keeps the arrow one way.
//!
//! One [`Runtime`] owns the engine (pooling allocator, epoch interruption),
//! the linker (deny-all WASI, the `hourglass:plugin` imports, and `wasi:http`
//! whose every request passes the type's allow-list in [`outbound`]) and the
//! executor that runs guests, apart from the host's own tasks. A
//! [`Component`] is a compiled plugin checked against the world; a
//! [`Handler`] binds it to a task type's limits and config, and
//! [`Handler::run`] runs one task in a new `wasmtime::Store`, so nothing leaks from one
//! task to the next.
//!
//! Everything is async: a run that passes its deadline is ended wherever it
//! is, in guest code or blocked in a host call, and its instance, pooled slot
//! and host memory come back at once.
//!
//! # Layout
//!
//! In the order a plugin meets them:
//!
//! - `compile.rs`: compiling in a child process under limits (`compile-worker`); `cache.rs`: the
//!   on-disk cache of compiled plugins; `check.rs`: a component checked against the world;
//!   [`interpreter`]: which interpreter a plugin bundles (CPython, QuickJS-ng, StarlingMonkey);
//!   `component.rs`: a compiled plugin ([`Component`]) and what its instances share;
//!   `priority.rs`: compiles at low CPU priority;
//! - `policy.rs`: what a type's runs are held to; `handler.rs`: a component bound to it, one run
//!   from a fresh state (`handler/kept.rs`: on a kept instance reset to its checkpoint, or reused);
//!   `checkpoints.rs`: what a plugin's instances share and what its runs cost; `run.rs`: a run's
//!   identity, caps and budget; `host_state.rs`: its host state and the `hourglass:plugin` imports;
//!   `pipe.rs`: captured output; [`reset`]: how a freed instance's memory is made as built again
//!   on this machine;
//! - [`outbound`]: allow-lists and address checks; `wasi_http.rs`: `wasi:http` requests through them;
//!   [`trace`]: the client spans of a traced run's requests.

pub mod interpreter;
pub mod outbound;
pub mod progress;
pub mod reset;
pub mod trace;

mod cache;
mod check;
mod checkpoints;
mod compile;
mod component;
mod handler;
mod host_state;
mod pipe;
mod policy;
mod priority;
mod run;
mod wasi_http;

use hourglass_task::sync::LockExt;
use std::fmt;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bytesize::ByteSize;
use sha2::{Digest, Sha256};
use wasmtime::component::{HasSelf, Linker};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

pub use check::{CheckReport, CompileReport};
pub use checkpoints::RunCost;
pub use compile::{
    CompileLimits, CompileStats, Compiler, DEFAULT_COMPILE_THREADS, Refused, WorkerArgs, is_refused,
    worker as compile_worker, worker_if_asked as compile_worker_if_asked,
};
pub use component::Component;
use component::ComponentInner;
pub use handler::{Failure, Handler, Limits, TaskRun};
pub use host_state::{FOLLOWUPS_REFUSED_TOTAL, LOG_CAP};
pub use policy::SandboxPolicy;
pub use progress::{MAX_PROGRESS_DETAIL, ReportProgress, RunHooks};
pub use reset::{MemoryReset, ResetMethod, Swap};
pub use run::{HostBudget, MAX_ERROR_TEXT, MAX_RESOURCES, OUTPUT_CAP};

use host_state::HostState;

mod bindings {
    //! Host bindings of `plugin-sdk/wit`, the one contract with plugins.
    wasmtime::component::bindgen!({
        path: "../../plugin-sdk/wit",
        world: "task-handler",
        // `handle` is called with call_async; the hourglass imports are quick and stay sync.
        exports: { default: async },
        // wasi:http and what it uses come from wasmtime-wasi(-http).
        require_store_data_send: true,
        with: {
            "wasi:http": wasmtime_wasi_http::p2::bindings::http,
            "wasi:io": wasmtime_wasi::p2::bindings::io,
            "wasi:clocks": wasmtime_wasi::p2::bindings::clocks,
        },
    });
}

use bindings::TaskHandlerPre;
use bindings::hourglass::plugin::{
    config as wit_config, log as wit_log, progress as wit_progress, schedule as wit_schedule, types as wit_types,
    workflow as wit_workflow,
};

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
/// Idle warm instances (`instance_reuse`) kept over all handlers; the pool
/// has this many slots beyond `max_instances` for them.
const WARM_IDLE_MAX: usize = 64;

/// How often the epoch ticks: the granularity of deadlines, and how often a
/// guest in a loop yields its executor thread.
const EPOCH_TICK: Duration = Duration::from_millis(5);

/// Most threads of a compile or of the handler executor a caller may ask for.
pub const MAX_THREADS: usize = 256;
/// The handler executor's default stops growing with the machine here: more
/// threads than the work keeps busy cost CPU per task in wake-ups
/// (BENCHMARKS.md, "Host CPU by thread count"); `worker_threads` raises it.
pub const MAX_DEFAULT_WORKER_THREADS: usize = 8;

/// Idle kept instances one handler keeps for its next tasks (reset or
/// `instance_reuse`): one per handler thread, since those bound how many
/// runs are in guest code at once, and at least the default threads' cap;
/// at most what the pool keeps for all handlers (`WARM_IDLE_MAX`).
fn kept_per_handler(worker_threads: usize) -> usize {
    worker_threads.clamp(MAX_DEFAULT_WORKER_THREADS, WARM_IDLE_MAX)
}

/// Threads that run handlers when none are asked for: the machine's cores, up to [`MAX_DEFAULT_WORKER_THREADS`].
pub fn default_worker_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get()).min(MAX_DEFAULT_WORKER_THREADS)
}

/// Sizing of a [`Runtime`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeOptions {
    /// Where compiled plugins are cached (see [`cache`]); `None` disables it.
    pub cache_dir: Option<PathBuf>,
    /// Most instances running at once (the pool size): the runner's global concurrency.
    pub max_instances: u32,
    /// Largest linear memory of any instance, in bytes (the largest `memory_limit`).
    pub max_memory: u64,
    /// Where plugins are compiled: a child process under limits, or this process.
    pub compiler: Compiler,
    /// What one compile may take (applied to a child; the size limit applies to both).
    pub compile_limits: CompileLimits,
    /// Threads of the executor that runs handlers (`worker_threads`).
    pub worker_threads: usize,
}

impl RuntimeOptions {
    /// The defaults (64 instances of at most 64 MiB, no cache, the default
    /// compile limits and executor threads), compiling with `compiler`: there
    /// is no default compiler, so compiling without limits
    /// ([`Compiler::InProcess`]) is always a caller's explicit choice.
    pub fn new(compiler: Compiler) -> Self {
        RuntimeOptions {
            cache_dir: None,
            max_instances: 64,
            max_memory: ByteSize::mib(64).as_u64(),
            compiler,
            compile_limits: CompileLimits::default(),
            worker_threads: default_worker_threads(),
        }
    }
}

/// The wasmtime engine, linker and guest executor shared by all plugins; cheap to clone.
#[derive(Clone)]
pub struct Runtime {
    inner: Arc<RuntimeInner>,
}

struct RuntimeInner {
    engine: Engine,
    /// The engine's settings without its instance pool: each compile runs in
    /// a throwaway engine made from them (see `Runtime::compile`).
    compile_config: Config,
    linker: Linker<HostState>,
    max_memory: u64,
    cache: Option<cache::CompileCache>,
    compiler: Compiler,
    /// Changed by a runner.toml reload ([`Runtime::set_compile_limits`]).
    compile_limits: std::sync::Mutex<CompileLimits>,
    executor: Executor,
    /// Idle warm instances over all handlers (each holds a pool slot).
    warm_idle: Arc<AtomicUsize>,
    /// Idle kept instances one handler keeps ([`kept_per_handler`]).
    kept_per_handler: usize,
    /// How freed slots are reset here, and why.
    memory_reset: MemoryReset,
}

/// The multi-threaded tokio runtime guests run on: a guest spinning in a
/// loop yields every epoch tick, but it still should not delay the host's
/// own claims, settles and lease renewals, which stay on the caller's runtime.
struct Executor(Option<tokio::runtime::Runtime>);

impl Drop for Executor {
    fn drop(&mut self) {
        // Dropped from async code (a host shutting down): never block there.
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

impl fmt::Debug for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Runtime").field("max_memory", &self.inner.max_memory).finish_non_exhaustive()
    }
}

impl Runtime {
    /// Builds the engine, the instance pool, the linker and the guest
    /// executor, and starts the epoch ticker.
    pub fn new(opts: RuntimeOptions) -> Result<Runtime> {
        let max_instances = opts.max_instances.max(1);
        let max_memory = opts.max_memory.max(ByteSize::mib(1).as_u64());
        let slots = max_instances.saturating_add(WARM_IDLE_MAX as u32);
        let memory_reset = MemoryReset::detect();

        let mut pool = PoolingAllocationConfig::new();
        // A Rust wasip2 component has a handful of core instances, memories and
        // tables (the program, the WASI adapter, shims); leave generous room.
        pool.total_component_instances(slots)
            .total_core_instances(slots.saturating_mul(16))
            .total_memories(slots.saturating_mul(4))
            .total_tables(slots.saturating_mul(16))
            // One fiber stack per run in progress.
            .total_stacks(slots)
            .max_core_instances_per_component(16)
            .max_memories_per_component(4)
            .max_tables_per_component(16)
            .max_memory_size(usize::try_from(max_memory).unwrap_or(usize::MAX))
            // A freed slot's dirty pages are found with Linux's PAGEMAP_SCAN
            // (kernel 6.7+) and reset with memset instead of madvise: madvise
            // costs a TLB shoot-down on every core and page faults on the next
            // task. Measured: burst throughput about doubles (BENCHMARKS.md).
            .pagemap_scan(wasmtime::Enabled::Auto)
            .linear_memory_keep_resident(if memory_reset.method == ResetMethod::DirtyPageScan {
                KEEP_RESIDENT_MEMORY
            } else {
                KEEP_RESIDENT_MEMORY_NO_PAGEMAP
            })
            .table_keep_resident(KEEP_RESIDENT_TABLE)
            // madvise what is left in batches rather than one slot at a time.
            .decommit_batch_size(DECOMMIT_BATCH);

        priority::lower_compile_pool();
        let mut config = engine_config();
        // Compiled code depends on settings, not on how instances are allocated.
        let compile_config = config.clone();
        config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        let cache = opts.cache_dir.as_deref().map(cache::CompileCache::open).transpose()?;
        let engine = Engine::new(&config).map_err(wt).with_context(|| {
            // Each pooled memory reserves its own address space (about 4 GiB), so very
            // large pools, or many engines in one process, can run out of it.
            format!(
                "cannot create the wasmtime engine with a pool of {max_instances} instances \
                 (runner.concurrency; a smaller one reserves less address space)"
            )
        })?;

        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker).map_err(wt).context("cannot link WASI")?;
        add_plugin_imports(&mut linker).map_err(wt).context("cannot link the hourglass:plugin imports")?;
        // Outbound HTTP; every request goes through `wasi_http::OutboundHooks`.
        wasmtime_wasi_http::p2::add_only_http_to_linker_async(&mut linker)
            .map_err(wt)
            .context("cannot link wasi:http")?;

        let executor = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(opts.worker_threads.max(1))
            .thread_name("hourglass-run")
            .enable_all()
            .build()
            .context("cannot start the threads that run handlers")?;
        let inner = Arc::new(RuntimeInner {
            engine,
            compile_config,
            linker,
            max_memory,
            cache,
            compiler: opts.compiler,
            compile_limits: std::sync::Mutex::new(opts.compile_limits),
            executor: Executor(Some(executor)),
            warm_idle: Arc::default(),
            kept_per_handler: kept_per_handler(opts.worker_threads),
            memory_reset,
        });
        spawn_epoch_ticker(Arc::downgrade(&inner))?;
        Ok(Runtime { inner })
    }

    /// How a freed instance's memory is reset on this machine, and whether it can be swapped.
    pub fn memory_reset(&self) -> &MemoryReset {
        &self.inner.memory_reset
    }

    /// Runs `future` (a task's run) on the guest executor.
    pub fn spawn<F>(&self, future: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let executor = self.inner.executor.0.as_ref().expect("the executor lives as long as the runtime");
        executor.spawn(future)
    }

    /// A handle of the guest executor, e.g. to spawn tracked runs on it.
    pub fn executor(&self) -> tokio::runtime::Handle {
        self.inner.executor.0.as_ref().expect("the executor lives as long as the runtime").handle().clone()
    }

    /// Reads, compiles (through the cache) and checks a plugin file.
    ///
    /// Errors are one line naming the file and what is wrong with it; a
    /// plugin the host will not load as it is carries [`Refused`].
    pub fn load(&self, path: &Path) -> Result<Component> {
        let bytes = self.read_plugin(path)?;
        self.load_bytes(path, &bytes)
    }

    /// Reads a plugin file; one over `max_plugin_size` is refused unread.
    pub fn read_plugin(&self, path: &Path) -> Result<Vec<u8>> {
        compile::read_plugin(path, self.compile_limits().max_plugin_size)
    }

    /// Like [`Runtime::load`], for bytes already read from `path`.
    pub fn load_bytes(&self, path: &Path, bytes: &[u8]) -> Result<Component> {
        let (wasm, compiled) = self.compile(path, bytes)?;
        let pre = match self.pre(&wasm) {
            Ok(pre) => pre,
            Err(_) => {
                let report = self.report(path, bytes, &wasm, compiled);
                return Err(compile::refused(format!("{}: {}", path.display(), report.problem_line())));
            }
        };
        Ok(Component {
            inner: Arc::new(ComponentInner {
                pre,
                path: path.to_owned(),
                hash: short_hash(bytes),
                interpreter: interpreter::Interpreter::of(bytes),
                compiled,
                max_memory: self.inner.max_memory,
                warm_idle: self.inner.warm_idle.clone(),
                kept_per_handler: self.inner.kept_per_handler,
                reset_template: OnceLock::new(),
                reset_refused: OnceLock::new(),
                warm_template: OnceLock::new(),
                warm_up_refused: OnceLock::new(),
                runs: AtomicU64::new(0),
                run_nanos: AtomicU64::new(0),
            }),
        })
    }

    /// Whether `bytes` would be compiled now rather than mapped from the cache.
    pub fn needs_compile(&self, bytes: &[u8]) -> bool {
        self.inner.cache.as_ref().is_none_or(|c| !c.has(&self.inner.engine, bytes))
    }

    /// The limits compiles run under now.
    pub fn compile_limits(&self) -> CompileLimits {
        *self.inner.compile_limits.lock_unpoisoned()
    }

    /// Changes the limits of the compiles to come (runner.toml was edited).
    pub fn set_compile_limits(&self, limits: CompileLimits) {
        *self.inner.compile_limits.lock_unpoisoned() = limits;
    }

    /// Describes a plugin file for `hourglass plugin check`: its imports,
    /// exports, world, whether it fits [`WORLD`], and what compiling it took.
    ///
    /// Errors when the file cannot be read, is not a component at all, or
    /// is refused by a compile limit.
    pub fn check(&self, path: &Path) -> Result<CheckReport> {
        let bytes = self.read_plugin(path)?;
        let (wasm, compiled) = self.compile(path, &bytes)?;
        Ok(self.report(path, &bytes, &wasm, compiled))
    }

    /// The compiled component of `bytes`: mapped from the cache, or compiled
    /// now (then with what compiling took).
    fn compile(&self, path: &Path, bytes: &[u8]) -> Result<(wasmtime::component::Component, Option<CompileStats>)> {
        if let Some(problem) = not_a_component(bytes) {
            return Err(compile::refused(format!("{}: {problem}", path.display())));
        }
        let engine = &self.inner.engine;
        match &self.inner.cache {
            Some(cache) => cache.load(engine, bytes, |dest| self.compile_to(path, bytes, dest)),
            None => {
                let dest = std::env::temp_dir().join(format!(
                    "hourglass-compile-{}-{:x}.cwasm",
                    std::process::id(),
                    rand::random::<u64>()
                ));
                let loaded = self.compile_to(path, bytes, &dest).and_then(|stats| {
                    let compiled = std::fs::read(&dest).with_context(|| format!("cannot read {}", dest.display()))?;
                    Ok((cache::in_memory(engine, &compiled).map_err(wt)?, Some(stats)))
                });
                let _ = std::fs::remove_file(&dest);
                loaded
            }
        }
    }

    /// Compiles `bytes` into the file `dest`, where the runtime's [`Compiler`] says.
    fn compile_to(&self, path: &Path, bytes: &[u8], dest: &Path) -> Result<CompileStats> {
        match &self.inner.compiler {
            Compiler::Child { program } => compile::in_child(program, path, bytes, dest, &self.compile_limits()),
            Compiler::InProcess => {
                let started = Instant::now();
                // A wasmtime engine keeps its compiler's scratch buffers for good,
                // sized by the largest function it compiled: about 80 MiB after an
                // interpreter's main loop (CPython, StarlingMonkey). A throwaway
                // engine compiles, and gives them back when it is dropped.
                // Compiling takes every core for a while; running tasks come first.
                let compiled =
                    priority::at_low_priority(|| Engine::new(&self.inner.compile_config)?.precompile_component(bytes))
                        .map_err(|e| {
                            let reason = one_line(&format!("{e:#}"));
                            compile::refused(format!("{}: invalid WebAssembly component: {reason}", path.display()))
                        })?;
                compile::write_atomically(dest, &compiled)
                    .with_context(|| format!("cannot write the compiled plugin {}", dest.display()))?;
                Ok(CompileStats { wall: started.elapsed(), cpu: None, peak_rss: None })
            }
        }
    }

    fn pre(&self, wasm: &wasmtime::component::Component) -> wasmtime::Result<TaskHandlerPre<HostState>> {
        TaskHandlerPre::new(self.inner.linker.instantiate_pre(wasm)?)
    }

    fn report(
        &self,
        path: &Path,
        bytes: &[u8],
        wasm: &wasmtime::component::Component,
        compiled: Option<CompileStats>,
    ) -> CheckReport {
        let linked = self.inner.linker.instantiate_pre(wasm);
        let typed = match &linked {
            Ok(pre) => TaskHandlerPre::new(pre.clone()).err().map(|e| one_line(&format!("{e:#}"))),
            Err(_) => None,
        };
        let link_error = linked.err().map(|e| one_line(&format!("{e:#}")));
        let compile =
            CompileReport { stats: compiled, limits: self.compile_limits(), compiler: self.inner.compiler.clone() };
        let mut report =
            CheckReport::new(&self.inner.engine, path, short_hash(bytes), wasm, link_error, typed, compile);
        report.interpreter = interpreter::Interpreter::of(bytes);
        report
    }
}

/// The engine settings that compiled code depends on: the host's engine
/// adds its instance pool, and a compile worker uses exactly these, so what
/// it writes loads in the host.
pub(crate) fn engine_config() -> Config {
    let mut config = Config::new();
    config.epoch_interruption(true);
    config
}

/// The `hourglass:plugin` interfaces (not the world's wasi:http import,
/// which wasmtime-wasi-http provides).
fn add_plugin_imports(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    wit_types::add_to_linker::<HostState, HasSelf<HostState>>(linker, |s| s)?;
    wit_log::add_to_linker::<HostState, HasSelf<HostState>>(linker, |s| s)?;
    wit_schedule::add_to_linker::<HostState, HasSelf<HostState>>(linker, |s| s)?;
    wit_config::add_to_linker::<HostState, HasSelf<HostState>>(linker, |s| s)?;
    wit_workflow::add_to_linker::<HostState, HasSelf<HostState>>(linker, |s| s)?;
    wit_progress::add_to_linker::<HostState, HasSelf<HostState>>(linker, |s| s)?;
    Ok(())
}

/// Ticks the engine's epoch until the last [`Runtime`] clone is gone.
fn spawn_epoch_ticker(runtime: Weak<RuntimeInner>) -> Result<()> {
    std::thread::Builder::new()
        .name("hourglass-epoch".into())
        .spawn(move || {
            let mut next = Instant::now();
            loop {
                next += EPOCH_TICK;
                std::thread::sleep(next.saturating_duration_since(Instant::now()));
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
        [1, 0, 0, 0] => Some("not a WebAssembly component (is it a core module? build with --target wasm32-wasip2)"),
        [_, _, 1, 0] => None,
        _ => Some("not a WebAssembly component (unknown binary version)"),
    }
}

/// The short content hash that names a plugin version (first 12 hex digits of SHA-256).
pub fn short_hash(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))[..12].to_owned()
}

/// wasmtime has its own error type; keep its message chain when moving to anyhow.
fn wt(e: wasmtime::Error) -> anyhow::Error {
    anyhow::anyhow!("{}", one_line(&format!("{e:#}")))
}

/// Joins a multi-line error into one line.
pub(crate) fn one_line(text: &str) -> String {
    text.lines().map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join(" ")
}
