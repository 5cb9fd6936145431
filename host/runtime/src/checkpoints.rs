//! What a plugin's instances share between tasks (the checkpoint later ones are compared with, or why none can be taken) and what its runs cost.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use wasmtime::Checkpoint;

use crate::host_state::HostState;
use crate::{Component, one_line};

/// What a plugin's runs cost, measured as they ran.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RunCost {
    /// Runs since the plugin was loaded.
    pub runs: u64,
    /// Their mean wall time, getting an instance (new or reset) included, in µs.
    pub mean_us: f64,
}

impl Component {
    /// The mean wall time of its runs since it was loaded; `None` before the first.
    pub fn run_cost(&self) -> Option<RunCost> {
        let runs = self.inner.runs.load(Ordering::Relaxed);
        (runs > 0).then(|| RunCost {
            runs,
            mean_us: self.inner.run_nanos.load(Ordering::Relaxed) as f64 / runs as f64 / 1000.0,
        })
    }

    pub(crate) fn record_run(&self, took: Duration) {
        self.inner.run_nanos.fetch_add(u64::try_from(took.as_nanos()).unwrap_or(u64::MAX), Ordering::Relaxed);
        self.inner.runs.fetch_add(1, Ordering::Relaxed);
    }

    /// Why its instances cannot be reset between tasks, if they cannot (each
    /// task then gets a fresh instance).
    pub fn reset_refused(&self) -> Option<&str> {
        self.inner.reset_refused.get().map(String::as_str)
    }

    /// Whether its instances may be reset between tasks (not known to be refused).
    pub(crate) fn resettable(&self) -> bool {
        self.inner.reset_refused.get().is_none()
    }

    /// Whether its instances may be checkpointed after a warm-up call (not known to be refused).
    pub(crate) fn warm_up_usable(&self) -> bool {
        self.inner.warm_up_refused.get().is_none()
    }

    /// Why its warm-up call cannot be used, if it cannot.
    pub fn warm_up_refused(&self) -> Option<&str> {
        self.inner.warm_up_refused.get().map(String::as_str)
    }

    /// Stops checkpointing its instances after a warm-up call (logged once).
    pub(crate) fn refuse_warm_up(&self, why: String) {
        if self.inner.warm_up_refused.set(why.clone()).is_ok() {
            tracing::warn!(
                plugin = %self.inner.path.display(),
                "its warm-up call cannot be used ({why}): its instances are checkpointed right after \
                 instantiation instead (tasks still start from a fresh state; set instance_warm_up = false \
                 to skip the call)"
            );
        }
    }

    /// A checkpoint of an instance's store taken after its warm-up call; an
    /// error where the call left what a reset cannot put back.
    pub(crate) fn checkpoint_after_warm_up(
        &self,
        store: &mut wasmtime::Store<HostState>,
    ) -> wasmtime::Result<Arc<Checkpoint>> {
        let like = self.inner.warm_template.get().map(|c| &**c);
        let checkpoint = Arc::new(Checkpoint::take(store, like)?);
        self.inner.warm_template.get_or_init(|| checkpoint.clone());
        Ok(checkpoint)
    }

    /// A checkpoint of a new instance's store, taken before its first call;
    /// `None` (and never tried again for this plugin) where the instance
    /// holds what a reset cannot put back.
    pub(crate) fn checkpoint(&self, store: &mut wasmtime::Store<HostState>) -> Option<Arc<Checkpoint>> {
        let like = self.inner.reset_template.get().map(|c| &**c);
        match Checkpoint::take(store, like) {
            Ok(checkpoint) => {
                let checkpoint = Arc::new(checkpoint);
                self.inner.reset_template.get_or_init(|| checkpoint.clone());
                Some(checkpoint)
            }
            Err(e) => {
                let why = one_line(&format!("{e:#}"));
                if self.inner.reset_refused.set(why.clone()).is_ok() {
                    tracing::warn!(
                        plugin = %self.inner.path.display(),
                        "its instances cannot be reset between tasks ({why}): each task gets a new instance"
                    );
                }
                None
            }
        }
    }
}
