//! The fleet: how hosts share one Redis (their presence), learn of work early (wake-up), and the Redis a quick start manages.
//!
//! - [`presence`]: host ids, heartbeats, and which host holds which leases;
//! - [`wakeup`]: keyspace notifications (or polling) that wake a type's claim loop early,
//!   resubscribed when the master moves;
//! - [`managed`]: a private `redis-server` for the quick start, started only when nothing answers.

pub mod managed;
pub mod presence;
pub mod wakeup;
