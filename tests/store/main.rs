//! Tests of the store alone (`hourglass-store`, no wasmtime linked): the Redis contract of every script, and the model test of the claim/renew/settle protocol.
//!
//! One test binary per area (tests/<area>/main.rs), each module a file of its own;
//! `cargo test --test store <module>::` runs one module.

#[path = "../support/server.rs"]
mod support;

mod model;
mod progress;
mod redis_contract;
