//! What runs a type's tasks, behind two traits: which handler serves a type now, and running one claimed task to its end; the registry and the sandbox, or fakes in unit tests.
//!
//! The claim loop finds its type's handler through [`Plugins`] and dispatch
//! starts runs through [`Execute`], so what they do around a run (a cancel
//! or a lost lease ending it, the outcome decided and queued for the
//! settler with the slots it holds, a type losing its plugin) is tested
//! with handlers that return what a test wants, without wasmtime, as
//! Spin's trigger puts its executor behind a trait.

use std::future::Future;
use std::sync::Arc;

use crate::config::Config;
use crate::registry::{Entry, Registry};
use crate::runtime::{Handler, RunHooks, TaskRun};
use crate::task::ClaimedTask;
use crate::task_type::TaskType;

/// What runs a claimed task to its end.
///
/// Its future may be dropped at any await (a cancel, a lost lease,
/// shutdown past its grace period) and must then free what it holds.
pub(crate) trait Execute: Send + Sync + 'static {
    /// Runs `task` until it returns, fails or is stopped, inside the run's
    /// span (when tracing is on) and reporting its progress (`hooks`).
    fn execute(&self, task: &ClaimedTask, hooks: RunHooks) -> impl Future<Output = TaskRun> + Send;
}

impl Execute for Handler {
    fn execute(&self, task: &ClaimedTask, hooks: RunHooks) -> impl Future<Output = TaskRun> + Send {
        self.run(task, hooks)
    }
}

/// Which handler serves a type right now, and the config in force.
pub(crate) trait Plugins: Clone + Send + Sync + 'static {
    /// What runs the tasks.
    type Handler: Execute;
    /// The entry serving `task_type` (a shard: its type's), if a plugin is loaded for it.
    fn serving(&self, task_type: &TaskType) -> Option<Arc<Entry<Self::Handler>>>;
    /// The config in force (it changes when `runner.toml` is edited).
    fn config(&self) -> Arc<Config>;
}

impl Plugins for Registry {
    type Handler = Handler;

    fn serving(&self, task_type: &TaskType) -> Option<Arc<Entry>> {
        self.get(task_type)
    }

    fn config(&self) -> Arc<Config> {
        Registry::config(self)
    }
}
