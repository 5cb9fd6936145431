//! The outbox, moved on after settles and at each heartbeat: follow-ups and workflow reports reach their types, and the outcome is logged and counted.

use tracing::{info, warn};

use super::state::Runner;
use crate::health::Health;
use crate::logging::clean_id;
use crate::store::Store;
use crate::task_type::TaskType;

/// What moving the outbox on uses: the store, and the health it reports to.
#[derive(Clone)]
pub(crate) struct Outbox {
    store: Store,
    health: Health,
}

impl Outbox {
    pub(crate) fn of(runner: &Runner) -> Outbox {
        Outbox { store: runner.store.clone(), health: runner.health.clone() }
    }

    /// Moves the type's outbox on and returns how many follow-ups went; one
    /// whose target type's keys are broken stays in the outbox (that type is
    /// faulted) while the others go.
    pub(crate) async fn flush(&self, task_type: &TaskType) -> usize {
        match self.store.flush_outbox(task_type).await {
            Ok(flushed) => {
                for target in &flushed.delivered_to {
                    self.health.succeeded(target, "deliver");
                }
                for (target, e) in &flushed.failed {
                    self.health.failed(target, "deliver", e);
                }
                for (target, id) in &flushed.kept_existing {
                    warn!(
                        task_type = %task_type,
                        target = %target,
                        id = %clean_id(id),
                        "follow-up not delivered: a {target} task with its id is waiting or dead-lettered, and \
                         {task_type} may only create {target} tasks (may_replace in runner.toml lets it replace them)"
                    );
                    crate::telemetry::followup_kept_existing(task_type, target);
                }
                for c in &flushed.groups.opened {
                    crate::telemetry::group_opened(c);
                }
                for (g, fired) in &flushed.groups.completed {
                    info!(group = %g, callback = fired.as_str(), "workflow group completed");
                    crate::telemetry::group_completed(&g.callback_type, fired.as_str());
                }
                for (g, why) in &flushed.groups.refused {
                    warn!(task_type = %task_type, group = %g, "a run's work on a group was dropped: {why}");
                    crate::telemetry::group_refused(task_type);
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
