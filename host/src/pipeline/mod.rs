//! The pipeline: one claim loop per type with a plugin, its runs and its settler, and the drain at shutdown.
//!
//! The path of a task, room by room, each stage handing on to the next:
//! [`claim`] takes due tasks under a lease within the concurrency limits,
//! [`dispatch`] runs each in the sandbox and decides what its result means,
//! and [`settle`] writes the outcomes in batches and only then frees the
//! slots; [`outbox`], owned by the settler, then moves the follow-ups they
//! committed on to their types (also at each tick); [`progress`] writes
//! the progress running handlers report. The leases held between
//! claim and settle are one map with one owner, [`in_flight`], whose methods
//! are the steps of a lease's life. Each stage is a small struct holding only
//! the handles it uses, taken from the runner's ([`state`], which imports
//! none of them). They reach Redis's task path through [`ledger`] (claim,
//! renew, settle, hand back, outbox: the store, or scripted answers in unit
//! tests), find their type's handler and run tasks through [`execute`] (the
//! registry and the sandbox, or fakes). This module starts those loops for
//! every type that has a plugin and, at shutdown, stops claiming, lets
//! running tasks finish within the grace period, ends the rest and hands
//! their leases back.

pub mod claim;
pub mod dispatch;
pub mod execute;
#[cfg(test)]
mod fakes;
pub mod in_flight;
pub mod ledger;
pub mod outbox;
pub mod progress;
pub mod settle;
pub mod state;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{error, info, warn};

use crate::fleet::wakeup::Wakeups;
use crate::observe::health::Health;
use crate::registry::Registry;
use crate::runtime::Runtime;
use crate::store::Store;
use crate::task::CancelRequest;
use crate::task_type::TaskType;
use ledger::Ledger;
use state::{Runner, TypeState};

/// What the runner is handed by the host that starts it.
pub struct Parts {
    /// Where the tasks are (recording this host as the holder of its leases).
    pub store: Store,
    /// Which plugin serves which type, kept current.
    pub registry: Registry,
    /// The sandbox the runs execute in.
    pub runtime: Runtime,
    /// Early wake-ups when a due set changes.
    pub wakeups: Wakeups,
    /// Outages and per-type faults, shared with the admin server.
    pub health: Health,
    /// Requests to stop runs, as the wake-up listener receives them.
    pub cancels: mpsc::UnboundedReceiver<CancelRequest>,
}

/// A type's (or a shard's) state, with its settler running.
fn start_type(runner: &Runner, task_type: &TaskType, slots: Arc<Semaphore>, concurrency: usize) -> Arc<TypeState> {
    let (state, queue) = TypeState::new(task_type, slots, claim::claim_size(runner.batch_size, concurrency));
    let state = Arc::new(state);
    let settler = settle::Settler::of(runner).run(
        task_type.clone(),
        state.in_flight.clone(),
        state.metrics.clone(),
        queue,
        outbox_every(runner.lease),
    );
    state.set_settler(tokio::spawn(settler));
    let board = progress::ProgressBoard::new(
        task_type.clone(),
        runner.store.clone(),
        runner.registry.clone(),
        tokio::runtime::Handle::current(),
    );
    let _ = state.progress.set(Arc::new(board));
    if runner.registry.config().events_maxlen(task_type).is_some() {
        // The stream exists from the start, so a client waiting for a task's end
        // can tell "no event yet" from "this type has no events" (docs/operations.md).
        let (store, task_type) = (runner.store.clone(), task_type.clone());
        tokio::spawn(async move {
            if let Err(e) = store.open_events(&task_type).await {
                warn!(task_type = %task_type, "{e:#}: clients waiting for its tasks may say it has no events until one ends");
            }
        });
    }
    state
}

/// How often a type's outbox is moved on without being asked: at each lease
/// renewal tick, a third of a lease, so a follow-up left by a host that died
/// between its ack and the delivery waits about as long as its lease would.
fn outbox_every(lease: Duration) -> Duration {
    lease / 3
}

/// Shard tags (`T#k`) that are none of their type's current shards and
/// still have work: `shards` was lowered, or an earlier version put shard `i`
/// in `T#i`. Their tasks are claimed and run as before (see docs/scaling.md,
/// "Resharding") until the next start finds them gone. It SCANs the whole
/// keyspace, so it runs beside the claim loops, never before them.
async fn shards_to_drain(store: Store) -> Vec<TaskType> {
    let found = async {
        let mut old = Vec::new();
        for q in store.known_shards().await? {
            if store.shard_index(&q).is_none() && store.has_work(&q).await? {
                old.push(q);
            }
        }
        anyhow::Ok(old)
    };
    match found.await {
        Ok(old) => {
            if !old.is_empty() {
                let names: Vec<String> = old.iter().map(ToString::to_string).collect();
                let shards = names.join(", ");
                info!(%shards, "shards that are none of their type's current ones still hold keys: draining them");
            }
            old
        }
        Err(e) => {
            warn!(
                "cannot list the shards present, so no shard left by a lowered `shards` or old tags is drained: {e:#}"
            );
            Vec::new()
        }
    }
}

