//! The `hourglass` command line: the parser, and the dispatch to one module per command group.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;
use clap::{Args, Parser, Subcommand};

use crate::config::Config;
use crate::store::Store;
use crate::task_type::TaskType;

mod bulk;
mod plugin;
mod queues;
mod recurring;
mod tasks;
mod workflow;

pub use bulk::ScheduleManyArgs;
pub use queues::DeadCommand;
pub use recurring::{CronArgs, EveryArgs, MissedArg, RecurArgs};
pub use tasks::{HexId, ScheduleArgs, ShowArgs};
pub use workflow::{GraphCommand, GroupCommand};

/// Run delayed tasks from Redis in sandboxed WebAssembly handlers.
#[derive(Debug, Parser)]
#[command(name = "hourglass", version, about, propagate_version = true)]
pub struct Cli {
    /// Config file [default: runner.toml when it exists, else built-in defaults].
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Redis URL; wins over `[redis] url` in the config file.
    #[arg(long, global = true, value_name = "URL", env = "HOURGLASS_REDIS_URL")]
    pub redis: Option<String>,
    /// Log lines: `text` (for people), `json` (one object per line), `auto` (JSON when stderr is not a terminal).
    #[arg(long, global = true, value_enum, value_name = "FORMAT", default_value_t, env = "HOURGLASS_LOG_FORMAT")]
    pub log_format: crate::observe::logging::LogFormat,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the host: claim due tasks and run their handlers until SIGINT/SIGTERM.
    Run(RunArgs),
    /// The commands that work on the store alone (listed among these).
    #[command(flatten)]
    Store(StoreCommand),
    /// Add (or change) a recurring schedule by a cron expression, stored in Redis for every host.
    Cron(CronArgs),
    /// Add (or change) a recurring schedule by a fixed interval, stored in Redis for every host.
    Every(EveryArgs),
    /// Inspect plugins.
    #[command(subcommand)]
    Plugin(PluginCommand),
    /// Measure throughput, lateness, footprint and reload time on the `noop` plugin: runs `hourglass-bench` (see BENCHMARKS.md).
    #[command(disable_help_flag = true)]
    Bench {
        /// The benchmark's arguments (`hourglass bench --help` lists them).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0.., value_name = "ARGS")]
        args: Vec<std::ffi::OsString>,
    },
}

/// The subcommands that need only a connected store.
#[derive(Debug, Subcommand)]
pub enum StoreCommand {
    /// Schedule a task (or re-schedule it: the same id is an upsert).
    Schedule(ScheduleArgs),
    /// Schedule many tasks from a JSON Lines file (one task a line), in batches; every line is checked before the first write.
    ScheduleMany(ScheduleManyArgs),
    /// List the recurring schedules with their next fire times.
    Schedules {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Remove a recurring schedule (its armed occurrence too).
    Unschedule {
        /// Task type of its occurrences.
        task_type: TaskType,
        /// Its name.
        name: crate::recurring::RecurringName,
    },
    /// Pause a type on every host: nothing of it is claimed (schedules keep arriving; running tasks finish).
    Pause {
        /// Task type.
        task_type: TaskType,
        /// End the pause by itself after this long (`10m`, `1h`) [default: until `hourglass resume`].
        #[arg(long = "for", value_name = "DURATION", value_parser = parse_in)]
        for_: Option<Duration>,
    },
    /// Resume a paused type.
    Resume {
        /// Task type.
        task_type: TaskType,
    },
    /// Cancel a task: remove it when scheduled; stop its handler when it is running (on any host).
    Cancel {
        /// Task type.
        task_type: TaskType,
        /// Task id.
        id: String,
    },
    /// Show per type: due now, scheduled later, in flight, dead, and counters; then the hosts.
    Stats {
        /// Only this type [default: every type found in Redis].
        task_type: Option<TaskType>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// Only the hosts: alive, stopped or gone, and the leases each holds.
        #[arg(long)]
        hosts: bool,
        /// Redraw the view every second until Ctrl-C.
        #[arg(long, conflicts_with_all = ["json", "hosts"])]
        watch: bool,
    },
    /// Show where one task is: scheduled, due, running, dead or unknown (exit 1), with its attempts, last error and payload.
    Show(ShowArgs),
    /// List, re-queue or purge dead-lettered tasks.
    #[command(subcommand)]
    Dead(DeadCommand),
    /// Workflow groups: open one with a callback, add children, seal it, show it (docs/workflows.md).
    #[command(subcommand)]
    Group(GroupCommand),
    /// Workflow graphs: declare tasks and the tasks each waits for, in one step; show one (docs/workflows.md).
    #[command(subcommand)]
    Graph(GraphCommand),
}

/// `hourglass run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Plugins folder; wins over `[runner] plugins_dir`.
    #[arg(long, value_name = "DIR")]
    pub plugins: Option<PathBuf>,
    /// Serve the admin server on this address (and turn it on); wins over `[admin] listen`. Several hosts
    /// on one machine need one port each (docs/operations.md, "Several hosts on one server").
    #[arg(long, value_name = "ADDR", env = "HOURGLASS_ADMIN_LISTEN")]
    pub admin_listen: Option<std::net::SocketAddr>,
}

