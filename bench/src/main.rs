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
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
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

/// `hourglass-bench compile-worker --out FILE`: the in-process hosts compile
/// plugins by running this binary as their compile worker (docs/sandbox.md).
#[derive(Debug, Parser)]
struct Worker {
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
}

fn main() -> ExitCode {
    if std::env::args_os().nth(1).is_some_and(|a| a == "compile-worker") {
        let worker = Worker::parse_from(std::env::args_os().skip(1));
        return hourglass::runtime::compile_worker(&worker.out);
    }
    let cli = Cli::parse();
    let args = cli.args;
    init_logging();
    let config = match &cli.config {
        Some(path) => hourglass::config::Config::load(path),
        None if PathBuf::from("runner.toml").exists() => hourglass::config::Config::load("runner.toml".as_ref()),
        None => Ok(hourglass::config::Config::default()),
    };
    let result = config.and_then(|config| {
        let url = cli.redis.clone().unwrap_or_else(|| config.redis.url.clone());
        tokio::runtime::Runtime::new()?.block_on(bench::run(args, config, url))
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
    let lines = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_filter(EnvFilter::try_new(&filter).unwrap_or_else(|_| EnvFilter::new("warn")));
    let tasks = recorder::TaskEvents.with_filter(
        tracing_subscriber::filter::Targets::new().with_target(recorder::TASK_EVENTS, tracing::Level::TRACE),
    );
    tracing_subscriber::registry().with(lines).with(tasks).init();
}
