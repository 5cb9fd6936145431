//! Tests of one host from outside: the runner, controls, recurring schedules, the CLI, the admin server and dashboard, traces, bad data in Redis, and workflows; and the shape of the crates (layout).
//!
//! One test binary per area (tests/<area>/main.rs), each module a file of its own;
//! `cargo test --test host <module>::` runs one module.

#[path = "../support/mod.rs"]
mod support;

mod admin;
mod bad_data;
mod cli;
mod cli_bulk;
mod controls;
mod layout;
mod limits;
mod progress;
mod recurring;
mod runner;
mod traces;
mod workflows;