/// `hourglass plugin ...`.
#[derive(Debug, Subcommand)]
pub enum PluginCommand {
    /// Print the world a `.wasm` implements, its imports, whether it fits Hourglass, and what a run costs.
    Check {
        /// The component file.
        file: PathBuf,
        /// The payload of the runs the cost is measured with (the type's policy is the config's, by the file name).
        #[arg(long, default_value = "")]
        payload: String,
    },
}

/// Parses `--at`: RFC 3339 with an offset, or integer ms since the epoch.
fn parse_at(s: &str) -> Result<i64, String> {
    if let Ok(ms) = s.parse::<i64>() {
        return if ms >= 0 { Ok(ms) } else { Err("must not be negative".into()) };
    }
    s.parse::<jiff::Timestamp>()
        .map(|t| t.as_millisecond())
        .map_err(|e| format!("not an RFC 3339 time (like 2026-11-22T07:00:00Z) or ms: {e}"))
}

/// Parses `--in`: a human duration like `30s` or `1h 30m`.
fn parse_in(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("not a duration (like 30s, 5m, 2h): {e}"))
}

impl Cli {
    /// Parses arguments; a usage error is printed as one line and exits 2.
    pub fn parse_or_exit() -> Cli {
        match Cli::try_parse() {
            Ok(cli) => cli,
            Err(e) if !e.use_stderr() => e.exit(), // --help, --version
            Err(e) => {
                // clap's first paragraph names the culprit; fold it onto one line.
                let rendered = e.render().to_string();
                let first: Vec<&str> = rendered.lines().take_while(|l| !l.trim().is_empty()).map(str::trim).collect();
                eprintln!("{} (see 'hourglass --help')", first.join(" "));
                std::process::exit(2);
            }
        }
    }

    /// The config file in use: `--config`, else `./runner.toml` when present.
    pub fn config_path(&self) -> Option<PathBuf> {
        Config::find(self.config.as_deref())
    }

    /// The config: from [`Cli::config_path`], else built-in defaults.
    pub fn load_config(&self) -> Result<Config> {
        Config::load_or_default(self.config.as_deref())
    }
}

