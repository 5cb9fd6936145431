//! `hourglass stats`, `pause`, `resume` and `dead`: a type's queues as a whole.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;
use clap::Subcommand;

use crate::clock::{format_ms, now_ms};
use crate::store::{Store, TypeStats};
use crate::task_type::TaskType;

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

/// `hourglass pause`.
pub(super) async fn pause(store: &Store, task_type: TaskType, for_: Option<Duration>) -> Result<ExitCode> {
    match store.pause(&task_type, for_).await? {
        Some(ends) => {
            println!("paused {task_type} on every host until {} (then it resumes by itself)", format_ms(ends))
        }
        None => println!("paused {task_type} on every host until 'hourglass resume {task_type}'"),
    }
    Ok(ExitCode::SUCCESS)
}

/// `hourglass resume`.
pub(super) async fn resume(store: &Store, task_type: TaskType) -> Result<ExitCode> {
    if store.resume(&task_type).await? {
        println!("resumed {task_type}");
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!("error: {task_type} is not paused");
        Ok(ExitCode::FAILURE)
    }
}

/// `hourglass stats --hosts`.
pub(super) async fn hosts(store: &Store, task_type: Option<TaskType>, json: bool) -> Result<ExitCode> {
    let types = match task_type {
        Some(t) => vec![t],
        None => store.known_types().await?,
    };
    print_hosts(&crate::fleet::presence::list(store, &types).await?, json)?;
    Ok(ExitCode::SUCCESS)
}

/// `hourglass stats [--watch]`: the types, then the hosts.
pub(super) async fn stats(store: &Store, task_type: Option<TaskType>, json: bool, watch: bool) -> Result<ExitCode> {
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
            let hosts = crate::fleet::presence::list(store, &types).await?;
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

/// `hourglass dead ...`.
pub(super) async fn dead(store: &Store, cmd: DeadCommand) -> Result<ExitCode> {
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
    Ok(ExitCode::SUCCESS)
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
    for (t, s) in rows.iter().filter(|(_, s)| s.graphs_running + s.graphs_opened > 0) {
        writeln!(
            out,
            "GRAPHS {t}: {} running, {} done ({} with a node that did not succeed), {} declared; hourglass graph show {t} <graph>",
            s.graphs_running, s.graphs_completed, s.graphs_failed, s.graphs_opened
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

fn print_hosts(hosts: &[crate::fleet::presence::HostInfo], json: bool) -> Result<()> {
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
