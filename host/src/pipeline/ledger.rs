//! The four writes of a task's path through Redis (claim, renew, settle, hand back) and its one read behind one trait: the store, or a fake in unit tests.
//!
//! The pipeline's stages call these through [`Ledger`], so what they do with
//! the answers (retrying through outages, stopping runs whose leases a
//! renewal finds lost, freeing slots only once outcomes are stored) is tested
//! here with scripted answers, without Redis or wasmtime.

use hourglass_task::sync::LockExt;
use std::collections::BTreeMap;
use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::Result;

use super::state::InFlight;
use crate::health::Health;
use crate::logging::clean_id;
use crate::store::{ClaimLimits, Extended, Store};
use crate::task::{Claim, Ended, Lease, Settlement};
use crate::task_type::TaskType;

/// Longest wait between attempts to write outcomes while Redis is down or the type faulted.
const MAX_BACKOFF: Duration = Duration::from_secs(2);

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
    /// Commits outcomes; per outcome how it ended, and the group reports put in the outbox (`Store::settle_reporting`).
    fn settle(
        &self,
        t: &TaskType,
        batch: &[Settlement],
        events_maxlen: Option<u64>,
    ) -> impl Future<Output = Result<(Vec<Ended>, usize)>> + Send;
    /// Hands leases back, due now for any host; how many were still held (`Store::release`).
    fn release(&self, t: &TaskType, leases: &[Lease]) -> impl Future<Output = Result<usize>> + Send;
    /// The traceparents clients left for claimed ids, in their order (`Store::trace_parents`; traced types only).
    fn trace_parents(&self, t: &TaskType, ids: &[Vec<u8>]) -> impl Future<Output = Result<Vec<Option<String>>>> + Send;
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
    ) -> impl Future<Output = Result<(Vec<Ended>, usize)>> + Send {
        Store::settle_reporting(self, t, batch, events_maxlen)
    }

    fn release(&self, t: &TaskType, leases: &[Lease]) -> impl Future<Output = Result<usize>> + Send {
        Store::release(self, t, leases)
    }

    fn trace_parents(&self, t: &TaskType, ids: &[Vec<u8>]) -> impl Future<Output = Result<Vec<Option<String>>>> + Send {
        Store::trace_parents(self, t, ids)
    }
}

