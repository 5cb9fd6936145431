//! Write Hourglass task handlers in Rust: one plain function, compiled to a WebAssembly component.
//!
//! A handler receives one due [`Task`] and returns `Ok(())` to acknowledge it,
//! or a [`Failure`] that tells the host whether and when to retry.
//!
//! ```no_run
//! use hourglass_sdk::{Failure, Task, info};
//!
//! #[derive(serde::Deserialize)]
//! struct Order {
//!     order_id: String,
//! }
//!
//! fn handle(task: Task) -> Result<(), Failure> {
//!     // Invalid JSON becomes a permanent failure: retrying would not help.
//!     let order: Order = task.json()?;
//!     info!("cancelling unpaid order {} (attempt {})", order.order_id, task.attempt);
//!     Ok(())
//! }
//!
//! hourglass_sdk::export_handler!(handle);
//! # fn main() {}
//! ```
//!
//! Build it with `cargo build --target wasm32-wasip2 --release` and drop the
//! `.wasm` into the host's plugins folder as `<task type>.wasm`.

use std::fmt;

// The generated bindings are an implementation detail: plugin authors only see
// the types and functions below, so the WIT can evolve without breaking them.
#[doc(hidden)]
#[allow(missing_docs, unsafe_code, clippy::all)]
pub mod bindings {
    wit_bindgen::generate!({
        path: "wit",
        world: "task-handler",
        // The world's wasi:http import and the wasi:io/clocks types it uses.
        generate_all,
        pub_export_macro: true,
        export_macro_name: "__export_task_handler",
        default_bindings_module: "::hourglass_sdk::bindings",
        runtime_path: "::hourglass_sdk::__private::wit_bindgen::rt",
    });
}

// Lets the generated code name this crate as `::hourglass_sdk`, like its users do.
extern crate self as hourglass_sdk;

use bindings::hourglass::plugin::types as wit_types;
use bindings::hourglass::plugin::{
    config as wit_config, log as wit_log, progress as wit_progress, schedule as wit_schedule,
};

pub mod http;
pub mod workflow;

/// One delivery of a due task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Task {
    /// The task id: any bytes (see [`Task::id_str`] for text ids).
    pub id: Vec<u8>,
    /// The task type that picked this handler, e.g. `order.timeout`.
    pub task_type: String,
    /// The payload as scheduled (empty when there was none).
    pub payload: Vec<u8>,
    /// 1 on first delivery, 2 on the first retry, and so on.
    pub attempt: u32,
    /// When the task was due, in ms since the Unix epoch.
    pub due_ms: u64,
}

impl Task {
    /// The id as text; invalid UTF-8 is replaced by `U+FFFD`.
    pub fn id_str(&self) -> std::borrow::Cow<'_, str> {
        String::from_utf8_lossy(&self.id)
    }

    /// The payload as text; invalid UTF-8 is replaced by `U+FFFD`.
    pub fn payload_str(&self) -> std::borrow::Cow<'_, str> {
        String::from_utf8_lossy(&self.payload)
    }

    /// Parses the payload as JSON; `?` turns the error into a permanent failure.
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T, PayloadError> {
        serde_json::from_slice(&self.payload).map_err(PayloadError)
    }
}

/// The payload is not the JSON the handler expects.
#[derive(Debug, thiserror::Error)]
#[error("invalid JSON payload: {0}")]
pub struct PayloadError(#[source] pub serde_json::Error);

impl From<PayloadError> for Failure {
    fn from(e: PayloadError) -> Failure {
        // The same bytes will never parse on a retry.
        Failure::Permanent(e.to_string())
    }
}

/// Why a handler did not succeed, and what the host should do about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// Try again after this many milliseconds (counts as an attempt).
    RetryAfter(u64),
    /// Never retry: dead-letter the task now, with this reason.
    Permanent(String),
    /// Retry by the type's backoff policy, or dead-letter after the last attempt.
    Error(String),
}

impl Failure {
    /// A [`Failure::Error`] from anything printable.
    pub fn error(message: impl fmt::Display) -> Failure {
        Failure::Error(message.to_string())
    }

    /// A [`Failure::Permanent`] from anything printable.
    pub fn permanent(reason: impl fmt::Display) -> Failure {
        Failure::Permanent(reason.to_string())
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::RetryAfter(ms) => write!(f, "retry after {ms} ms"),
            Failure::Permanent(reason) => write!(f, "permanent failure: {reason}"),
            Failure::Error(message) => write!(f, "error: {message}"),
        }
    }
}

/// Severity of a log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Very detailed tracing.
    Trace,
    /// Debugging detail.
    Debug,
    /// Normal operation.
    Info,
    /// Something unusual, but handled.
    Warn,
    /// Something failed.
    Error,
}

/// Emits one log line through the host (prefer the [`info!`] etc. macros).
pub fn log(level: Level, message: &str) {
    let level = match level {
        Level::Trace => wit_log::Level::Trace,
        Level::Debug => wit_log::Level::Debug,
        Level::Info => wit_log::Level::Info,
        Level::Warn => wit_log::Level::Warn,
        Level::Error => wit_log::Level::Error,
    };
    wit_log::log(level, message);
}

