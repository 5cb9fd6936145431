//! `hourglass schedule`, `cancel` and `show`: one task at a time.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;

use super::{parse_at, parse_in};
use crate::clock::{format_ms, now_ms};
use crate::store::{ScheduleMode, Store};
use crate::task_type::TaskType;

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
    pub(super) fn mode(&self) -> ScheduleMode {
        match (self.if_absent, self.only_later, self.only_earlier) {
            (true, _, _) => ScheduleMode::IfAbsent,
            (_, true, _) => ScheduleMode::OnlyLater,
            (_, _, true) => ScheduleMode::OnlyEarlier,
            _ => ScheduleMode::Upsert,
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

/// `hourglass schedule`: payload and due time in one step, then `--wait-replicas`.
pub(super) async fn schedule(store: &Store, args: ScheduleArgs) -> Result<ExitCode> {
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
    wait_for_replicas(store, args.wait_replicas, args.wait_timeout, "the write", "it").await
}

/// `--wait-replicas`: waits until `wanted` replicas have this connection's writes (Redis WAIT), and
/// says how many did; exit 1 if fewer did within `timeout`. `what` and `it` name the writes.
pub(super) async fn wait_for_replicas(
    store: &Store,
    wanted: Option<u32>,
    timeout: Duration,
    what: &str,
    it: &str,
) -> Result<ExitCode> {
    if let Some(wanted) = wanted {
        let acked = store.wait_replicas(wanted, timeout).await?;
        if acked < wanted {
            eprintln!(
                "error: only {acked} of {wanted} replicas acknowledged {what} within {} (--wait-replicas)",
                humantime::format_duration(timeout)
            );
            return Ok(ExitCode::FAILURE);
        }
        println!("{acked} replica(s) acknowledged {it}");
    }
    Ok(ExitCode::SUCCESS)
}

/// `hourglass cancel`: removed when waiting; a running one waits (10 s at most) for its host to stop it.
pub(super) async fn cancel(store: &Store, task_type: TaskType, id: String) -> Result<ExitCode> {
    match store.cancel(&task_type, id.as_bytes()).await? {
        crate::store::CancelEffect::Scheduled => {
            println!("cancelled scheduled task {task_type}/{id}");
            Ok(ExitCode::SUCCESS)
        }
        crate::store::CancelEffect::Running { holder } => {
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
        crate::store::CancelEffect::Unknown => {
            eprintln!("error: {task_type}/{id} is neither scheduled nor running");
            Ok(ExitCode::FAILURE)
        }
    }
}

/// `hourglass show`.
pub(super) async fn show(store: &Store, args: ShowArgs) -> Result<ExitCode> {
    let id = args.id_hex.map_or_else(|| args.id.unwrap_or_default().into_bytes(), |h| h.0);
    crate::show::command(store, &args.task_type, &id, args.json).await
}
