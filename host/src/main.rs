//! The `hourglass` binary: parse arguments, set up logging, run the command.

use std::process::ExitCode;

use hourglass::cli::{self, Cli};

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
