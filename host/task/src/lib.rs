//! Hourglass's vocabulary: what a task type, a task, its outcome, a workflow group and a graph are.
//!
//! Every other crate speaks these words: `hourglass-store` writes them to
//! Redis, `hourglass-runtime` hands them to plugins, and the host moves them
//! between the two. This crate does no I/O and links neither redis nor
//! wasmtime, so both sides can depend on it without depending on each other.
//!
//! # Layout
//!
//! - [`task_type`]: the validated type name, its shards and their hash tags;
//! - [`task`]: a task's life: claimed, run, its outcome, how it ended once settled;
//! - [`workflow`]: workflow groups (ids, callbacks, when they fire) and graphs (a node, the
//!   graph file, read within a memory budget, the checks of its shape), re-exported as
//!   [`group`] and [`graph`], the names every crate and application uses;
//! - [`clean`]: text from outside (ids, guest lines) escaped for one log line;
//! - [`sync`]: a poisoned lock's recovery, written once.

pub mod clean;
pub mod sync;
pub mod task;
pub mod task_type;
pub mod workflow;

pub use workflow::{graph, group};
