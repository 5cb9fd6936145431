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
//! - [`group`]: workflow group ids, callbacks and when they fire;
//! - [`graph`]: workflow graphs as data: a node, the graph file (read within a memory budget,
//!   `graph/parse.rs`), the checks of its shape;
//! - [`clean`]: text from outside (ids, guest lines) escaped for one log line;
//! - [`sync`]: a poisoned lock's recovery, written once.

pub mod clean;
pub mod graph;
pub mod group;
pub mod sync;
pub mod task;
pub mod task_type;
