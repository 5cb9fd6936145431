//! `hourglass cron`, `every`, `schedules` and `unschedule`: recurring schedules kept in Redis.

use std::io::Write;
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;

use crate::clock::format_ms;
use crate::config::Config;
use crate::recurring::RecurringName;
use crate::store::Store;
use crate::task_type::TaskType;

/// `hourglass cron`.
#[derive(Debug, Args)]
pub struct CronArgs {
    /// The schedule's name (unique within its type; occurrences are `<name>@<due ms>`).
    pub name: crate::recurring::RecurringName,
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
    pub name: crate::recurring::RecurringName,
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

impl From<MissedArg> for crate::recurring::MissedPolicy {
    fn from(m: MissedArg) -> Self {
        match m {
            MissedArg::Latest => Self::Latest,
            MissedArg::All => Self::All,
            MissedArg::Skip => Self::Skip,
        }
    }
}

/// `hourglass cron`.
pub(super) async fn cron(config: &Config, redis_override: Option<&str>, args: CronArgs) -> Result<ExitCode> {
    let schedule = crate::recurring::RecurringConfig {
        task_type: args.task_type,
        cron: Some(args.expr),
        timezone: Some(args.timezone),
        every: None,
        payload: args.common.payload,
        missed: Some(args.common.missed.into()),
    };
    put_schedule(config, redis_override, &args.name, schedule).await
}

/// `hourglass every`.
pub(super) async fn every(config: &Config, redis_override: Option<&str>, args: EveryArgs) -> Result<ExitCode> {
    let schedule = crate::recurring::RecurringConfig {
        task_type: args.task_type,
        cron: None,
        timezone: None,
        every: Some(args.interval),
        payload: args.common.payload,
        missed: Some(args.common.missed.into()),
    };
    put_schedule(config, redis_override, &args.name, schedule).await
}

/// `hourglass schedules`.
pub(super) async fn list(store: &Store, json: bool) -> Result<ExitCode> {
    print_schedules(&crate::recurring::list(store).await?, json)?;
    Ok(ExitCode::SUCCESS)
}

/// `hourglass unschedule`.
pub(super) async fn unschedule(store: &Store, task_type: TaskType, name: RecurringName) -> Result<ExitCode> {
    if store.recur_remove(&task_type, name.as_str()).await? {
        println!("removed the recurring schedule {task_type}/{name}");
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!("error: there is no recurring schedule {task_type}/{name}");
        Ok(ExitCode::FAILURE)
    }
}

/// `hourglass cron` and `hourglass every`: validate, then put in Redis (made by the CLI).
async fn put_schedule(
    config: &Config,
    redis_override: Option<&str>,
    name: &RecurringName,
    schedule: crate::recurring::RecurringConfig,
) -> Result<ExitCode> {
    let mut definition = schedule.definition(name)?;
    definition.source = crate::recurring::Source::Cli;
    let store = super::connect(config, redis_override).await?;
    let changed = definition.put(&store).await?;
    let next = crate::recurring::list(&store)
        .await?
        .into_iter()
        .find(|s| s.task_type == definition.task_type.as_str() && s.name == name.as_str())
        .and_then(|s| s.next_ms);
    let verb = if changed { "scheduled" } else { "unchanged:" };
    let next = next.map(|ms| format!(", next at {}", format_ms(ms))).unwrap_or_default();
    println!("{verb} {}/{name} {}{next}", definition.task_type, definition.rule);
    Ok(ExitCode::SUCCESS)
}

fn print_schedules(schedules: &[crate::recurring::Listed], json: bool) -> Result<()> {
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
