//! `hourglass graph`: declare a workflow graph (tasks and the tasks they wait for) in one step, show it, cancel it.

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, anyhow};
use clap::Subcommand;

use crate::clock::format_ms;
use crate::group::GroupId;
use crate::store::{GraphRefusal, NodeSpec, Store};
use crate::task_type::TaskType;

/// `hourglass graph ...`.
#[derive(Debug, Subcommand)]
pub enum GraphCommand {
    /// Declare a graph from a JSON file (`-`: standard input): every node runs once its parents have ended as its `when` says; refused whole if anything is wrong.
    Submit {
        /// The type whose keys hold the graph (a host must serve it: it schedules the nodes).
        home_type: TaskType,
        /// The graph id: 1-200 bytes of text, used once within the home type.
        #[arg(value_parser = parse_graph_id)]
        graph: GroupId,
        /// `{"nodes": [{"name", "type", "id", "payload", "when", "parents": [names]}]}` (docs/workflows.md).
        file: PathBuf,
    },
    /// Cancel a graph: its waiting nodes are skipped at once, its scheduled nodes' tasks cancelled (removed, or stopped by their hosts); exit 1 if unknown.
    Cancel {
        /// The graph's home type.
        home_type: TaskType,
        /// The graph id.
        #[arg(value_parser = parse_graph_id)]
        graph: GroupId,
    },
    /// Show a graph: its state, and each node's state, parents and the reason for a skip (exit 1 if unknown).
    Show {
        /// The graph's home type.
        home_type: TaskType,
        /// The graph id.
        #[arg(value_parser = parse_graph_id)]
        graph: GroupId,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// A graph id has a group id's rules (text in key names); the error says graph.
fn parse_graph_id(s: &str) -> Result<GroupId, String> {
    s.parse::<GroupId>().map_err(|_| {
        format!("invalid graph id {s:?}: it must be 1 to {} bytes of text without control characters", GroupId::MAX_LEN)
    })
}

/// Runs one `hourglass graph` command.
pub async fn run(store: &Store, cmd: GraphCommand) -> Result<ExitCode> {
    match cmd {
        GraphCommand::Submit { home_type, graph, file } => {
            let name = format!("{home_type}/{graph}");
            let nodes = read_nodes(&file, &graph).with_context(|| format!("graph {name}"))?;
            let declared =
                store.graph_submit(&home_type, &graph, &nodes).await.map_err(|e| match GraphRefusal::of(&e) {
                    Some(why) => anyhow!("{why}; nothing was written"),
                    None => e,
                })?;
            println!(
                "declared graph {name}: {} nodes, {} edges, {} scheduled now",
                declared.nodes, declared.edges, declared.roots
            );
            Ok(ExitCode::SUCCESS)
        }
        GraphCommand::Cancel { home_type, graph } => {
            let Some(done) = store.graph_cancel(&home_type, &graph).await? else {
                eprintln!("error: no graph {home_type}/{graph} (never declared, or done more than 7 days ago)");
                return Ok(ExitCode::FAILURE);
            };
            if done.was_done {
                println!("graph {home_type}/{graph} is done already: nothing to cancel");
            } else {
                println!(
                    "cancelled graph {home_type}/{graph}: {} waiting nodes skipped; of the nodes scheduled, {} removed before they ran, {} running asked to stop, {} ended already",
                    done.skipped, done.removed, done.stopping, done.ended
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        GraphCommand::Show { home_type, graph, json } => {
            let Some(v) = store.graph_show(&home_type, &graph).await? else {
                eprintln!("error: no graph {home_type}/{graph} (never declared, or done more than 7 days ago)");
                return Ok(ExitCode::FAILURE);
            };
            let done = store.graph_progress(&v).await?;
            if json {
                #[derive(serde::Serialize)]
                struct Shown<'a> {
                    #[serde(flatten)]
                    view: &'a crate::store::GraphView,
                    progress: crate::store::GraphProgress,
                }
                println!("{}", serde_json::to_string_pretty(&Shown { view: &v, progress: done })?);
                return Ok(ExitCode::SUCCESS);
            }
            println!("graph {home_type}/{graph}: {}", v.state);
            let counts: Vec<String> = v.counts.iter().map(|(state, n)| format!("{n} {state}")).collect();
            println!("  nodes     {} ({}), {} edges", v.nodes.len(), counts.join(", "), v.edges);
            println!(
                "  progress  {:.0}% done ({} of {} scheduled nodes read have reported)",
                done.percent, done.reporting, done.scheduled_read
            );
            if let Some(at) = v.opened_ms {
                println!("  opened    {}", format_ms(at));
            }
            if let Some(at) = v.cancelled_ms {
                println!("  cancelled {}", format_ms(at));
            }
            if let Some(at) = v.completed_ms {
                println!("  completed {}", format_ms(at));
            }
            for n in &v.nodes {
                let parents =
                    if n.parents.is_empty() { String::new() } else { format!(" after {}", n.parents.join(", ")) };
                let waiting =
                    if n.waiting_for > 0 { format!(", waiting for {}", n.waiting_for) } else { String::new() };
                let reason = n.reason.as_ref().map(|r| format!(" ({r})")).unwrap_or_default();
                println!(
                    "  {:<9} {} = {}/{} (when {}){parents}{waiting}{reason}",
                    n.state, n.name, n.task_type, n.id, n.when
                );
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// The nodes of graph file `file` (`-`: standard input), with their types checked.
fn read_nodes(file: &PathBuf, graph: &GroupId) -> Result<Vec<NodeSpec>> {
    let text = if file.as_os_str() == "-" {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text).context("cannot read the graph from standard input")?;
        text
    } else {
        std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?
    };
    crate::graph::parse_nodes(&text, graph).with_context(|| file.display().to_string())
}
