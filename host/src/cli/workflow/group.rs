//! `hourglass group`: open a workflow group, add children, seal it, and show it.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;
use clap::Subcommand;

use crate::clock::{format_ms, now_ms};
use crate::group::{Callback, FireWhen, GroupId, GroupRef};
use crate::store::{NewChild, Sealed, Store, group_refusal};
use crate::task_type::TaskType;

/// `hourglass group ...`.
#[derive(Debug, Subcommand)]
pub enum GroupCommand {
    /// Open a group: when it is sealed and every child has ended, its callback task is scheduled, once.
    Open {
        /// The callback's task type (the group lives in its keys).
        callback_type: TaskType,
        /// The group id: 1-200 bytes of text, unique within the callback type.
        group: GroupId,
        /// The callback task's id [default: the group id].
        #[arg(long)]
        callback_id: Option<String>,
        /// Text handed to the callback under "payload" in its JSON summary.
        #[arg(long, default_value = "")]
        payload: String,
        /// `all`: fire once every child ended, however; `success`: only if all succeeded (a chain).
        #[arg(long, default_value = "all", value_parser = |s: &str| s.parse::<FireWhen>().map_err(|e| e.to_string()))]
        when: FireWhen,
    },
    /// Add children to an open group and schedule them (ids must be text).
    Add {
        /// The callback's task type.
        callback_type: TaskType,
        /// The group id.
        group: GroupId,
        /// The children's task type.
        task_type: TaskType,
        /// Their ids.
        #[arg(required = true)]
        ids: Vec<String>,
        /// Due time: RFC 3339 or ms since the Unix epoch [default: now].
        #[arg(long, value_parser = crate::cli::parse_at)]
        at: Option<i64>,
        /// Due in this long from now: `30s`, `5m`.
        #[arg(long = "in", id = "in_", value_parser = crate::cli::parse_in, conflicts_with = "at")]
        in_: Option<Duration>,
        /// Payload text of every child added.
        #[arg(long)]
        payload: Option<String>,
    },
    /// Seal a group: no more children; it completes once none is pending (at once if none is).
    Seal {
        /// The callback's task type.
        callback_type: TaskType,
        /// The group id.
        group: GroupId,
    },
    /// Show a group: its state, counts, callback, and some pending and failed children (exit 1 if unknown).
    Show {
        /// The callback's task type.
        callback_type: TaskType,
        /// The group id.
        group: GroupId,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Runs one `hourglass group` command.
pub async fn run(store: &Store, cmd: GroupCommand) -> Result<ExitCode> {
    let (GroupCommand::Open { callback_type, group, .. }
    | GroupCommand::Add { callback_type, group, .. }
    | GroupCommand::Seal { callback_type, group }
    | GroupCommand::Show { callback_type, group, .. }) = &cmd;
    let name = format!("{callback_type}/{group}");
    // A group's refusal is the answer, not a Redis failure: say it once, plainly.
    step(store, cmd).await.map_err(|e| match group_refusal(&e) {
        Some(why) => anyhow::anyhow!("group {name}: {why}"),
        None => e,
    })
}

async fn step(store: &Store, cmd: GroupCommand) -> Result<ExitCode> {
    match cmd {
        GroupCommand::Open { callback_type, group, callback_id, payload, when } => {
            let g = GroupRef { callback_type, id: group };
            let id = callback_id.unwrap_or_else(|| g.id.to_string());
            let cb = Callback { id, payload, when, replace: true };
            if store.group_open(&g, &cb).await? {
                println!("opened group {g}: callback {}/{} when {}", g.callback_type, cb.id, when.as_str());
            } else {
                println!("group {g} is already open with this callback");
            }
        }
        GroupCommand::Add { callback_type, group, task_type, ids, at, in_, payload } => {
            let g = GroupRef { callback_type, id: group };
            let due_ms = at.unwrap_or_else(|| now_ms().saturating_add(in_.unwrap_or_default().as_millis() as i64));
            let payload = payload.unwrap_or_default().into_bytes();
            let children: Vec<NewChild> = ids
                .into_iter()
                .map(|id| NewChild { task_type: task_type.clone(), id, payload: payload.clone(), due_ms })
                .collect();
            let added = store.group_add(&g, &children).await?;
            println!("added {} new child(ren) to group {g}, due at {}", added.joined, format_ms(due_ms));
            for (t, id) in &added.refused {
                eprintln!("warning: {t}/{id} is another group's child: not scheduled, counted as cancelled here");
            }
        }
        GroupCommand::Seal { callback_type, group } => {
            let g = GroupRef { callback_type, id: group };
            match store.group_seal(&g).await? {
                Sealed::Sealed => println!("sealed group {g}: it completes when its last pending child ends"),
                Sealed::Completed(fired) => {
                    println!("sealed group {g}: nothing pending, completed now ({})", fired.as_str())
                }
                Sealed::Already => println!("group {g} was already sealed"),
            }
        }
        GroupCommand::Show { callback_type, group, json } => {
            let g = GroupRef { callback_type, id: group };
            let Some(v) = store.group_show(&g).await? else {
                eprintln!("error: no group {g} (never opened, or done more than 7 days ago)");
                return Ok(ExitCode::FAILURE);
            };
            let done = store.group_progress(&g, &v).await?;
            if json {
                #[derive(serde::Serialize)]
                struct Shown<'a> {
                    #[serde(flatten)]
                    view: &'a crate::store::GroupView,
                    progress: crate::store::GroupProgress,
                }
                println!("{}", serde_json::to_string_pretty(&Shown { view: &v, progress: done })?);
                return Ok(ExitCode::SUCCESS);
            }
            println!("group {g}: {}", v.state);
            println!("  callback  {}/{} (when {})", v.callback_type, v.callback_id, v.when);
            println!(
                "  children  {} added, {} pending, {} succeeded, {} dead, {} cancelled",
                v.added, v.pending, v.succeeded, v.dead, v.cancelled
            );
            println!(
                "  progress  {:.0}% done ({} of {} pending children read have reported)",
                done.percent, done.reporting, done.pending_read
            );
            println!("  opened    {}", format_ms(v.opened_ms));
            if let (Some(at), Some(fired)) = (v.completed_ms, &v.fired) {
                println!("  completed {} (callback: {fired})", format_ms(at));
            }
            if !v.pending_sample.is_empty() {
                println!("  pending   {}", v.pending_sample.join(", "));
            }
            for (child, how) in &v.failed_sample {
                println!("  {how:9} {child}");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
