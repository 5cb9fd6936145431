//! Hourglass: run delayed tasks from Redis in sandboxed WebAssembly handlers.
//!
//! # Layout
//!
//! A task flows one way through these modules:
//! due set → wake-up → claim → registry (task type → plugin) → runtime
//! (fresh `wasmtime::Store`) → outcome → settle.
//!
//! Along that path:
//!
//! - [`store`]: every Redis read and write, and the Lua scripts that make them atomic: the
//!   `hourglass-store` crate (`host/store/`), which links no wasmtime.
//! - [`fleet::wakeup`]: keyspace notifications (or polling) that wake a type's claim loop early.
//! - [`pipeline::claim`]: a type's claim loop: slots, leases taken, sleep until due, lease renewals.
//! - [`registry`]: which plugin serves which type; hot reload of `plugins/` and `runner.toml`.
//! - [`runtime`]: the wasmtime sandbox that runs one task in a fresh instance (compiled in a
//!   worker process under limits): the `hourglass-runtime` crate (`host/runtime/`), which links no Redis.
//! - [`pipeline::dispatch`]: each claimed task run in the sandbox; what its result means ([`backoff`] for retries).
//! - [`pipeline::settle`]: outcomes written in batches; slots freed once they are stored.
//! - [`pipeline::outbox`]: the follow-ups and group and graph reports those settles committed, moved on to their types.
//! - [`pipeline::progress`]: the progress running handlers report, the latest of each run written beside it.
//!
//! [`pipeline`] runs that path for every type and drains it at shutdown; the
//! leases held between claim and settle are [`pipeline::in_flight`], whose
//! methods are the steps of a lease's life. Its stages share
//! [`pipeline::state`], which imports none of them, reach Redis's task path
//! through [`pipeline::ledger`] (claim, renew, settle, hand back, outbox, progress), a
//! trait the store implements and unit tests script, and find handlers and
//! start runs through [`pipeline::execute`], which the registry and the
//! runtime's `Handler` implement and unit tests fake. Imports
//! point one way: no module imports one that imports it back
//! (`tests/host/layout.rs` checks it).
//!
//! Around it:
//!
//! - [`config`]: `runner.toml`. The vocabulary both crates below it share is the
//!   `hourglass-task` crate (`host/task/`), re-exported under the same names: [`task_type`]
//!   (the validated type name), [`task`] (a task's life: claimed, run, its outcome, how it
//!   ended) and [`group`] (workflow groups: ids, callbacks); from the store, [`target`] (where
//!   Redis is: one server or a cluster, ACL credentials, TLS).
//! - [`outbound`] (the runtime's), [`secrets`]: the HTTP allow-list (and the one TLS client setup), the config values plugins read.
//! - [`host`]: start-up wiring and signals; [`cli`]: the `hourglass` command line; [`show`]: where one
//!   task is, in words; [`clock`]: ms since the epoch and how to show them.
//! - [`admin`]: the admin HTTP server (health, metrics, dashboard).
//!
//! Three concepts span several files each, and live on a floor of their own:
//!
//! - [`recurring`]: recurring tasks, from `[schedules]` or the CLI, kept in Redis
//!   ([`recurring::rule`]: their cron and interval arithmetic);
//! - [`observe`]: metrics ([`observe::telemetry`]), traces, logs, and [`observe::health`]
//!   (Redis outages and per-type faults);
//! - [`fleet`]: several hosts on one Redis: [`fleet::presence`] (host ids and heartbeats),
//!   [`fleet::wakeup`], and [`fleet::managed`], a private `redis-server` for the quick start,
//!   started by [`redis_server`], the one spawner (also for `hourglass-bench` and the tests).
//!
//! The benchmark is a crate of its own (`bench/`, binary `hourglass-bench`);
//! `hourglass bench` runs it.

pub mod admin;
pub mod backoff;
pub mod cli;
pub mod clock;
pub mod config;
pub mod fleet;
pub mod host;
pub mod observe;
pub mod pipeline;
pub mod recurring;
pub mod registry;
pub mod secrets;
pub mod show;

// The sandbox is the `hourglass-runtime` crate (`host/runtime/`), the Redis
// side the `hourglass-store` crate (`host/store/`); these names keep one path
// per concept for the host's modules and for applications.
pub use hourglass_runtime as runtime;
pub use hourglass_runtime::outbound;
pub use hourglass_store as store;
pub use hourglass_store::{graph, group, redis_server, target, task, task_type};
