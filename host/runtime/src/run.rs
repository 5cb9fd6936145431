//! What identifies and bounds one run, shared by its host state and its outbound HTTP: the output and
//! resource caps, the split of its host-memory budget, and who it is in the logs.

use std::sync::Arc;

use bytesize::ByteSize;

use hourglass_task::clean::Clean;
use hourglass_task::task_type::TaskType;

/// Bytes of stdout and of stderr kept per run; the rest is dropped.
pub const OUTPUT_CAP: usize = 64 * 1024;
/// Longest error text kept from a run (logged, stored in Redis): longer ones are cut.
pub const MAX_ERROR_TEXT: usize = 4 * 1024;
/// Most live resources (streams, pollables, HTTP requests, fields ...) of one run.
pub const MAX_RESOURCES: usize = 512;
/// Reserved out of the imports' half of the budget for the captured stdout,
/// stderr and error text, which are capped on their own.
const OUTPUT_RESERVED: u64 = (2 * OUTPUT_CAP + MAX_ERROR_TEXT) as u64;

/// How `host_memory_limit` is shared out: half for what the `hourglass:plugin`
/// imports buffer (follow-ups; captured output), half for wasi:http, whose
/// state is bounded by construction: [`MAX_RESOURCES`] live resources, each
/// header `fields` at most [`HostBudget::field_limit`] bytes and each
/// outgoing body buffering at most two chunks of [`HostBudget::body_chunk`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostBudget {
    limit: u64,
}

impl HostBudget {
    /// The split of `host_memory_limit` bytes.
    pub fn new(limit: u64) -> HostBudget {
        HostBudget { limit }
    }

    /// The whole limit.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Bytes the imports may buffer (follow-ups), after the reserved output.
    pub fn held_limit(&self) -> u64 {
        (self.limit / 2).saturating_sub(OUTPUT_RESERVED)
    }

    /// Most bytes of one header `fields` resource a guest builds.
    pub fn field_limit(&self) -> usize {
        usize::try_from(self.limit / 2 / MAX_RESOURCES as u64).unwrap_or(usize::MAX)
    }

    /// Largest single write to an outgoing body (two are buffered at most).
    pub fn body_chunk(&self) -> usize {
        (self.field_limit() / 2).max(1024)
    }
}

/// Who is logging: attached to every guest log line.
pub(crate) struct RunMeta {
    pub(crate) plugin: Arc<str>,
    pub(crate) plugin_hash: String,
    pub(crate) task_type: TaskType,
    /// The id, with control characters escaped (ids are any bytes).
    pub(crate) task_id: String,
    pub(crate) attempt: u32,
    /// The warm-up call before a kept instance's checkpoint: what it logs or
    /// prints is dropped, and it makes no outbound requests.
    pub(crate) warm_up: bool,
}

impl RunMeta {
    /// One guest log line (`stream`: captured stdout or stderr; `None`: the log import).
    /// The text comes from the guest: control characters are escaped, so a
    /// `\n` can never start a line that looks like the host's own.
    pub(crate) fn emit(&self, level: tracing::Level, stream: Option<&str>, message: &str) {
        if self.warm_up {
            return;
        }
        let message = Clean(message);
        // tracing needs each level spelled out at its call site.
        macro_rules! event {
            ($level:expr) => {
                tracing::event!(
                    target: "hourglass::plugin",
                    $level,
                    plugin = %self.plugin,
                    plugin_hash = %self.plugin_hash,
                    task_type = %self.task_type,
                    task_id = %self.task_id,
                    attempt = self.attempt,
                    stream,
                    "{message}"
                )
            };
        }
        match level {
            tracing::Level::TRACE => event!(tracing::Level::TRACE),
            tracing::Level::DEBUG => event!(tracing::Level::DEBUG),
            tracing::Level::INFO => event!(tracing::Level::INFO),
            tracing::Level::WARN => event!(tracing::Level::WARN),
            _ => event!(tracing::Level::ERROR),
        }
    }

    /// A line the host writes about this run, among its guest lines.
    pub(crate) fn warn(&self, message: std::fmt::Arguments<'_>) {
        if self.warm_up {
            return;
        }
        tracing::warn!(
            target: "hourglass::plugin",
            plugin = %self.plugin,
            plugin_hash = %self.plugin_hash,
            task_type = %self.task_type,
            task_id = %self.task_id,
            attempt = self.attempt,
            "{message}"
        );
    }

    /// Emits captured output as log lines, one event per line.
    pub(crate) fn emit_output(&self, stream: &'static str, text: &str, dropped: usize) {
        for line in text.lines() {
            self.emit(tracing::Level::INFO, Some(stream), line);
        }
        if dropped > 0 {
            self.warn(format_args!(
                "{stream}: {} of output over the {} cap was dropped",
                ByteSize::b(dropped as u64),
                ByteSize::b(OUTPUT_CAP as u64)
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_is_split_between_imports_and_wasi_http() {
        let b = HostBudget::new(16 * 1024 * 1024);
        assert_eq!(b.field_limit(), 16 * 1024, "half of 16 MiB over 512 resources");
        assert_eq!(b.body_chunk(), 8 * 1024);
        assert_eq!(b.held_limit(), 8 * 1024 * 1024 - OUTPUT_RESERVED);
        // All of wasi:http's worst case fits its half.
        assert!((MAX_RESOURCES * b.field_limit()) as u64 <= b.limit() / 2);
    }
}
