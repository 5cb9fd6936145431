//! Settle: write outcomes to Redis in batches, one script call each, and only then free the slots they held.

use hourglass_task::sync::LockExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::mpsc;
use tracing::warn;

use super::ledger::write_outcomes;
use super::outbox::Outbox;
use super::state::{Finished, InFlight, Permits, Runner, SettleQueue};
use crate::health::Health;
use crate::logging::clean_id;
use crate::registry::Registry;
use crate::store::Store;
use crate::task::{Ended, Outcome, Settlement};
use crate::task_type::TaskType;
use crate::traces::RunSpan;
use crate::wakeup::Wakeups;

/// Most outcomes one settle call writes.
const SETTLE_MAX: usize = 512;
/// How long the settler waits for more outcomes of running tasks before writing what it has.
const SETTLE_LINGER: Duration = Duration::from_micros(500);

/// Outcomes the settler has taken from its queue for one script call.
#[derive(Default)]
struct Gathered {
    batch: Vec<Settlement>,
    permits: Vec<Permits>,
    /// The runs' spans (traced types only), ended with what the settle committed.
    spans: Vec<(usize, RunSpan)>,
    /// Unreported-outcome counters of the claims in `batch`, each once.
    claims: Vec<Arc<AtomicUsize>>,
}

impl Gathered {
    fn push(&mut self, finished: Finished) {
        if let Some(span) = finished.span {
            self.spans.push((self.batch.len(), span));
        }
        self.batch.push(finished.settlement);
        self.permits.push(finished.permits);
        if !self.claims.iter().any(|c| Arc::ptr_eq(c, &finished.claim_unreported)) {
            self.claims.push(finished.claim_unreported);
        }
    }

    /// Takes what is queued; while the claims in hand still have tasks
    /// running, lingers briefly for them, so that one script call settles
    /// whole claims rather than one or two tasks. Later claims are not
    /// waited for: their slots are what the next claim is made of, so
    /// merging them would stall the pipeline.
    async fn take_more(&mut self, queue: &mut SettleQueue) {
        let linger_until = tokio::time::Instant::now() + SETTLE_LINGER;
        while self.batch.len() < SETTLE_MAX {
            match queue.outcomes.try_recv() {
                Ok(next) => self.push(next),
                Err(mpsc::error::TryRecvError::Disconnected) => break,
                Err(mpsc::error::TryRecvError::Empty) if self.claims_reported() => break,
                // Woken when a claim's last outcome is queued, not by each
                // outcome: what came meanwhile is taken at the next turn.
                Err(mpsc::error::TryRecvError::Empty) => {
                    if tokio::time::timeout_at(linger_until, queue.claim_reported.notified()).await.is_err() {
                        break;
                    }
                }
            }
        }
    }

    /// Every outcome of the claims in hand is queued (and so taken or about to be).
    fn claims_reported(&self) -> bool {
        self.claims.iter().all(|c| c.load(Ordering::Acquire) == 0)
    }
}

/// What the settler uses: where outcomes go, the type's policy (events,
/// `max_running`), the health it reports to, the wake-ups it gives when a
/// slot frees, and the outbox it moves on after acks with follow-ups.
pub(crate) struct Settler {
    store: Store,
    registry: Registry,
    health: Health,
    wakeups: Wakeups,
    outbox: Outbox,
}

impl Settler {
    pub(crate) fn of(runner: &Runner) -> Settler {
        Settler {
            store: runner.store.clone(),
            registry: runner.registry.clone(),
            health: runner.health.clone(),
            wakeups: runner.wakeups.clone(),
            outbox: Outbox::of(runner),
        }
    }

