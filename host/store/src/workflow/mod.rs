//! Workflows: work a run hands on through the outbox (follow-ups, groups, graphs), delivered exactly once, and the ends of their tasks reported back.
//!
//! - `entries.rs`: what the outbox holds and its encodings: a follow-up, a run's work on a group,
//!   a report (a group child's or a graph node's end);
//! - `groups.rs`: workflow groups (a callback once all children ended); `graphs.rs`: workflow
//!   graphs (each node once all its parents ended, or skipped); both open, add, show;
//! - `reports.rs`: the one delivery of reports to their groups and graphs;
//! - `outbox.rs`: the passes that move every entry on, each exactly once;
//! - `cancel.rs`: cancelling one task (a child's cancel reports at once), and so a graph;
//! - `progress.rs`: how far a group's or graph's tasks have got.

pub(crate) mod cancel;
pub(crate) mod entries;
pub(crate) mod graphs;
pub(crate) mod groups;
pub(crate) mod outbox;
pub(crate) mod progress;
pub(crate) mod reports;
