//! Tests of the sandbox: the runtime's limits and host calls, hostile plugins beside ordinary tasks, isolation between tasks, outbound HTTP, and the Python and JavaScript plugins.
//!
//! One test binary per area (tests/<area>/main.rs), each module a file of its own;
//! `cargo test --test sandbox <module>::` runs one module.

#[path = "../support/mod.rs"]
mod support;

mod compile;
mod containment;
mod http;
mod isolation;
mod polyglot;
mod progress;
mod runtime;
mod warm_up;