    /// Writes outcomes in batches (one script call per batch), retrying
    /// through Redis outages and type faults so that no outcome is dropped.
    pub(crate) async fn run(
        self,
        task_type: TaskType,
        in_flight: InFlight,
        metrics: Arc<crate::telemetry::TypeMetrics>,
        mut queue: SettleQueue,
    ) {
        // The outbox moves on beside the settles, not between them: one flush
        // at a time, and asks made during a flush coalesce into one more.
        let flush_wanted = Arc::new(tokio::sync::Notify::new());
        let flusher = tokio::spawn({
            let (outbox, task_type, wanted) = (self.outbox.clone(), task_type.clone(), flush_wanted.clone());
            async move {
                loop {
                    wanted.notified().await;
                    outbox.flush(&task_type).await;
                }
            }
        });
        let mut gathered = Gathered::default();
        while let Some(first) = queue.outcomes.recv().await {
            gathered.push(first);
            gathered.take_more(&mut queue).await;
            let Gathered { batch, permits, spans, .. } = std::mem::take(&mut gathered);
            let events = || self.registry.config().events_maxlen(&task_type);
            let (results, group_reports) = write_outcomes(&self.store, &self.health, &task_type, &batch, events).await;
            // One event per stored outcome at trace level (target `hourglass::task`).
            if tracing::enabled!(target: "hourglass::task", tracing::Level::TRACE) {
                for (s, r) in batch.iter().zip(&results) {
                    tracing::trace!(
                        target: "hourglass::task",
                        event = "settled",
                        host = self.store.holder(),
                        task_type = task_type.as_str(),
                        task_id = &*crate::logging::clean_id_cow(&s.lease.id),
                        outcome = r.as_str(),
                    );
                }
            }
            // Group children that ended left reports for their groups in the outbox.
            let mut committed_followups = group_reports > 0;
            for (s, r) in batch.iter().zip(&results) {
                match (r, &s.outcome) {
                    (Ended::Fenced, _) => {
                        warn!(task_type = %task_type, task_id = %clean_id(&s.lease.id), attempt = s.run.attempt,
                        "outcome ignored: the lease had expired and the task was claimed again")
                    }
                    (Ended::Succeeded, Outcome::Ack { followups, groups }) => {
                        committed_followups |= !followups.is_empty() || !groups.is_empty()
                    }
                    _ => {}
                }
            }
            metrics.settled(&batch, &results);
            // A run's span ends with what Redis committed, not what the run asked for.
            for (i, span) in spans {
                span.end(results[i], batch[i].outcome.error());
            }
            {
                let mut map = in_flight.lock_unpoisoned();
                for s in &batch {
                    map.remove(&s.lease);
                }
            }
            drop(permits); // frees the concurrency slots only now that the outcome is stored
            if self.registry.get(&task_type).is_some_and(|e| e.policy.max_running > 0) {
                // A slot of max_running is free: this host's claim loop need not wait to poll for it.
                self.wakeups.of(&task_type).notify_one();
            }
            if committed_followups {
                // The acks are committed with their follow-ups in the outbox; move them on now.
                flush_wanted.notify_one();
            }
        }
        // Every step of a flush runs once (markers), so stopping one midway
        // is safe; the last flush moves on what the last settles committed.
        flusher.abort();
        let _ = flusher.await;
        self.outbox.flush(&task_type).await;
    }
}

#[cfg(test)]
mod tests {
    use tokio::sync::Semaphore;

    use super::*;
    use crate::task::Lease;

    fn finished(id: &str, claim: &Arc<AtomicUsize>) -> Finished {
        let slots = Arc::new(Semaphore::new(2));
        let permits = (slots.clone().try_acquire_owned().unwrap(), slots.try_acquire_owned().unwrap());
        let lease = Lease { id: id.as_bytes().to_vec(), token: 1, claim: 1 };
        let settlement = Settlement { lease, outcome: Outcome::Cancelled, run: Default::default() };
        Finished { settlement, span: None, permits, claim_unreported: claim.clone() }
    }

