//! A whole host: start-up wiring (Redis, sandbox, plugins, wake-ups, admin server, presence), signals, and the runner.

use std::path::PathBuf;

use anyhow::{Context, Result};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::config::{Config, ConfigFile, Overrides};
use crate::observe::health::Health;
use crate::pipeline::{self, Parts};
use crate::registry::Registry;
use crate::runtime::{Runtime, RuntimeOptions};
use crate::store::Store;
use crate::task_type::TaskType;

/// Runs a host until `shutdown` is cancelled, then drains gracefully (see
/// [`pipeline::run`]). `config_file`, when given, is watched and re-applied on change.
pub async fn run(
    config: Config,
    config_file: Option<ConfigFile>,
    store: Store,
    shutdown: CancellationToken,
) -> Result<()> {
    let largest_memory = std::iter::once(config.defaults.memory_limit)
        .chain(config.types.keys().map(|t| config.policy(t).memory_limit))
        .max()
        .unwrap_or_default();
    let runtime = Runtime::new(RuntimeOptions {
        cache_dir: Some(config.runner.cache_dir.clone()),
        max_instances: u32::try_from(config.runner.concurrency).unwrap_or(u32::MAX),
        max_memory: largest_memory.as_u64(),
        compiler: crate::runtime::Compiler::this_binary(),
        compile_limits: config.runner.compile_limits(),
        worker_threads: config.runner.worker_threads(),
    })
    .context("cannot start the Wasm runtime")?;
    for line in config.ineffective_keys() {
        warn!("{line}");
    }
    info!(reset = %runtime.memory_reset(), "instance memory reset: how a freed instance's pages are made as built for the next task");
    if runtime.memory_reset().method == crate::runtime::ResetMethod::Madvise && config.runner.worker_threads() > 1 {
        warn!(
            "this kernel lacks PAGEMAP_SCAN (Linux 6.7+): each fresh instance's memory is reset with madvise, which \
             interrupts every core the handler threads ran on; on 16 cores that measured 4x the host CPU per task \
             (BENCHMARKS.md, round 13): a kernel of 6.7 or later, or instance_reuse, avoids it"
        );
    }

    let registry = Registry::new(runtime.clone(), config.clone())?;
    // Many hosts share one Redis: each beats under its id and records it with its leases.
    let host_id = config.runner.host_id.clone().unwrap_or_else(crate::fleet::presence::default_host_id);
    let store = store.with_holder(&host_id).with_shards(config.sharded_types());
    if !store.target().is_cluster() {
        for (t, n) in config.sharded_types() {
            warn!(task_type = %t, shards = n, "shards on one Redis server: its shards share that server's one core, so they only add work (shards are for a Redis Cluster)");
        }
    }
    let traces = crate::observe::traces::start(&config.telemetry, &host_id)?;
    // Histograms buffer every sample until upkeep folds them into buckets:
    // it runs for as long as the host does (through the drain), admin server or not.
    let metrics_upkeep = tokio::spawn(crate::observe::telemetry::upkeep(CancellationToken::new()));
    let health = Health::default();
    // A failover: retries waiting out the outage go to the new master at once.
    let failovers = {
        let (health, mut changes) = (health.clone(), store.master_changes());
        tokio::spawn(async move {
            while changes.changed().await.is_ok() {
                health.master_changed();
            }
        })
    };
    if let Some(master) = store.master().filter(|m| m.sentinel) {
        info!(master = %master.addr, "Redis master found through Sentinel: {}", store.target().shown());
    }
    // The admin server comes first: /healthz answers and /readyz says
    // "loading plugins 3/8" while the first start compiles.
    let admin = crate::admin::start(&config, &store, &registry, &health, &shutdown).await?;
    let watcher = registry.watch(config_file, shutdown.clone())?;
    // Plugins load in the background, each type served as soon as its plugin is ready.
    let initial = {
        let registry = registry.clone();
        tokio::task::spawn_blocking(move || registry.reload())
    };
    let presence = crate::fleet::presence::Presence::start(&store, &host_id).await?;
    let (cancel_tx, cancels) = tokio::sync::mpsc::unbounded_channel();
    let wakeups = crate::fleet::wakeup::start(&store, config.runner.wakeup, cancel_tx, shutdown.clone()).await?;
    let announce = {
        let registry = registry.clone();
        let plugins = config.runner.plugins_dir.clone();
        tokio::spawn(async move {
            if initial.await.is_ok() {
                info!(
                    plugins = %plugins.display(),
                    types = ?registry.types().iter().map(TaskType::as_str).collect::<Vec<_>>(),
                    "hourglass is running"
                );
            }
        })
    };

    let schedules = {
        let registry = registry.clone();
        move || registry.config().schedules.clone()
    };
    let recurring =
        tokio::spawn(crate::recurring::run(store.clone(), schedules, registry.subscribe(), shutdown.clone()));

    let parts = Parts { store, registry, runtime, wakeups, health, cancels };
    pipeline::run(parts, shutdown).await;

    recurring.abort();
    failovers.abort();
    announce.abort();
    metrics_upkeep.abort();
    watcher.abort();
    admin.stop().await;
    presence.stop().await;
    if let Some(traces) = traces {
        traces.stop().await;
    }
    info!("stopped");
    Ok(())
}

/// `hourglass run`: resolve the Redis URL (starting a managed Redis if asked),
/// install signal handlers, and run until SIGINT/SIGTERM.
pub async fn run_from_cli(
    mut config: Config,
    target: crate::target::Target,
    overrides: Overrides,
    config_file: Option<PathBuf>,
) -> Result<()> {
    overrides.apply(&mut config)?;
    let config_file = config_file.map(|path| ConfigFile { path, overrides });
    let managed = match target.single_url() {
        Some(url) => crate::fleet::managed::ensure(&config.redis, url).await?,
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
