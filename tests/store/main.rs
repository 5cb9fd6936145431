//! Tests of the store alone (`hourglass-store`, no wasmtime linked): the Redis contract of every script, and the model tests of the claim/renew/settle protocol and of workflow graphs.
//!
//! One test binary per area (tests/<area>/main.rs), each module a file of its own;
//! `cargo test --test store <module>::` runs one module.

#[path = "../support/server.rs"]
mod support;

mod graph_model;
mod model;
mod progress;
mod redis_contract;
