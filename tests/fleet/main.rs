//! Tests of several hosts: Redis Cluster, sharded types, many waiting tasks, and injected faults (kill -9, restarts, partitions, stalls).
//!
//! One test binary per area (tests/<area>/main.rs), each module a file of its own;
//! `cargo test --test fleet <module>::` runs one module.

#[path = "../support/mod.rs"]
mod support;

mod faults;
mod scale;
