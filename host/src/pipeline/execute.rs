//! Running one claimed task to its end, behind one trait: the sandbox's `Handler`, or a fake in unit tests.
//!
//! Dispatch starts runs through [`Execute`], so what it does around a run
//! (a cancel or a lost lease ending it, the outcome decided and queued for
//! the settler with the slots it holds) is tested with handlers that return
//! what a test wants, without wasmtime, as Spin's trigger puts its executor
//! behind a trait.

use std::future::Future;

use crate::runtime::trace::RunTrace;
use crate::runtime::{Handler, TaskRun};
use crate::task::ClaimedTask;

/// What runs a claimed task to its end.
///
/// Its future may be dropped at any await (a cancel, a lost lease,
/// shutdown past its grace period) and must then free what it holds.
pub(crate) trait Execute: Send + Sync + 'static {
    /// Runs `task` inside the run's span (`trace`, when tracing is on) until it returns, fails or is stopped.
    fn execute(&self, task: &ClaimedTask, trace: Option<RunTrace>) -> impl Future<Output = TaskRun> + Send;
}

impl Execute for Handler {
    fn execute(&self, task: &ClaimedTask, trace: Option<RunTrace>) -> impl Future<Output = TaskRun> + Send {
        self.run(task, trace)
    }
}
