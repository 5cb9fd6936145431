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
    let cli = Cli::parse_or_exit();
    hourglass::logging::init(cli.log_format);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(cli::execute(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
