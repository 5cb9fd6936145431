//! Redis health as the runner sees it: a lost connection (one outage at a time) and faults of single types.
//!
//! A failed Redis call is one of two things. A connection problem (refused,
//! dropped, timed out, a server still loading or failing over) concerns every
//! type: it is logged once per outage. An error about one type's keys (a key
//! of the wrong type, a number that is not one, any other script error)
//! concerns that type only: the type is marked faulted, logged once per
//! fault with what the scripts said (the key, its type, the fix), shown in
//! `hourglass stats`, the dashboard and the `hourglass_type_faulted` gauge,
//! and cleared by the next call that succeeds. Other types carry on.

use hourglass_task::sync::LockExt;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tracing::{error, info};

use crate::task_type::TaskType;

pub use crate::store::{Trouble, classify};

/// The shared record of outages and per-type faults; cheap to clone.
#[derive(Clone, Default)]
pub struct Health {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    outage: AtomicBool,
    /// Fired when the Redis master changed: retries waiting out an outage go at once.
    master_changed: tokio::sync::Notify,
    /// Per type, per operation (claim, settle, ...): why it fails. Each
    /// operation clears only its own fault, so a claim that works does not
    /// hide a settle that does not (and the log does not flap between them).
    faults: Mutex<BTreeMap<TaskType, BTreeMap<&'static str, String>>>,
}

impl Health {
    /// A Redis call (`op`: claim, settle, ...) about `task_type` failed with `e`; returns what it was.
    pub fn failed(&self, task_type: &TaskType, op: &'static str, e: &anyhow::Error) -> Trouble {
        crate::observe::telemetry::redis_error();
        let trouble = classify(e);
        match &trouble {
            Trouble::Outage => self.outage(e),
            Trouble::Data(why) => {
                let mut faults = self.inner.faults.lock_unpoisoned();
                let of_type = faults.entry(task_type.clone()).or_default();
                if of_type.get(op) != Some(why) {
                    error!(task_type = %task_type, "type faulted ({op}): its tasks stay where they are until the data is fixed: {why}");
                    crate::observe::telemetry::type_faulted(task_type, true);
                    of_type.insert(op, why.clone());
                }
            }
        }
        trouble
    }

    /// Waits `backoff` before the next try of a failed call, or less: until
    /// the Redis master changes, when the next try should go to the new one now.
    pub async fn retry_after(&self, backoff: std::time::Duration) {
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = self.inner.master_changed.notified() => {}
        }
    }

    /// The Redis master changed (a failover): every retry waiting in
    /// [`Health::retry_after`] goes now.
    pub fn master_changed(&self) {
        crate::observe::telemetry::redis_master_changed();
        self.inner.master_changed.notify_waiters();
    }

    /// A Redis call not about one type failed with `e` (a heartbeat, a sweep).
    pub fn outage(&self, e: &anyhow::Error) {
        if !self.inner.outage.swap(true, Ordering::Relaxed) {
            error!("Redis is unreachable; retrying with backoff until it is back: {e:#}");
        }
    }

    /// A Redis call (`op`) about `task_type` succeeded: the outage, if any,
    /// and the type's fault in that operation are over.
    pub fn succeeded(&self, task_type: &TaskType, op: &'static str) {
        if self.inner.outage.swap(false, Ordering::Relaxed) {
            info!("Redis is reachable again; resuming");
        }
        let mut faults = self.inner.faults.lock_unpoisoned();
        if faults.is_empty() {
            return;
        }
        let Some(of_type) = faults.get_mut(task_type) else { return };
        if of_type.remove(op).is_some() {
            info!(task_type = %task_type, "type fault ({op}) cleared: resuming");
        }
        if of_type.is_empty() {
            faults.remove(task_type);
            crate::observe::telemetry::type_faulted(task_type, false);
        }
    }

    /// The types faulted now, with why (one line per failing operation).
    pub fn faults(&self) -> BTreeMap<TaskType, String> {
        let faults = self.inner.faults.lock_unpoisoned();
        faults
            .iter()
            .map(|(t, ops)| {
                (t.clone(), ops.iter().map(|(op, why)| format!("{op}: {why}")).collect::<Vec<_>>().join("; "))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server_error(code: &str, detail: &str) -> anyhow::Error {
        anyhow::Error::new(redis::make_extension_error(code.to_owned(), Some(detail.to_owned())))
            .context("cannot claim t tasks")
    }

    #[test]
    fn data_errors_and_outages_are_told_apart() {
        let fault = server_error("HGFAULT", "hourglass:{t}:payload is a string, not a hash");
        assert_eq!(classify(&fault), Trouble::Data("hourglass:{t}:payload is a string, not a hash".into()));
        assert!(matches!(classify(&server_error("WRONGTYPE", "Operation against a key")), Trouble::Data(_)));
        let io =
            anyhow::Error::new(redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused)));
        assert_eq!(classify(&io), Trouble::Outage);
        assert_eq!(classify(&server_error("LOADING", "Redis is loading the dataset in memory")), Trouble::Outage);
    }

    #[test]
    fn a_fault_is_per_type_and_cleared_by_success() {
        let health = Health::default();
        let (a, b): (TaskType, TaskType) = ("a".parse().unwrap(), "b".parse().unwrap());
        health.failed(&a, "settle", &server_error("HGFAULT", "bad key"));
        assert_eq!(health.faults()[&a], "settle: bad key");
        health.succeeded(&b, "settle");
        assert!(health.faults().contains_key(&a), "another type's success clears nothing");
        health.succeeded(&a, "claim");
        assert!(health.faults().contains_key(&a), "a working claim does not hide a failing settle");
        health.succeeded(&a, "settle");
        assert!(health.faults().is_empty());
    }
}
