//! A compiled plugin: its pre-linked instance, where it came from, and what its instances share (the reset and warm-up templates, its run counters).

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::{Arc, OnceLock};

use wasmtime::Checkpoint;

use crate::CompileStats;
use crate::bindings::TaskHandlerPre;
use crate::host_state::HostState;

/// A compiled plugin, checked against [`WORLD`]; cheap to clone.
#[derive(Clone)]
pub struct Component {
    pub(crate) inner: Arc<ComponentInner>,
}

pub(crate) struct ComponentInner {
    pub(crate) pre: TaskHandlerPre<HostState>,
    pub(crate) path: PathBuf,
    pub(crate) hash: String,
    /// The interpreter it bundles, if any.
    pub(crate) interpreter: crate::interpreter::Interpreter,
    /// What compiling it took, when it was compiled rather than mapped from the cache.
    pub(crate) compiled: Option<CompileStats>,
    pub(crate) max_memory: u64,
    pub(crate) warm_idle: Arc<AtomicUsize>,
    pub(crate) kept_per_handler: usize,
    /// The first checkpoint of one of its instances: later ones share its
    /// memory images where the contents are the same (they are for a
    /// deterministic start), so kept instances of a plugin hold one copy.
    pub(crate) reset_template: OnceLock<Arc<Checkpoint>>,
    /// Why its instances cannot be reset, once that is known: each task then
    /// gets a fresh instance.
    pub(crate) reset_refused: OnceLock<String>,
    /// [`ComponentInner::reset_template`] of checkpoints taken after a warm-up call.
    pub(crate) warm_template: OnceLock<Arc<Checkpoint>>,
    /// Why its warm-up call cannot be used, once that is known: its
    /// instances are then checkpointed right after instantiation.
    pub(crate) warm_up_refused: OnceLock<String>,
    /// Runs of it since it was loaded, and their wall time in all.
    pub(crate) runs: AtomicU64,
    pub(crate) run_nanos: AtomicU64,
}

impl fmt::Debug for Component {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Component")
            .field("path", &self.inner.path)
            .field("hash", &self.inner.hash)
            .finish_non_exhaustive()
    }
}

impl Component {
    /// First 12 hex digits of the SHA-256 of the file: names this version in logs.
    pub fn hash(&self) -> &str {
        &self.inner.hash
    }

    /// The interpreter it bundles (CPython, QuickJS-ng, StarlingMonkey), if any.
    pub fn interpreter(&self) -> crate::interpreter::Interpreter {
        self.inner.interpreter
    }

    /// The file it was loaded from.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// What compiling it took; `None` when it was mapped from the cache.
    pub fn compile_stats(&self) -> Option<CompileStats> {
        self.inner.compiled
    }
}
