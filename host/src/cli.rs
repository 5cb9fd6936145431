//! The `hourglass` command line: argument parsing and one function per command.
//!
//! Long: the argument parser of every command and one short function per command; none shares code worth a module.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};

use crate::clock::{format_ms, now_ms};
use crate::config::Config;
use crate::store::{ScheduleMode, Store, TypeStats};
use crate::task_type::TaskType;

mod group;
pub use group::GroupCommand;

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
    pub log_format: crate::logging::LogFormat,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the host: claim due tasks and run their handlers until SIGINT/SIGTERM.
    Run(RunArgs),
    /// Schedule a task (or re-schedule it: the same id is an upsert).
    Schedule(ScheduleArgs),
    /// Add (or change) a recurring schedule by a cron expression, stored in Redis for every host.
    Cron(CronArgs),
    /// Add (or change) a recurring schedule by a fixed interval, stored in Redis for every host.
    Every(EveryArgs),
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
        name: crate::schedules::ScheduleName,
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
    /// Internal: compile the component on stdin into FILE under the limits the host set (docs/sandbox.md).
    #[command(hide = true)]
    CompileWorker(crate::runtime::WorkerArgs),
}

/// `hourglass run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Plugins folder; wins over `[runner] plugins_dir`.
    #[arg(long, value_name = "DIR")]
    pub plugins: Option<PathBuf>,
}

/// `hourglass schedule`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("when").required(true).args(["at", "in_"])))]
#[command(group(clap::ArgGroup::new("body").args(["payload", "payload_file"])))]
#[command(group(clap::ArgGroup::new("mode").args(["if_absent", "only_later", "only_earlier"])))]
pub struct ScheduleArgs {
    /// Task type.
    pub task_type: TaskType,
    /// Task id.
    pub id: String,
    /// Due time: RFC 3339 (`2026-11-22T07:00:00+01:00`) or ms since the Unix epoch.
    #[arg(long, value_parser = parse_at)]
    pub at: Option<i64>,
    /// Due in this long from now: `30s`, `5m`, `2h`, `1h 30m`.
    #[arg(long = "in", id = "in_", value_parser = parse_in)]
    pub in_: Option<Duration>,
    /// Payload text.
    #[arg(long)]
    pub payload: Option<String>,
    /// Read the payload from this file (any bytes).
    #[arg(long, value_name = "PATH")]
    pub payload_file: Option<PathBuf>,
    /// Keep the first schedule when the id is already scheduled (ZADD NX: dedupe).
    #[arg(long)]
    pub if_absent: bool,
    /// Only postpone an id already scheduled, never bring it forward (ZADD GT: debounce).
    #[arg(long)]
    pub only_later: bool,
    /// Only bring an id already scheduled forward, never postpone it (ZADD LT).
    #[arg(long)]
    pub only_earlier: bool,
    /// After writing, wait until this many replicas have it (Redis WAIT); exit 1 if fewer do in time.
    #[arg(long, value_name = "N")]
    pub wait_replicas: Option<u32>,
    /// How long --wait-replicas waits.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = parse_in, requires = "wait_replicas")]
    pub wait_timeout: Duration,
}

impl ScheduleArgs {
    fn mode(&self) -> ScheduleMode {
        match (self.if_absent, self.only_later, self.only_earlier) {
            (true, _, _) => ScheduleMode::IfAbsent,
            (_, true, _) => ScheduleMode::OnlyLater,
            (_, _, true) => ScheduleMode::OnlyEarlier,
            _ => ScheduleMode::Upsert,
        }
    }
}

/// `hourglass cron`.
#[derive(Debug, Args)]
pub struct CronArgs {
    /// The schedule's name (unique within its type; occurrences are `<name>@<due ms>`).
    pub name: crate::schedules::ScheduleName,
    /// Task type of its occurrences.
    pub task_type: TaskType,
    /// Cron expression: 5 fields (minute hour day-of-month month day-of-week), or 6 with seconds first.
    pub expr: String,
    /// IANA time zone the expression is read in.
    #[arg(long, default_value = "UTC")]
    pub timezone: String,
    #[command(flatten)]
    pub common: RecurArgs,
}