/// One settle call for `batch`, retried until it is written: the script
/// checks every key before its first write, so a failed call changed nothing.
/// Returns how each outcome ended and how many group reports went into the outbox.
pub(crate) async fn write_outcomes(
    ledger: &impl Ledger,
    health: &Health,
    task_type: &TaskType,
    batch: &[Settlement],
    events_maxlen: impl Fn() -> Option<u64>,
) -> (Vec<Ended>, usize) {
    let mut backoff = Duration::from_millis(50);
    loop {
        match ledger.settle(task_type, batch, events_maxlen()).await {
            Ok(results) => {
                health.succeeded(task_type, "settle");
                return results;
            }
            Err(e) => {
                health.failed(task_type, "settle", &e);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}

/// Renews the leases in `due` and applies the answers to the runs in
/// flight: renewed ones are marked so, a cancelled one is stopped as
/// cancelled, a lost one is stopped where it is (nothing of it will be
/// settled). Returns, by claim, the ids whose handlers were still going when
/// their leases were found lost; an unreachable Redis changes nothing here
/// (`lease_watch` stops runs that go unrenewed too long).
pub(crate) async fn renew(
    ledger: &impl Ledger,
    health: &Health,
    task_type: &TaskType,
    in_flight: &InFlight,
    due: &[Lease],
    lease_ms: u64,
) -> BTreeMap<u64, Vec<String>> {
    let mut lost: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    let extended = match ledger.extend(task_type, due, lease_ms).await {
        Ok(extended) => extended,
        Err(e) => {
            health.failed(task_type, "extend", &e);
            return lost;
        }
    };
    health.succeeded(task_type, "extend");
    let mut map = in_flight.lock_unpoisoned();
    for (key, extended) in due.iter().zip(extended) {
        match (extended, map.get_mut(key)) {
            (Extended::Extended, Some(run)) => run.renewed = Instant::now(),
            (Extended::Cancelled, Some(run)) => {
                // The cancel message was missed: the mark in Redis says so.
                run.renewed = Instant::now();
                run.stop.cancel();
            }
            (Extended::Lost, Some(run)) => {
                if run.lose() {
                    lost.entry(key.claim).or_default().push(clean_id(&key.id));
                }
            }
            (_, None) => {}
        }
    }
    lost
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;
    use std::sync::{Arc, Mutex};

    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::pipeline::state::InFlightRun;
    use crate::task::Outcome;

    /// A settle's answer: how each outcome ended, and the group reports.
    type Settled = Result<(Vec<Ended>, usize)>;

    /// Answers scripted per call; records what it was asked.
    #[derive(Default)]
    struct Scripted {
        settles: Mutex<Vec<Settled>>,
        extends: Mutex<Vec<Result<Vec<Extended>>>>,
        calls: Mutex<Vec<String>>,
    }

    impl Ledger for Scripted {
        async fn claim(&self, _: &TaskType, _: &ClaimLimits) -> Result<Claim> {
            unreachable!("not scripted")
        }

        async fn extend(&self, _: &TaskType, leases: &[Lease], lease_ms: u64) -> Result<Vec<Extended>> {
            self.calls.lock().unwrap().push(format!("extend {} for {lease_ms} ms", leases.len()));
            self.extends.lock().unwrap().remove(0)
        }

        async fn settle(&self, _: &TaskType, batch: &[Settlement], events: Option<u64>) -> Settled {
            self.calls.lock().unwrap().push(format!("settle {} events {events:?}", batch.len()));
            self.settles.lock().unwrap().remove(0)
        }

        async fn release(&self, _: &TaskType, leases: &[Lease]) -> Result<usize> {
            Ok(leases.len())
        }

        async fn trace_parents(&self, _: &TaskType, _: &[Vec<u8>]) -> Result<Vec<Option<String>>> {
            unreachable!("not scripted")
        }
    }

    fn t() -> TaskType {
        "work".parse().unwrap()
    }

    fn lease(id: &str, claim: u64) -> Lease {
        Lease { id: id.as_bytes().to_vec(), token: claim, claim }
    }

    fn running(ended: bool) -> InFlightRun {
        InFlightRun {
            renewed: Instant::now() - Duration::from_secs(60),
            stop: CancellationToken::new(),
            lost: CancellationToken::new(),
            ended: Arc::new(AtomicBool::new(ended)),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn outcomes_are_written_through_an_outage_once_redis_answers() {
        let ledger = Scripted::default();
        *ledger.settles.lock().unwrap() = vec![
            Err(anyhow::anyhow!("Connection refused (os error 111)")),
            Err(anyhow::anyhow!("Connection refused (os error 111)")),
            Ok((vec![Ended::Succeeded, Ended::Fenced], 1)),
        ];
        let batch: Vec<Settlement> = ["a", "b"]
            .iter()
            .map(|id| Settlement { lease: lease(id, 1), outcome: Outcome::Cancelled, run: Default::default() })
            .collect();
        let health = Health::default();
        let started = tokio::time::Instant::now();
        let written = write_outcomes(&ledger, &health, &t(), &batch, || Some(7)).await;
        assert_eq!(written, (vec![Ended::Succeeded, Ended::Fenced], 1), "the committed answer, as Redis gave it");
        assert_eq!(*ledger.calls.lock().unwrap(), ["settle 2 events Some(7)"; 3], "the same batch, three times");
        // Backoff between the failed calls: 50 ms, then 100 ms (paused time: exact).
        assert_eq!(started.elapsed(), Duration::from_millis(150));
    }

    #[tokio::test]
    async fn a_renewal_stops_lost_runs_and_cancelled_ones_and_marks_the_rest_renewed() {
        let ledger = Scripted::default();
        *ledger.extends.lock().unwrap() =
            vec![Ok(vec![Extended::Extended, Extended::Cancelled, Extended::Lost, Extended::Lost, Extended::Extended])];
        let due = [lease("kept", 1), lease("cancelled", 1), lease("lost", 2), lease("lost-done", 2), lease("gone", 3)];
        let in_flight = InFlight::default();
        {
            let mut map = in_flight.lock().unwrap();
            map.insert(due[0].clone(), running(false));
            map.insert(due[1].clone(), running(false));
            map.insert(due[2].clone(), running(false));
            // Its handler already ended: its outcome will be fenced, there is nothing to stop.
            map.insert(due[3].clone(), running(true));
            // "gone" was settled meanwhile: not in the map, its answer is ignored.
        }
        let lost = renew(&ledger, &Health::default(), &t(), &in_flight, &due, 30_000).await;
        assert_eq!(lost, BTreeMap::from([(2, vec!["lost".to_owned()])]), "only the handler still going is reported");
        assert_eq!(*ledger.calls.lock().unwrap(), ["extend 5 for 30000 ms"]);
        let map = in_flight.lock().unwrap();
        let run = |id: &str| &map[&due.iter().find(|l| l.id == id.as_bytes()).unwrap().clone()];
        assert!(run("kept").renewed.elapsed() < Duration::from_secs(1) && !run("kept").stop.is_cancelled());
        assert!(run("cancelled").stop.is_cancelled() && !run("cancelled").lost.is_cancelled());
        assert!(run("lost").lost.is_cancelled() && run("lost-done").lost.is_cancelled());
        assert!(run("lost").renewed.elapsed() >= Duration::from_secs(60), "a lost lease is not renewed");
        assert!(!map.contains_key(&due[4]));
    }

    #[tokio::test]
    async fn a_renewal_redis_does_not_answer_changes_no_run() {
        let ledger = Scripted::default();
        *ledger.extends.lock().unwrap() = vec![Err(anyhow::anyhow!("Connection refused (os error 111)"))];
        let due = [lease("a", 1)];
        let in_flight = InFlight::default();
        in_flight.lock().unwrap().insert(due[0].clone(), running(false));
        let lost = renew(&ledger, &Health::default(), &t(), &in_flight, &due, 30_000).await;
        assert!(lost.is_empty());
        let map = in_flight.lock().unwrap();
        let run = &map[&due[0]];
        assert!(!run.lost.is_cancelled() && !run.stop.is_cancelled());
        assert!(run.renewed.elapsed() >= Duration::from_secs(60), "not renewed: lease_watch will stop it in time");
    }
}
