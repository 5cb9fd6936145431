//! The host API: what only a host may call, behind the `host` feature (the `hourglass` crate turns it on; an application linking this crate alone cannot reach it).
//!
//! - `claims.rs`: claim, settle, extend and release: the path every task takes;
//! - `runs.rs`: what runs need: clients' trace parents, a type's events stream;
//! - `progress.rs`: running handlers' progress written, fenced by the lease;
//! - `recurring.rs`: recurring schedules' next times kept known, and re-armed;
//! - `presence.rs`: host heartbeats, and who holds which leases;
//! - the outbox's passes ([`Store::flush_outbox`](crate::Store::flush_outbox)) are the workflow
//!   module's machinery, which this feature makes public.

pub(crate) mod claims;
pub(crate) mod presence;
pub(crate) mod progress;
pub(crate) mod recurring;
pub(crate) mod runs;
