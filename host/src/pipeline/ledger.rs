//! The Redis calls of a task's path (claim, renew, settle, hand back, move the outbox on, read traceparents, store progress) behind one trait: the store, or a fake in unit tests.
//!
//! The pipeline's stages call these through [`Ledger`], so what they do with
//! the answers (retrying through outages, stopping runs whose leases a
//! renewal finds lost, freeing slots only once outcomes are stored) is
//! tested in each stage with scripted answers (`fakes::Scripted`), without
//! Redis or wasmtime.

use std::future::Future;

use anyhow::Result;

use crate::store::{ClaimLimits, Committed, Extended, OutboxFlush, ProgressReport, Store};
use crate::task::{Claim, Ended, Lease, Settlement};
use crate::task_type::TaskType;

/// Where the pipeline claims tasks and writes what became of them.
pub(crate) trait Ledger {
    /// Reaps expired leases, then leases due tasks (`Store::claim`).
    fn claim(&self, t: &TaskType, limits: &ClaimLimits) -> impl Future<Output = Result<Claim>> + Send;
    /// Renews leases; per lease, whether it runs on, was cancelled or was lost (`Store::extend`).
    fn extend(
        &self,
        t: &TaskType,
        leases: &[Lease],
        lease_ms: u64,
    ) -> impl Future<Output = Result<Vec<Extended>>> + Send;
    /// Commits outcomes; per outcome how it ended, and what else it committed (`Store::settle`).
    fn settle(
        &self,
        t: &TaskType,
        batch: &[Settlement],
        events_maxlen: Option<u64>,
    ) -> impl Future<Output = Result<(Vec<Ended>, Committed)>> + Send;
    /// Hands leases back, due now for any host; how many were still held (`Store::release`).
    fn release(&self, t: &TaskType, leases: &[Lease]) -> impl Future<Output = Result<usize>> + Send;
    /// The traceparents clients left for claimed ids, in their order (`Store::trace_parents`; traced types only).
    fn trace_parents(&self, t: &TaskType, ids: &[Vec<u8>]) -> impl Future<Output = Result<Vec<Option<String>>>> + Send;
    /// Moves the type's outbox on: follow-ups and group reports to their types (`Store::flush_outbox`).
    fn flush_outbox(&self, t: &TaskType) -> impl Future<Output = Result<OutboxFlush>> + Send;
    /// Stores runs' latest progress while their leases hold; how many were stored (`Store::write_progress`).
    fn write_progress(
        &self,
        t: &TaskType,
        reports: &[ProgressReport],
        events_maxlen: Option<u64>,
    ) -> impl Future<Output = Result<usize>> + Send;
}

impl Ledger for Store {
    fn claim(&self, t: &TaskType, limits: &ClaimLimits) -> impl Future<Output = Result<Claim>> + Send {
        Store::claim(self, t, limits)
    }

    fn extend(
        &self,
        t: &TaskType,
        leases: &[Lease],
        lease_ms: u64,
    ) -> impl Future<Output = Result<Vec<Extended>>> + Send {
        Store::extend(self, t, leases, lease_ms)
    }

    fn settle(
        &self,
        t: &TaskType,
        batch: &[Settlement],
        events_maxlen: Option<u64>,
    ) -> impl Future<Output = Result<(Vec<Ended>, Committed)>> + Send {
        Store::settle(self, t, batch, events_maxlen)
    }

    fn release(&self, t: &TaskType, leases: &[Lease]) -> impl Future<Output = Result<usize>> + Send {
        Store::release(self, t, leases)
    }

    fn trace_parents(&self, t: &TaskType, ids: &[Vec<u8>]) -> impl Future<Output = Result<Vec<Option<String>>>> + Send {
        Store::trace_parents(self, t, ids)
    }

    fn flush_outbox(&self, t: &TaskType) -> impl Future<Output = Result<OutboxFlush>> + Send {
        Store::flush_outbox(self, t)
    }

    fn write_progress(
        &self,
        t: &TaskType,
        reports: &[ProgressReport],
        events_maxlen: Option<u64>,
    ) -> impl Future<Output = Result<usize>> + Send {
        Store::write_progress(self, t, reports, events_maxlen)
    }
}
