//! Where one task is, in words: `hourglass show` and the dashboard's task page both say it this way.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;

use crate::clock::format_ms;
use crate::observe::logging::clean_id;
use crate::store::{ProgressView, Store, TaskState, TaskView};
use crate::task_type::TaskType;

/// One line saying where the task is: "scheduled for T (in 4m 59s)", "running on host H, attempt 2, ...".
pub fn headline(v: &TaskView) -> String {
    match v.state {
        TaskState::Scheduled => {
            let due = v.due_ms.unwrap_or_default();
            format!("scheduled for {} (in {})", format_ms(due), span(due - v.now_ms))
        }
        TaskState::Due => {
            let due = v.due_ms.unwrap_or_default();
            format!("due since {} ({} ago) and waiting for a host", format_ms(due), span(v.now_ms - due))
        }
        TaskState::Running => {
            let Some(lease) = &v.running else { return "running".to_owned() };
            let host = if lease.host.is_empty() { "a host without an id" } else { &lease.host };
            let until = lease.lease_until_ms;
            let lease_text = if until >= v.now_ms {
                format!("lease until {} (in {})", format_ms(until), span(until - v.now_ms))
            } else {
                // Its host stopped renewing it: the next claim of the type makes it due again.
                format!(
                    "lease expired at {} ({} ago): its host is gone, it runs again at the next claim",
                    format_ms(until),
                    span(v.now_ms - until)
                )
            };
            format!("running on host {host}, attempt {}, {lease_text}", lease.attempt)
        }
        TaskState::Dead => {
            let died = v.died_ms.unwrap_or_default();
            format!("dead since {} ({} ago)", format_ms(died), span(v.now_ms - died))
        }
        TaskState::Unknown => "unknown: not scheduled, running or dead".to_owned(),
    }
}

/// The lines after the headline: what else is known (as label, text).
pub fn details(v: &TaskView) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    match v.shard {
        Some(i) => out.push(("shard", format!("{i} (keys {{{}}})", v.task_type))),
        None if v.task_type.tag_number() > 0 => out.push((
            "shard",
            format!("none of the current ones (keys {{{}}}): a tag the hosts drain, see docs/scaling.md", v.task_type),
        )),
        None => {}
    }
    if v.state == TaskState::Running
        && let Some(due) = v.due_ms
    {
        out.push(("scheduled again", format!("for {} by a client while it runs; that schedule stays", format_ms(due))));
    }
    if v.state != TaskState::Dead
        && let Some(died) = v.died_ms
    {
        out.push(("dead entry", format!("since {}; cleared when the new schedule is claimed", format_ms(died))));
    }
    if v.state != TaskState::Unknown || v.attempts > 0 {
        out.push(("attempts so far", format!("{} ended without success", v.attempts)));
    }
    if let Some(e) = &v.last_error {
        out.push(("last error", e.clone()));
    }
    if let Some(p) = &v.progress {
        out.push(("progress", progress_line(p, v.now_ms)));
    }
    out.push(("payload", payload_line(v)));
    if let Some(g) = &v.group {
        out.push(("group", format!("a child of {g} (hourglass group show {})", g.replacen('/', " ", 1))));
    }
    if let Some(g) = &v.graph {
        out.push(("graph", format!("a node of {g} (hourglass graph show {})", g.replacen('/', " ", 1))));
    }
    out
}

/// How far its handler got: `40% {"step":"copy"} (attempt 1, reported 2s ago)`.
pub fn progress_line(p: &ProgressView, now_ms: i64) -> String {
    let detail = p.detail.as_deref().map(|d| format!(" {d}")).unwrap_or_default();
    format!("{}%{detail} (attempt {}, reported {} ago)", p.percent, p.attempt, span(now_ms - p.at_ms))
}

/// The payload's size and its start.
pub fn payload_line(v: &TaskView) -> String {
    let Some(p) = &v.payload else {
        return "none".to_owned();
    };
    let more = if p.truncated { " …" } else { "" };
    match (&p.text, &p.hex) {
        (Some(text), _) => format!("{} bytes, text: {text}{more}", p.size),
        (None, Some(hex)) => format!("{} bytes, binary: {hex}{more}", p.size),
        (None, None) => format!("{} bytes", p.size),
    }
}

/// Whole seconds, human style (`4m 59s`); under a second is `0s`.
fn span(ms: i64) -> String {
    humantime::format_duration(Duration::from_secs(u64::try_from(ms.max(0) / 1000).unwrap_or(0))).to_string()
}

/// `hourglass show <type> <id>`: prints the view (JSON with `json`); exits 1 when the task is unknown.
pub async fn command(store: &Store, t: &TaskType, id: &[u8], json: bool) -> Result<ExitCode> {
    let view = store.show(t, id).await?;
    let mut out = std::io::stdout().lock();
    if json {
        serde_json::to_writer_pretty(&mut out, &view)?;
        writeln!(out)?;
    } else {
        writeln!(out, "{t}/{}: {}", clean_id(id), headline(&view))?;
        if view.state != TaskState::Unknown {
            for (label, text) in details(&view) {
                writeln!(out, "  {label}: {}", crate::observe::logging::Clean(&text))?;
            }
        }
    }
    Ok(if view.state == TaskState::Unknown { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}