    #[test]
    fn a_batch_waits_for_its_claims_until_each_has_reported_every_outcome() {
        let (first, second) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(1)));
        let mut gathered = Gathered::default();
        gathered.push(finished("a", &first));
        gathered.push(finished("b", &first));
        assert_eq!(gathered.claims.len(), 1, "a claim is tracked once");
        assert!(gathered.claims_reported(), "the first claim has no outcome still to come");
        gathered.push(finished("c", &second));
        assert!(!gathered.claims_reported(), "the second claim still runs a task");
        second.store(0, Ordering::Release);
        assert!(gathered.claims_reported());
        assert_eq!(batch_ids(&gathered), ["a", "b", "c"]);
        assert_eq!(gathered.permits.len(), 3, "every slot is held until the settle");
    }

    fn queue() -> (mpsc::UnboundedSender<Finished>, SettleQueue) {
        let (tx, outcomes) = mpsc::unbounded_channel();
        (tx, SettleQueue { outcomes, claim_reported: Arc::default() })
    }

    fn batch_ids(gathered: &Gathered) -> Vec<String> {
        gathered.batch.iter().map(|s| String::from_utf8_lossy(&s.lease.id).into_owned()).collect()
    }

    // Paused time: the linger is stepped by tokio, not by this machine's speed.
    #[tokio::test(start_paused = true)]
    async fn it_lingers_for_its_claims_outcomes_still_to_come_but_not_for_later_claims() {
        let (tx, mut queue) = queue();
        let claim = Arc::new(AtomicUsize::new(1));
        let mut gathered = Gathered::default();
        gathered.push(finished("a", &claim));
        // The claim's last outcome arrives while the gather lingers (the
        // spawned task runs only once it waits), as a run sends it: counted
        // down, queued, then the settler woken. It joins the batch.
        let last = finished("b", &claim);
        let (sender, counter, reported) = (tx.clone(), claim.clone(), queue.claim_reported.clone());
        tokio::spawn(async move {
            counter.store(0, Ordering::Release);
            sender.send(last).ok().unwrap();
            reported.notify_one();
        });
        let started = tokio::time::Instant::now();
        gathered.take_more(&mut queue).await;
        assert_eq!(started.elapsed(), Duration::ZERO, "woken by the claim's last outcome, not by the linger's end");
        assert_eq!(batch_ids(&gathered), ["a", "b"]);

        // What is queued is taken, a later claim's outcome too; that claim
        // then still runs a task, so the gather lingers for it, and gives up.
        let later = Arc::new(AtomicUsize::new(1));
        let mut gathered = Gathered::default();
        gathered.push(finished("c", &claim));
        tx.send(finished("d", &later)).ok().unwrap();
        let started = tokio::time::Instant::now();
        gathered.take_more(&mut queue).await;
        assert_eq!(batch_ids(&gathered), ["c", "d"]);
        assert!(started.elapsed() >= SETTLE_LINGER, "{:?}", started.elapsed());
        // A batch whose claims have reported everything does not linger at all.
        let mut gathered = Gathered::default();
        gathered.push(finished("e", &claim));
        let started = tokio::time::Instant::now();
        gathered.take_more(&mut queue).await;
        assert_eq!((batch_ids(&gathered), started.elapsed()), (vec!["e".to_owned()], Duration::ZERO));
    }

    #[tokio::test(start_paused = true)]
    async fn one_batch_holds_at_most_settle_max_outcomes() {
        let (tx, mut queue) = queue();
        let claim = Arc::new(AtomicUsize::new(0));
        for i in 0..SETTLE_MAX + 10 {
            tx.send(finished(&i.to_string(), &claim)).ok().unwrap();
        }
        let mut gathered = Gathered::default();
        gathered.push(queue.outcomes.recv().await.unwrap());
        gathered.take_more(&mut queue).await;
        assert_eq!(gathered.batch.len(), SETTLE_MAX);
        assert_eq!(queue.outcomes.len(), 10, "the rest waits for the next batch");
    }
}
