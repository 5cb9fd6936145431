//! Workflows as data: a group (children, then a callback once all ended) and a graph (nodes, each once its parents ended).
//!
//! - [`group`]: group ids, callbacks, when they fire, and the summary a callback receives;
//! - [`graph`]: a graph's nodes, the graph file (read within a memory budget, `graph/parse.rs`),
//!   and the checks of its shape.
//!
//! Both name their parent the same way ([`group::GroupRef`]: a home type and an id), and a
//! report of a child's or a node's end carries that reference (the store's `workflow/`).

pub mod graph;
pub mod group;
