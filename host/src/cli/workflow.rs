//! `hourglass group …` and `hourglass graph …`: workflow groups and graphs opened, fed, shown and cancelled from the command line.

pub(super) mod graph;
pub(super) mod group;

pub use graph::GraphCommand;
pub use group::GroupCommand;