/// Runs the parsed command with its config ([`Cli::load_config`]); returns the process exit code.
pub async fn execute(cli: Cli, config: Config) -> Result<ExitCode> {
    let redis_override = cli.redis.clone();
    let config_path = cli.config_path();
    match cli.command {
        Command::Run(args) => {
            let target = crate::target::Target::resolve(&config.redis, redis_override.as_deref())?;
            let overrides = crate::config::Overrides {
                plugins_dir: args.plugins,
                admin_listen: args.admin_listen,
                redis_url: redis_override.clone(),
            };
            crate::host::run_from_cli(config, target, overrides, config_path).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Plugin(PluginCommand::Check { file, payload }) => plugin::check(&config, &file, &payload).await,
        Command::Bench { args } => Err(run_bench(config_path.as_deref(), redis_override.as_deref(), &args)),
        Command::Cron(args) => recurring::cron(&config, redis_override.as_deref(), args).await,
        Command::Every(args) => recurring::every(&config, redis_override.as_deref(), args).await,
        Command::Store(command) => {
            let store = connect(&config, redis_override.as_deref()).await?;
            match command {
                StoreCommand::Schedule(args) => tasks::schedule(&store, args).await,
                StoreCommand::ScheduleMany(args) => bulk::schedule_many(&store, args).await,
                StoreCommand::Cancel { task_type, id } => tasks::cancel(&store, task_type, id).await,
                StoreCommand::Show(args) => tasks::show(&store, args).await,
                StoreCommand::Schedules { json } => recurring::list(&store, json).await,
                StoreCommand::Unschedule { task_type, name } => recurring::unschedule(&store, task_type, name).await,
                StoreCommand::Pause { task_type, for_ } => queues::pause(&store, task_type, for_).await,
                StoreCommand::Resume { task_type } => queues::resume(&store, task_type).await,
                StoreCommand::Stats { task_type, json, hosts: true, .. } => {
                    queues::hosts(&store, task_type, json).await
                }
                StoreCommand::Stats { task_type, json, watch, .. } => {
                    queues::stats(&store, task_type, json, watch).await
                }
                StoreCommand::Dead(cmd) => queues::dead(&store, cmd).await,
                StoreCommand::Group(cmd) => workflow::group::run(&store, cmd).await,
                StoreCommand::Graph(cmd) => workflow::graph::run(&store, cmd).await,
            }
        }
    }
}

/// Connects to `[redis]` (one server or a cluster), `--redis` / `HOURGLASS_REDIS_URL` winning.
async fn connect(config: &Config, redis_override: Option<&str>) -> Result<Store> {
    let target = crate::target::Target::resolve(&config.redis, redis_override)?;
    Ok(Store::connect_to(&target, &config.redis.prefix).await?.with_shards(config.sharded_types()))
}

/// `hourglass bench ...`: replaces this process with `hourglass-bench`
/// (beside this binary, else on PATH), passing the config file and Redis URL
/// this command was given. Returns only when that fails.
fn run_bench(config: Option<&Path>, redis: Option<&str>, args: &[std::ffi::OsString]) -> anyhow::Error {
    use std::os::unix::process::CommandExt;
    let beside = std::env::current_exe().ok().and_then(|exe| Some(exe.parent()?.join("hourglass-bench")));
    let program = beside.filter(|p| p.is_file()).unwrap_or_else(|| PathBuf::from("hourglass-bench"));
    let mut command = std::process::Command::new(&program);
    if let Some(config) = config {
        command.arg("--config").arg(config);
    }
    if let Some(url) = redis {
        command.arg("--redis").arg(url);
    }
    let err = command.args(args).exec();
    anyhow::anyhow!(
        "cannot run {}: {err} (the benchmark is a binary of its own: `cargo build --release -p hourglass-bench` \
         puts it beside hourglass)",
        program.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_accepts_rfc3339_and_ms() {
        assert_eq!(parse_at("1700000000000").unwrap(), 1_700_000_000_000);
        assert_eq!(parse_at("2023-11-14T22:13:20Z").unwrap(), 1_700_000_000_000);
        assert_eq!(parse_at("2023-11-14T23:13:20+01:00").unwrap(), 1_700_000_000_000);
        assert!(parse_at("tomorrow").unwrap_err().contains("RFC 3339"));
        assert!(parse_at("-5").is_err());
    }

    #[test]
    fn in_accepts_human_durations() {
        assert_eq!(parse_in("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_in("1h 30m").unwrap(), Duration::from_secs(5400));
        assert!(parse_in("soon").unwrap_err().contains("not a duration"));
    }

    #[test]
    fn schedule_needs_a_time() {
        let err = Cli::try_parse_from(["hourglass", "schedule", "a", "1"]).unwrap_err();
        assert!(err.to_string().contains("--at"), "{err}");
        let err = Cli::try_parse_from(["hourglass", "schedule", "Bad", "1", "--in", "1s"]);
        assert!(err.unwrap_err().to_string().contains("invalid task type"));
    }
}