/// `hourglass every`.
#[derive(Debug, Args)]
pub struct EveryArgs {
    /// The schedule's name (unique within its type; occurrences are `<name>@<due ms>`).
    pub name: crate::schedules::ScheduleName,
    /// Task type of its occurrences.
    pub task_type: TaskType,
    /// The interval: `30s`, `15m`, `1h 30m` (at least 1s); the first occurrence is one interval from now.
    pub interval: String,
    #[command(flatten)]
    pub common: RecurArgs,
}

/// What `cron` and `every` share.
#[derive(Debug, Args)]
pub struct RecurArgs {
    /// Payload of every occurrence (text).
    #[arg(long)]
    pub payload: Option<String>,
    /// After a time with no host running: run the latest missed occurrence once, all of them, or none.
    #[arg(long, value_enum, default_value = "latest")]
    pub missed: MissedArg,
}

/// `--missed`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum MissedArg {
    /// Run the latest missed occurrence once, skip the rest.
    Latest,
    /// Run every missed occurrence (at most 1000).
    All,
    /// Run none (one at most a minute late still runs).
    Skip,
}

impl From<MissedArg> for crate::schedules::MissedPolicy {
    fn from(m: MissedArg) -> Self {
        match m {
            MissedArg::Latest => Self::Latest,
            MissedArg::All => Self::All,
            MissedArg::Skip => Self::Skip,
        }
    }
}

/// `hourglass show`.
#[derive(Debug, Args)]
pub struct ShowArgs {
    /// Task type.
    pub task_type: TaskType,
    /// Task id.
    #[arg(required_unless_present = "id_hex", conflicts_with = "id_hex")]
    pub id: Option<String>,
    /// The task id as hex, for ids that are not text.
    #[arg(long, value_name = "HEX", value_parser = parse_hex)]
    pub id_hex: Option<HexId>,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// An id given as hex (`--id-hex`).
#[derive(Debug, Clone)]
pub struct HexId(pub Vec<u8>);

fn parse_hex(s: &str) -> Result<HexId, String> {
    match hex::decode(s) {
        Ok(id) if !id.is_empty() => Ok(HexId(id)),
        Ok(_) => Err("an id is at least one byte".into()),
        Err(e) => Err(format!("not hex: {e}")),
    }
}

/// `hourglass dead ...`.
#[derive(Debug, Subcommand)]
pub enum DeadCommand {
    /// List dead tasks with their time of death and last error.
    List {
        /// Task type.
        task_type: TaskType,
        /// Most tasks to show.
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Make dead tasks due now again, attempts reset [default: all of the type].
    Requeue {
        /// Task type.
        task_type: TaskType,
        /// Only these ids.
        ids: Vec<String>,
    },
    /// Delete dead tasks for good [default: all of the type].
    Purge {
        /// Task type.
        task_type: TaskType,
        /// Only these ids.
        ids: Vec<String>,
    },
}

/// `hourglass plugin ...`.
#[derive(Debug, Subcommand)]
pub enum PluginCommand {
    /// Print the world a `.wasm` implements, its imports, and whether it fits Hourglass.
    Check {
        /// The component file.
        file: PathBuf,
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
        match &self.config {
            Some(path) => Some(path.clone()),
            None => Some(PathBuf::from("runner.toml")).filter(|p| p.exists()),
        }
    }

    /// The config: from [`Cli::config_path`], else built-in defaults.
    pub fn load_config(&self) -> Result<Config> {
        match self.config_path() {
            Some(path) => Config::load(&path),
            None => Ok(Config::default()),
        }
    }