/// Runs every type's claim loop until `shutdown` is cancelled, then drains:
/// no new claims; running tasks get `grace_period` to finish; the runs still
/// going are ended (their futures dropped, so their instances and slots
/// come back at once) and their leases handed back to `due`, due now.
pub async fn run(parts: Parts, shutdown: CancellationToken) {
    let config = parts.registry.config();
    let mut cancels = parts.cancels;
    let runner = Runner {
        store: parts.store,
        registry: parts.registry,
        runtime: parts.runtime,
        wakeups: parts.wakeups,
        health: parts.health,
        global: Arc::new(Semaphore::new(config.runner.concurrency)),
        stop_claiming: shutdown.clone(),
        runs: TaskTracker::new(),
        poll_interval: config.runner.poll_interval,
        batch_size: config.runner.batch_size,
        lease: config.runner.lease,
    };
    let workers = TaskTracker::new();
    let mut states: HashMap<TaskType, Arc<TypeState>> = HashMap::new();
    let mut draining: Vec<TaskType> = Vec::new();
    let mut drain_scan = Some(tokio::spawn(shards_to_drain(runner.store.clone())));
    let mut versions = runner.registry.subscribe();
    loop {
        // Start a worker for every type (every shard of a sharded type) that gained a plugin.
        for task_type in runner.registry.types() {
            let concurrency = runner.registry.config().policy(&task_type).concurrency;
            let mut shards = runner.store.shards_of(&task_type);
            shards.extend(draining.iter().filter(|s| s.base() == task_type).cloned());
            let live = |states: &HashMap<TaskType, Arc<TypeState>>, s: &TaskType| {
                states.get(s).filter(|s| !s.stopped.load(Ordering::Relaxed)).map(|s| s.semaphore.clone())
            };
            // The shards of a type share its slots: `concurrency` holds for the type.
            let slots =
                shards.iter().find_map(|s| live(&states, s)).unwrap_or_else(|| Arc::new(Semaphore::new(concurrency)));
            for shard in shards {
                if live(&states, &shard).is_some() {
                    continue;
                }
                let state = start_type(&runner, &shard, slots.clone(), concurrency);
                states.insert(shard.clone(), state.clone());
                let part = claim::ShardPart::of(&runner.store, &shard);
                workers.spawn(claim::Claimer::of(&runner).run(shard, part, state));
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => break,
            changed = versions.changed() => if changed.is_err() { break },
            Some(request) = cancels.recv() => {
                if states.get(&request.task_type).is_some_and(|s| s.in_flight.cancel(&request.id, request.token)) {
                    info!(task_type = %request.task_type, task_id = %crate::observe::logging::clean_id(&request.id), "cancel asked: stopping the run");
                }
            }
            found = async { drain_scan.as_mut().expect("guarded").await }, if drain_scan.is_some() => {
                drain_scan = None;
                draining = found.unwrap_or_default();
            }
        }
    }
    if let Some(scan) = drain_scan {
        scan.abort();
    }

    let grace = runner.registry.config().runner.grace_period;
    info!(grace = ?grace, "shutting down: no new claims; waiting for running tasks");
    runner.runs.close();
    if tokio::time::timeout(grace, runner.runs.wait()).await.is_err() {
        let unfinished: usize = states.values().map(|state| state.in_flight.abort_all()).sum();
        runner.runs.wait().await;
        warn!(unfinished, "grace period over: the runs still going were stopped");
    }
    for (task_type, state) in &states {
        state.close_settler(task_type).await;
    }
    for (task_type, state) in &states {
        let leases = state.in_flight.to_hand_back();
        if leases.is_empty() {
            continue;
        }
        match Ledger::release(&runner.store, task_type, &leases).await {
            Ok(n) => {
                warn!(task_type = %task_type, handed_back = n, "leases of unfinished tasks handed back: due now for any host")
            }
            Err(e) => error!(task_type = %task_type, "cannot hand leases back, they will expire: {e:#}"),
        }
    }
    workers.close();
    workers.wait().await;
}
