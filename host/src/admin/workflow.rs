//! The dashboard's workflow pages: one group (`/group`) and one graph (`/graph`), with their children or nodes, and how far they have got.

pub(super) mod graphs;
pub(super) mod groups;
