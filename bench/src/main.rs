//! `hourglass-bench` (also run as `hourglass bench`): parse arguments, set up logging, run the scenarios.
//!
//! # Layout
//!
//! - [`bench`]: the scenarios and their reports.
//! - [`recorder`]: what each task did, from the hosts' own task events.
//! - [`redis_ops`]: the benchmark's load and what the servers did.

mod bench;
mod recorder;
mod redis_ops;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::{EnvFilter, Layer};

/// The allocator of the host it measures (see the host's main.rs).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Measure Hourglass: throughput, lateness, footprint and reload time on the `noop` plugin.
#[derive(Debug, Parser)]
#[command(name = "hourglass bench", version)]
struct Cli {
    /// Config file whose `[runner]` and `[defaults]` the host under test uses [default: runner.toml when it exists].
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Redis URL (unless --spawn-redis or --spawn-cluster); wins over `[redis] url`.
    #[arg(long, global = true, value_name = "URL", env = "HOURGLASS_REDIS_URL")]
    redis: Option<String>,
    #[command(flatten)]
    args: bench::BenchArgs,
}

fn main() -> ExitCode {
    // The in-process hosts compile plugins by running this binary as their
    // compile worker (docs/sandbox.md).
    if let Some(code) = hourglass::runtime::compile_worker_if_asked() {
        return code;
    }
    let cli = Cli::parse();
    let args = cli.args;
    init_logging();
    let config = hourglass::config::Config::load_or_default(cli.config.as_deref());
    let result = config.and_then(|config| {
        let url = cli.redis.clone().unwrap_or_else(|| config.redis.url.clone());
        // The hosts run on this runtime, as `hourglass run`'s do on theirs.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(bench::host_threads(&args, &config))
            .enable_all()
            .build()?;
        runtime.block_on(bench::run(args, config, url))
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Log lines by `HOURGLASS_LOG` (default `warn`), and every task event to the recorder.
fn init_logging() {
    let filter = std::env::var("HOURGLASS_LOG").unwrap_or_else(|_| "warn".into());
    let filter = EnvFilter::try_new(&filter).unwrap_or_else(|_| EnvFilter::new("warn"));
    let lines_level = filter.max_level_hint();
    let lines = tracing_subscriber::fmt::layer().with_writer(std::io::stderr).with_filter(filter);
    let tasks = recorder::TaskEvents.with_filter(
        tracing_subscriber::filter::Targets::new().with_target(recorder::TASK_EVENTS, tracing::Level::TRACE),
    );
    // Not `.init()`: it would let the `log` records of every crate through
    // at the most verbose level any layer listens to, which is trace (the
    // task events), and wasmtime writes trace records on every
    // instantiation: the bench would charge their filtering to each task,
    // which a host logging at `info` does not pay. `log` records get the
    // line filter's level instead.
    let log_level = match lines_level {
        Some(level) if level >= LevelFilter::TRACE => tracing_log::log::LevelFilter::Trace,
        Some(level) if level >= LevelFilter::DEBUG => tracing_log::log::LevelFilter::Debug,
        Some(level) if level >= LevelFilter::INFO => tracing_log::log::LevelFilter::Info,
        Some(level) if level >= LevelFilter::WARN => tracing_log::log::LevelFilter::Warn,
        _ => tracing_log::log::LevelFilter::Error,
    };
    let subscriber = tracing_subscriber::registry().with(lines).with(tasks);
    tracing::subscriber::set_global_default(subscriber).expect("logging is set up once");
    if let Err(e) = tracing_log::LogTracer::builder().with_max_level(log_level).init() {
        eprintln!("warning: log records of dependencies are not shown: {e}");
    }
}
