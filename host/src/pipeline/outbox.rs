//! The outbox, moved on by its one owner (the type's settler) after settles and at each tick: follow-ups and workflow reports reach their types, and what happened is logged and counted.

use tracing::{info, warn};

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use super::ledger::Ledger;
use super::state::Runner;
use crate::observe::health::Health;
use crate::observe::logging::clean_id;
use crate::store::Store;
use crate::task_type::TaskType;

/// What moving the outbox on uses: where it is (`L`), and the health it reports to.
#[derive(Clone)]
pub(crate) struct Outbox<L = Store> {
    ledger: L,
    health: Health,
}

impl Outbox {
    pub(crate) fn of(runner: &Runner) -> Outbox {
        Outbox::new(runner.store.clone(), runner.health.clone())
    }
}

impl<L: Ledger> Outbox<L> {
    pub(crate) fn new(ledger: L, health: Health) -> Outbox<L> {
        Outbox { ledger, health }
    }

    /// Moves the outbox on at once, then whenever `wanted` is notified (asks
    /// made during a flush coalesce into one more) and every `every`, for
    /// follow-ups a host that died between its ack and their delivery left.
    /// One flush at a time; runs until aborted.
    pub(crate) async fn run(self, task_type: TaskType, wanted: Arc<Notify>, every: Duration) {
        // A flush not asked for by a settle finds what was left behind.
        let mut left_behind = true;
        loop {
            let moved = self.flush(&task_type).await;
            if left_behind && moved > 0 {
                info!(task_type = %task_type, delivered = moved, "delivered follow-ups left in the outbox");
            }
            left_behind = tokio::select! {
                _ = wanted.notified() => false,
                _ = tokio::time::sleep(every) => true,
            };
        }
    }

    /// Moves the type's outbox on and returns how many follow-ups went; one
    /// whose target type's keys are broken stays in the outbox (that type is
    /// faulted) while the others go.
    pub(crate) async fn flush(&self, task_type: &TaskType) -> usize {
        match self.ledger.flush_outbox(task_type).await {
            Ok(flushed) => {
                for target in &flushed.delivered_to {
                    self.health.succeeded(target, "deliver");
                }
                for (target, e) in &flushed.failed {
                    self.health.failed(target, "deliver", e);
                }
                for (target, id) in &flushed.kept_existing {
                    kept_existing(task_type, target, id);
                }
                for c in &flushed.groups.opened {
                    crate::observe::telemetry::group_opened(c);
                }
                for (g, fired) in &flushed.groups.completed {
                    info!(group = %g, callback = fired.as_str(), "workflow group completed");
                    crate::observe::telemetry::group_completed(&g.callback_type, fired.as_str());
                }
                for (home, g) in &flushed.graphs_done {
                    info!(graph = %format!("{home}/{g}"), "workflow graph done");
                    crate::observe::telemetry::graph_done(home);
                }
                for (home, g) in &flushed.graphs_declared {
                    info!(task_type = %task_type, graph = %format!("{home}/{g}"), "workflow graph declared by a run");
                }
                for (home, g, why) in &flushed.graphs_refused {
                    warn!(task_type = %task_type, graph = %format!("{home}/{g}"), "a graph a run declared was refused: {why}");
                    crate::observe::telemetry::graph_refused(home);
                }
                for (g, why) in &flushed.groups.refused {
                    warn!(task_type = %task_type, group = %g, "a run's work on a group was dropped: {why}");
                    crate::observe::telemetry::group_refused(task_type);
                }
                flushed.moved
            }
            Err(e) => {
                self.health.outage(&e);
                0
            }
        }
    }
}

/// Logs and counts a create-only follow-up from `task_type` that found its id
/// taken in `target` (delivered through the outbox or in the settle).
pub(crate) fn kept_existing(task_type: &TaskType, target: &TaskType, id: &[u8]) {
    warn!(
        task_type = %task_type,
        target = %target,
        id = %clean_id(id),
        "follow-up not delivered: a {target} task with its id is waiting or dead-lettered, and \
         {task_type} may only create {target} tasks (may_replace in runner.toml lets it replace them)"
    );
    crate::observe::telemetry::followup_kept_existing(task_type, target);
}
