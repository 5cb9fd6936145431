//! The `hourglass` binary: parse arguments, set up logging, run the command.

use std::process::ExitCode;

use hourglass::cli::{self, Cli};

/// jemalloc, not glibc's malloc: the host allocates and frees small buffers
/// per task on several threads, where glibc's malloc took about a fifth of
/// the host's CPU in `hourglass bench burst`; jemalloc kept idle and peak RSS
/// within a few MiB of it (BENCHMARKS.md, round 6).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    // A child the host started to compile one plugin under limits: no
    // logging, threads or config of its own (docs/sandbox.md).
    if let Some(code) = hourglass::runtime::compile_worker_if_asked() {
        return code;
    }
    let cli = Cli::parse_or_exit();
    hourglass::observe::logging::init(cli.log_format);
    // jemalloc returns freed memory to the system only when the arena that
    // freed it allocates again, so what compiling a plugin freed (hundreds of
    // MiB for an interpreter) stayed resident in an idle host. Its background
    // threads return it after `dirty_decay_ms` (10 s) whatever the host does.
    if let Err(e) = tikv_jemalloc_ctl::background_thread::write(true) {
        tracing::warn!("jemalloc's background purging is off ({e}): memory freed after a compile may stay resident");
    }
    let config = match cli.load_config() {
        Ok(config) => config,
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    // The host's own work (claims, settles, Redis) on `host_threads`;
    // handlers run on a runtime of their own (`worker_threads`).
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(config.runner.host_threads())
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(cli::execute(cli, config)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
