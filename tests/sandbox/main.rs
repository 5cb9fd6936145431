//! Tests of the sandbox: the runtime's limits and host calls, hostile plugins beside ordinary tasks, isolation between tasks, outbound HTTP, the Python and JavaScript plugins, and JavaScript on both engines.
//!
//! One test binary per area (tests/<area>/main.rs), each module a file of its own;
//! `cargo test --test sandbox <module>::` runs one module.

#[path = "../support/mod.rs"]
mod support;

mod compile;
mod containment;
mod http;
mod isolation;
mod javascript;
mod polyglot;
mod progress;
mod runtime;
mod warm_up;
