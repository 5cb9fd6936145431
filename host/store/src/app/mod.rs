//! The application API: what an application (or the CLI) calls to schedule, find and manage tasks; the workflow module adds groups, graphs and cancel.
//!
//! - `tasks.rs`: schedule (upsert, if-absent, only-later, only-earlier), wait for replicas, pause and resume;
//! - `lookup.rs`: one task by id (`hourglass show`), and run-now / postpone of a scheduled one;
//! - `queues.rs`: stats, due buckets, the types present, dead letters;
//! - `recurring.rs`: recurring schedules put, removed and listed;
//! - `progress.rs`: the progress running handlers reported, as read back.

pub(crate) mod lookup;
pub(crate) mod progress;
pub(crate) mod queues;
pub(crate) mod recurring;
pub(crate) mod tasks;