/// Schedules a follow-up task, committed only if this run succeeds.
///
/// `due_ms` is in ms since the Unix epoch (use [`now_ms`] for "now"). The
/// host's runner.toml says which types this type may schedule into
/// (`may_schedule`); there, a task with the same id that is waiting or
/// dead-lettered is left as it is, unless the type is in `may_replace` (then
/// it is re-scheduled). Fails for a type not granted, an invalid type name,
/// an id over 1024 bytes, a payload over 1 MiB or more than 1000 follow-ups
/// in one run.
pub fn schedule(
    task_type: &str,
    id: impl AsRef<[u8]>,
    payload: impl AsRef<[u8]>,
    due_ms: u64,
) -> Result<(), ScheduleError> {
    wit_schedule::schedule(task_type, id.as_ref(), payload.as_ref(), due_ms).map_err(ScheduleError)
}

/// The host refused a follow-up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot schedule follow-up: {0}")]
pub struct ScheduleError(pub String);

impl From<ScheduleError> for Failure {
    fn from(e: ScheduleError) -> Failure {
        // Usually a bug in the handler (bad type name, oversized payload), but
        // retrying is the safe default.
        Failure::Error(e.to_string())
    }
}

/// Reports how far this run has got, for people and programs to watch
/// (`hourglass show`, the clients, the dashboard, the events stream).
///
/// `percent` is 0 to 100; `detail` is JSON text of at most 1024 bytes (`""`
/// for none), e.g. `{"rows": 1200}`. Only the latest report counts: the host
/// writes it to Redis within a quarter of a second, so report as often as is
/// convenient. It is kept with the task across retries (the next attempt's
/// watchers see where this one got to) and dropped when the task ends. Fails
/// for a percent over 100, or a detail over 1024 bytes or not JSON.
pub fn progress(percent: u8, detail: &str) -> Result<(), ProgressError> {
    wit_progress::report(percent, detail).map_err(ProgressError)
}

/// The host refused a progress report (a percent over 100, a detail too long or not JSON).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot report progress: {0}")]
pub struct ProgressError(pub String);

impl From<ProgressError> for Failure {
    fn from(e: ProgressError) -> Failure {
        // A bug in the handler: retrying will not fix it.
        Failure::Permanent(e.to_string())
    }
}

/// A per-type configuration value from `runner.toml` (`[types.<name>] config = { key = "..." }`).
///
/// Secrets (`key = { env = "NAME" }` or `{ file = "path" }`) arrive here
/// already resolved by the host; keep them out of log lines and error texts.
pub fn config(key: &str) -> Option<String> {
    wit_config::get(key)
}

/// The current time in ms since the Unix epoch (the guest's wall clock, from the host).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// Logs at [`Level::Trace`], with `format!` arguments.
#[macro_export]
macro_rules! trace {
    ($($arg:tt)*) => { $crate::log($crate::Level::Trace, &::std::format!($($arg)*)) };
}

/// Logs at [`Level::Debug`], with `format!` arguments.
#[macro_export]
macro_rules! debug {
    ($($arg:tt)*) => { $crate::log($crate::Level::Debug, &::std::format!($($arg)*)) };
}

/// Logs at [`Level::Info`], with `format!` arguments.
#[macro_export]
macro_rules! info {
    ($($arg:tt)*) => { $crate::log($crate::Level::Info, &::std::format!($($arg)*)) };
}

/// Logs at [`Level::Warn`], with `format!` arguments.
#[macro_export]
macro_rules! warn {
    ($($arg:tt)*) => { $crate::log($crate::Level::Warn, &::std::format!($($arg)*)) };
}

/// Logs at [`Level::Error`], with `format!` arguments.
#[macro_export]
macro_rules! error {
    ($($arg:tt)*) => { $crate::log($crate::Level::Error, &::std::format!($($arg)*)) };
}

/// Exports a plain function `fn(Task) -> Result<(), Failure>` as the component's handler.
///
/// Use it once, at the crate root of a `cdylib`: `hourglass_sdk::export_handler!(handle);`
#[macro_export]
macro_rules! export_handler {
    ($handler:path) => {
        const _: () = {
            struct __HourglassHandler;

            impl $crate::__private::Guest for __HourglassHandler {
                fn handle(
                    task: $crate::__private::WitTask,
                ) -> ::core::result::Result<(), $crate::__private::WitFailure> {
                    $crate::__private::call(task, $handler)
                }
            }

            $crate::__private::export!(__HourglassHandler);
        };
    };
}

#[doc(hidden)]
pub mod __private {
    //! What [`export_handler!`](crate::export_handler) expands to; not a public API.

    pub use crate::bindings::__export_task_handler as export;
    pub use crate::bindings::Guest;
    pub use crate::wit_types::{Failure as WitFailure, Task as WitTask};
    pub use wit_bindgen;

    /// Converts between the WIT types and the SDK's, around the user's function.
    pub fn call(
        task: WitTask,
        handler: impl FnOnce(crate::Task) -> Result<(), crate::Failure>,
    ) -> Result<(), WitFailure> {
        let task = crate::Task {
            id: task.id,
            task_type: task.task_type,
            payload: task.payload,
            attempt: task.attempt,
            due_ms: task.due_ms,
        };
        handler(task).map_err(|f| match f {
            crate::Failure::RetryAfter(ms) => WitFailure::RetryAfter(ms),
            crate::Failure::Permanent(reason) => WitFailure::Permanent(reason),
            crate::Failure::Error(message) => WitFailure::Error(message),
        })
    }
}
