//! Log output: human-readable lines, or JSON lines for log shippers.
//!
//! Levels come from `HOURGLASS_LOG` (or `RUST_LOG`), e.g. `info,hourglass=debug`.
//! Every line about a task carries `task_type`, `task_id` and `attempt`;
//! plugin lines (target `hourglass::plugin`) also carry `plugin` and `plugin_hash`.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// Ids and guest text in log lines: escaped where they are logged (`hourglass-task`).
pub use hourglass_task::clean::{Clean, clean_id, clean_id_cow};

/// `--log-format`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines (colours on a terminal).
    #[default]
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`, `message` and the fields.
    Json,
    /// JSON when stderr is not a terminal (a service manager, a container), text otherwise.
    Auto,
}

/// Installs the global subscriber writing to stderr.
pub fn init(format: LogFormat) {
    let filter =
        std::env::var("HOURGLASS_LOG").ok().or_else(|| std::env::var("RUST_LOG").ok()).unwrap_or_else(|| "info".into());
    let filter = EnvFilter::try_new(&filter).unwrap_or_else(|_| EnvFilter::new("info"));
    let terminal = std::io::stderr().is_terminal();
    let json = match format {
        LogFormat::Text => false,
        LogFormat::Json => true,
        LogFormat::Auto => !terminal,
    };
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    if json {
        builder.json().flatten_event(true).with_current_span(false).with_span_list(false).init();
    } else {
        builder.with_ansi(terminal && std::env::var_os("NO_COLOR").is_none()).init();
    }
}
