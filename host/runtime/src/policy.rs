//! What the sandbox holds one task type's runs to: time, memory, payload, outbound HTTP, and where follow-ups may go.

use std::time::Duration;

use bytesize::ByteSize;
use hourglass_task::task_type::TaskType;

use crate::outbound::AllowedHosts;

/// The sandbox's part of a task type's policy (the host's `[types.T]`
/// table, whose fields of the same names say what each means); a
/// [`Handler`](crate::Handler) is bound to one.
#[derive(Debug, Clone, PartialEq)]
pub struct SandboxPolicy {
    /// Execution deadline of one run.
    pub timeout: Duration,
    /// Linear memory cap of one instance.
    pub memory_limit: ByteSize,
    /// Most bytes the host holds for one run outside its linear memory.
    pub host_memory_limit: ByteSize,
    /// Larger payloads are refused before the handler is called.
    pub max_payload: ByteSize,
    /// One instance serves up to this many consecutive tasks (0 or 1: a fresh instance per task).
    pub instance_reuse: u32,
    /// Reset a kept instance between tasks instead of instantiating anew (ignored when reusing).
    pub instance_reset: bool,
    /// Before a kept instance's checkpoint is taken, call its handler once with
    /// a warm-up task (attempt 0, no payload, nothing it does leaves the
    /// sandbox), so every reset starts with the code a task runs ready.
    pub instance_warm_up: bool,
    /// Where the plugin may send HTTP requests; empty: nowhere.
    pub allowed_outbound_hosts: AllowedHosts,
    /// Deadline of one outbound request, connect to last body byte.
    pub http_timeout: Duration,
    /// Largest response body a plugin may read.
    pub http_max_response: ByteSize,
    /// Most outbound requests of the type in flight at once.
    pub http_concurrency: usize,
    /// Types the handler may schedule follow-ups into (create-only).
    pub may_schedule: Vec<TaskType>,
    /// Types whose existing tasks its follow-ups may also replace; implies `may_schedule`.
    pub may_replace: Vec<TaskType>,
}
