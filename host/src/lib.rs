//! Hourglass: run delayed tasks from Redis in sandboxed WebAssembly handlers.
//!
//! # Layout
//!
//! A task flows one way through these modules:
//! due set → wake-up → claim → registry (task type → plugin) → runtime
//! (fresh `Store`) → outcome → settle.
//!
//! - [`task_type`]: the validated task type name.
//! - [`config`]: `runner.toml`, parsed from a string and validated.
//! - [`task`]: a claimed task and a follow-up, as they travel between modules.
//! - [`store`]: every Redis read and write, and the Lua scripts that make them atomic.
//! - [`target`]: where Redis is: one server or a cluster, ACL credentials, TLS.
//! - [`wakeup`]: keyspace notifications (or polling) that wake a type's worker early.
//! - [`hosts`]: host ids, heartbeats, and which host holds which leases.
//! - [`registry`]: which plugin serves which type; hot reload of `plugins/` and `runner.toml`.
//! - [`runtime`]: the wasmtime sandbox that runs one task in a fresh instance.
//! - [`outbound`]: `allowed_outbound_hosts`, the per-type allow-list of outbound HTTP targets.
//! - [`secrets`]: plugin config values and secrets (`{ env = "NAME" }`, `{ file = "path" }`).
//! - [`backoff`]: retry delays (capped exponential with jitter).
//! - [`runner`]: claim → dispatch → settle loops, lease heartbeats, graceful shutdown.
//! - [`managed`]: a private `redis-server` for the quick start.
//! - [`cli`]: the `hourglass` command line.
//! - [`admin`]: the admin HTTP server (health, metrics, dashboard); [`telemetry`]: the metrics it serves.
//! - [`bench`]: `hourglass bench`, the in-process benchmark.

pub mod admin;
pub mod backoff;
pub mod bench;
pub mod cli;
pub mod config;
pub mod logging;
pub mod hosts;
pub mod managed;
pub mod outbound;
pub mod registry;
pub mod runner;
pub mod runtime;
pub mod secrets;
pub mod store;
pub mod target;
pub mod task;
pub mod task_type;
pub mod telemetry;
pub mod wakeup;