    /// The output file when this process is a compile worker (`hourglass
    /// compile-worker`): it runs before logging, the async runtime and config.
    pub fn compile_worker(&self) -> Option<&crate::runtime::WorkerArgs> {
        match &self.command {
            Command::CompileWorker(args) => Some(args),
            _ => None,
        }
    }
}

/// Runs the parsed command with its config ([`Cli::load_config`]); returns the process exit code.
pub async fn execute(cli: Cli, config: Config) -> Result<ExitCode> {
    let redis_override = cli.redis.clone();
    let config_path = cli.config_path();
    match cli.command {
        Command::Run(args) => {
            let target = crate::target::Target::resolve(&config.redis, redis_override.as_deref())?;
            crate::host::run_from_cli(config, target, args.plugins, config_path).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Plugin(PluginCommand::Check { file }) => plugin_check(&config, &file),
        // main.rs runs the worker before any of this; here for completeness.
        Command::CompileWorker(args) => Ok(crate::runtime::compile_worker(&args)),
        Command::Bench { args } => Err(run_bench(config_path.as_deref(), redis_override.as_deref(), &args)),
        Command::Schedule(args) => {
            let payload = match (&args.payload, &args.payload_file) {
                (Some(text), _) => Some(text.clone().into_bytes()),
                (None, Some(path)) => {
                    Some(std::fs::read(path).with_context(|| format!("cannot read payload file {}", path.display()))?)
                }
                (None, None) => None,
            };
            let due_ms = match (args.at, args.in_) {
                (Some(at), _) => at,
                (None, Some(after)) => now_ms().saturating_add(after.as_millis() as i64),
                (None, None) => unreachable!("clap requires --at or --in"),
            };
            let store = connect(&config, redis_override.as_deref()).await?;
            let mode = args.mode();
            let written = store.schedule(&args.task_type, args.id.as_bytes(), due_ms, payload.as_deref(), mode).await?;
            if written {
                println!("scheduled {}/{} at {} ({} ms)", args.task_type, args.id, format_ms(due_ms), due_ms);
            } else {
                let why = match mode {
                    ScheduleMode::IfAbsent => "it is already scheduled (--if-absent)",
                    ScheduleMode::OnlyLater => "it is already scheduled at the same time or later (--only-later)",
                    _ => "it is already scheduled at the same time or sooner (--only-earlier)",
                };
                println!("kept {}/{} as it was: {why}", args.task_type, args.id);
            }
            if let Some(wanted) = args.wait_replicas {
                let acked = store.wait_replicas(wanted, args.wait_timeout).await?;
                if acked < wanted {
                    eprintln!(
                        "error: only {acked} of {wanted} replicas acknowledged the write within {} (--wait-replicas)",
                        humantime::format_duration(args.wait_timeout)
                    );
                    return Ok(ExitCode::FAILURE);
                }
                println!("{acked} replica(s) acknowledged it");
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Cron(args) => {
            let schedule = crate::schedules::ScheduleConfig {
                task_type: args.task_type,
                cron: Some(args.expr),
                timezone: Some(args.timezone),
                every: None,
                payload: args.common.payload,
                missed: Some(args.common.missed.into()),
            };
            put_schedule(&config, redis_override.as_deref(), &args.name, schedule).await
        }
        Command::Every(args) => {
            let schedule = crate::schedules::ScheduleConfig {
                task_type: args.task_type,
                cron: None,
                timezone: None,
                every: Some(args.interval),
                payload: args.common.payload,
                missed: Some(args.common.missed.into()),
            };
            put_schedule(&config, redis_override.as_deref(), &args.name, schedule).await
        }
        Command::Schedules { json } => {
            let store = connect(&config, redis_override.as_deref()).await?;
            print_schedules(&crate::schedules::list(&store).await?, json)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Unschedule { task_type, name } => {
            let store = connect(&config, redis_override.as_deref()).await?;
            if store.recur_remove(&task_type, name.as_str()).await? {
                println!("removed the recurring schedule {task_type}/{name}");
                Ok(ExitCode::SUCCESS)
            } else {
                eprintln!("error: there is no recurring schedule {task_type}/{name}");
                Ok(ExitCode::FAILURE)
            }
        }
        Command::Pause { task_type, for_ } => {
            let store = connect(&config, redis_override.as_deref()).await?;
            match store.pause(&task_type, for_).await? {
                Some(ends) => {
                    println!("paused {task_type} on every host until {} (then it resumes by itself)", format_ms(ends))
                }
                None => println!("paused {task_type} on every host until 'hourglass resume {task_type}'"),
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Resume { task_type } => {
            let store = connect(&config, redis_override.as_deref()).await?;
            if store.resume(&task_type).await? {
                println!("resumed {task_type}");
                Ok(ExitCode::SUCCESS)
            } else {
                eprintln!("error: {task_type} is not paused");
                Ok(ExitCode::FAILURE)
            }
        }
        Command::Group(cmd) => {
            let store = connect(&config, redis_override.as_deref()).await?;
            group::run(&store, cmd).await
        }
        Command::Cancel { task_type, id } => {
            let store = connect(&config, redis_override.as_deref()).await?;
            match store.cancel(&task_type, id.as_bytes()).await? {
                crate::store::Cancelled::Scheduled => {
                    println!("cancelled scheduled task {task_type}/{id}");
                    Ok(ExitCode::SUCCESS)
                }
                crate::store::Cancelled::Running { holder } => {
                    let holder = if holder.is_empty() { "its host".to_owned() } else { format!("host {holder}") };
                    // The holder settles it within moments; say so once it has.
                    let deadline = std::time::Instant::now() + Duration::from_secs(10);
                    let mut stopped = false;
                    while std::time::Instant::now() < deadline {
                        if !store.leased(&task_type, id.as_bytes()).await? {
                            stopped = true;
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    if stopped {
                        println!(
                            "cancelled running task {task_type}/{id}: {holder} stopped its handler (outcome cancelled, not retried)"
                        );
                    } else {
                        println!(
                            "asked {holder} to stop running task {task_type}/{id}: it has not yet; it will at its next lease renewal, \
                             and the task is not retried"
                        );
                    }
                    Ok(ExitCode::SUCCESS)
                }
                crate::store::Cancelled::Unknown => {
                    eprintln!("error: {task_type}/{id} is neither scheduled nor running");
                    Ok(ExitCode::FAILURE)
                }
            }
        }
        Command::Stats { task_type, json, hosts: true, .. } => {
            let store = connect(&config, redis_override.as_deref()).await?;
            let types = match task_type {
                Some(t) => vec![t],
                None => store.known_types().await?,
            };
            print_hosts(&crate::hosts::list(&store, &types).await?, json)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Stats { task_type, json, hosts: false, watch } => {
            let store = connect(&config, redis_override.as_deref()).await?;
            // One listener for the whole watch, so a Ctrl-C during a redraw is not missed.
            let mut interrupted = std::pin::pin!(tokio::signal::ctrl_c());
            loop {
                let types = match &task_type {
                    Some(t) => vec![t.clone()],
                    None => store.known_types().await?,
                };
                let mut rows = Vec::with_capacity(types.len());
                for t in types {
                    let stats = store.stats(&t).await?;
                    rows.push((t, stats));
                }
                if watch {
                    // Clear the screen and redraw from the top left.
                    print!("\x1b[2J\x1b[H");
                    println!("hourglass stats at {} (every 1s; Ctrl-C to stop)\n", format_ms(now_ms()));
                }
                print_stats(&rows, json)?;
                if !json && !rows.is_empty() {
                    let types: Vec<TaskType> = rows.into_iter().map(|(t, _)| t).collect();
                    let hosts = crate::hosts::list(&store, &types).await?;
                    if !hosts.is_empty() {
                        println!();
                        print_hosts(&hosts, false)?;
                    }
                }
                if !watch {
                    break;
                }
                std::io::stdout().flush()?;
                tokio::select! {
                    _ = &mut interrupted => break,
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Show(args) => {
            let store = connect(&config, redis_override.as_deref()).await?;
            let id = args.id_hex.map_or_else(|| args.id.unwrap_or_default().into_bytes(), |h| h.0);
            crate::show::command(&store, &args.task_type, &id, args.json).await
        }
        Command::Dead(cmd) => {
            let store = connect(&config, redis_override.as_deref()).await?;
            dead(&store, cmd).await?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Connects to `[redis]` (one server or a cluster), `--redis` / `HOURGLASS_REDIS_URL` winning.
async fn connect(config: &Config, redis_override: Option<&str>) -> Result<Store> {
    let target = crate::target::Target::resolve(&config.redis, redis_override)?;
    Ok(Store::connect_to(&target, &config.redis.prefix).await?.with_shards(config))
}

/// `hourglass cron` and `hourglass every`: validate, then put in Redis (made by the CLI).
async fn put_schedule(
    config: &Config,
    redis_override: Option<&str>,
    name: &crate::schedules::ScheduleName,
    schedule: crate::schedules::ScheduleConfig,
) -> Result<ExitCode> {
    let mut definition = schedule.definition(name)?;
    definition.source = crate::schedules::Source::Cli;
    let store = connect(config, redis_override).await?;
    let changed = definition.put(&store).await?;
    let next = crate::schedules::list(&store)
        .await?
        .into_iter()
        .find(|s| s.task_type == definition.task_type.as_str() && s.name == name.as_str())
        .and_then(|s| s.next_ms);
    let verb = if changed { "scheduled" } else { "unchanged:" };
    let next = next.map(|ms| format!(", next at {}", format_ms(ms))).unwrap_or_default();
    println!("{verb} {}/{name} {}{next}", definition.task_type, definition.rule);
    Ok(ExitCode::SUCCESS)
}

fn print_schedules(schedules: &[crate::schedules::Listed], json: bool) -> Result<()> {
    let mut out = std::io::stdout().lock();
    if json {
        serde_json::to_writer_pretty(&mut out, schedules)?;
        writeln!(out)?;
        return Ok(());
    }
    if schedules.is_empty() {
        writeln!(out, "no recurring schedules in Redis")?;
        return Ok(());
    }
    writeln!(out, "{:<20} {:<24} {:<40} {:<26} {:<7} MISSED", "TYPE", "NAME", "RULE", "NEXT", "SOURCE")?;
    for s in schedules {
        let next = match (s.next_ms, s.armed_due) {
            (Some(ms), true) => format_ms(ms),
            (Some(_), false) => "running; next soon".to_owned(),
            (None, _) => "-".to_owned(),
        };
        writeln!(out, "{:<20} {:<24} {:<40} {:<26} {:<7} {}", s.task_type, s.name, s.rule, next, s.source, s.missed)?;
    }
    Ok(())
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

fn plugin_check(config: &Config, file: &Path) -> Result<ExitCode> {
    let runtime = crate::runtime::Runtime::new(crate::runtime::RuntimeOptions {
        cache_dir: Some(config.runner.cache_dir.clone()),
        compiler: crate::runtime::Compiler::this_binary(),
        compile_limits: crate::runtime::CompileLimits::from(&config.runner),
        ..Default::default()
    })?;
    let report = runtime.check(file)?;
    print!("{report}");
    Ok(if report.fits() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

async fn dead(store: &Store, cmd: DeadCommand) -> Result<()> {
    let bytes = |ids: Vec<String>| -> Option<Vec<Vec<u8>>> {
        (!ids.is_empty()).then(|| ids.into_iter().map(String::into_bytes).collect())
    };
    match cmd {
        DeadCommand::List { task_type, limit, json } => {
            let dead = store.dead_list(&task_type, limit).await?;
            let mut out = std::io::stdout().lock();
            if json {
                serde_json::to_writer_pretty(&mut out, &dead)?;
                writeln!(out)?;
            } else if dead.is_empty() {
                writeln!(out, "no dead tasks of type {task_type}")?;
            } else {
                for d in &dead {
                    writeln!(
                        out,
                        "{}  died {}  attempts {}  {}",
                        String::from_utf8_lossy(&d.id),
                        format_ms(d.died_ms),
                        d.attempts,
                        d.error
                    )?;
                }
            }
        }
        DeadCommand::Requeue { task_type, ids } => {
            let n = store.dead_requeue(&task_type, bytes(ids).as_deref()).await?;
            println!("re-queued {n} dead task(s) of type {task_type}");
        }
        DeadCommand::Purge { task_type, ids } => {
            let n = store.dead_purge(&task_type, bytes(ids).as_deref()).await?;
            println!("purged {n} dead task(s) of type {task_type}");
        }
    }
    Ok(())
}

fn print_stats(rows: &[(TaskType, TypeStats)], json: bool) -> Result<()> {
    let mut out = std::io::stdout().lock();
    if json {
        let map: serde_json::Map<String, serde_json::Value> =
            rows.iter().map(|(t, s)| Ok((t.to_string(), serde_json::to_value(s)?))).collect::<Result<_>>()?;
        serde_json::to_writer_pretty(&mut out, &map)?;
        writeln!(out)?;
        return Ok(());
    }
    if rows.is_empty() {
        writeln!(out, "no task types found in Redis")?;
        return Ok(());
    }
    writeln!(
        out,
        "{:<24} {:>9} {:>9} {:>9} {:>7} {:>10} {:>8} {:>8} {:>6}",
        "TYPE", "DUE-NOW", "LATER", "IN-FLIGHT", "DEAD", "SUCCEEDED", "FAILED", "RETRIED", "DIED"
    )?;
    for (t, s) in rows {
        writeln!(
            out,
            "{:<24} {:>9} {:>9} {:>9} {:>7} {:>10} {:>8} {:>8} {:>6}",
            t.as_str(),
            s.due_now,
            s.scheduled_later,
            s.in_flight,
            s.dead,
            s.succeeded,
            s.failed,
            s.retried,
            s.dead_total
        )?;
    }
    for (t, s) in rows.iter().filter(|(_, s)| s.groups_open + s.groups_completed > 0) {
        writeln!(
            out,
            "GROUPS {t}: {} open, {} completed ({} without their callback); hourglass group show {t} <group>",
            s.groups_open, s.groups_completed, s.groups_failed
        )?;
    }
    for (t, s) in rows {
        match s.paused {
            Some(crate::store::Paused::UntilResumed) => {
                writeln!(out, "PAUSED {t}: until resumed ({} due now wait)", s.due_now)?
            }
            Some(crate::store::Paused::For(ms)) => writeln!(
                out,
                "PAUSED {t}: for {} more ({} due now wait)",
                humantime::format_duration(Duration::from_millis(ms as u64)),
                s.due_now
            )?,
            None => {}
        }
        if let Some(fault) = &s.fault {
            writeln!(out, "FAULTED {t}: {fault}")?;
        }
    }
    Ok(())
}

fn print_hosts(hosts: &[crate::hosts::HostInfo], json: bool) -> Result<()> {
    let mut out = std::io::stdout().lock();
    if json {
        serde_json::to_writer_pretty(&mut out, hosts)?;
        writeln!(out)?;
        return Ok(());
    }
    if hosts.is_empty() {
        writeln!(out, "no hosts registered in Redis")?;
        return Ok(());
    }
    writeln!(out, "{:<32} {:<8} {:>10}  HOLDS", "HOST", "STATE", "LAST-SEEN")?;
    for h in hosts {
        let seen =
            if h.last_seen_ms == 0 { "-".to_owned() } else { format!("{:.1}s ago", h.silent_ms as f64 / 1000.0) };
        let holds: Vec<String> = h.holds.iter().map(|(t, held)| format!("{t}: {}", held.count)).collect();
        let holds = if holds.is_empty() { "-".to_owned() } else { holds.join(", ") };
        let id = if h.id.is_empty() { "(no host id)" } else { h.id.as_str() };
        writeln!(out, "{id:<32} {:<8} {seen:>10}  {holds}", h.state.to_string())?;
    }
    Ok(())
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
