//! Settle: write outcomes to Redis in batches, one script call each, and only then free the slots they held.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::mpsc;
use tracing::warn;

use super::execute::Plugins;
use super::in_flight::InFlight;
use super::ledger::Ledger;
use super::outbox::Outbox;
use super::state::{Permits, Queued, Runner, SettleQueue};
use crate::fleet::wakeup::Wakeups;
use crate::observe::health::Health;
use crate::observe::logging::clean_id;
use crate::observe::traces::RunSpan;
use crate::registry::Registry;
use crate::store::{Committed, Store};
use crate::task::{Ended, Settlement};
use crate::task_type::TaskType;

/// Most outcomes one settle call writes.
const SETTLE_MAX: usize = 512;
/// How long the settler waits for more outcomes of running tasks before writing what it has.
const SETTLE_LINGER: Duration = Duration::from_micros(500);

/// Outcomes the settler has taken from its queue for one script call.
#[derive(Default)]
struct Gathered {
    /// The settlements, side by side as the script call takes them.
    batch: Vec<Settlement>,
    /// What each of `batch`, in its order, holds until it is stored.
    held: Vec<Holding>,
    /// Unreported-outcome counters of the claims in `batch`, each once.
    claims: Vec<Arc<AtomicUsize>>,
}

/// What one queued outcome holds until the settle stores it: its slots, and
/// its run's span (traced types only), ended with what the settle committed.
struct Holding {
    /// Held, never read: dropping it frees the slots.
    _permits: Permits,
    span: Option<RunSpan>,
}

impl Gathered {
    fn push(&mut self, queued: Queued) {
        self.batch.push(queued.settlement);
        self.held.push(Holding { _permits: queued.permits, span: queued.span });
        if !self.claims.iter().any(|c| Arc::ptr_eq(c, &queued.claim_unreported)) {
            self.claims.push(queued.claim_unreported);
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

/// What the settler uses: where outcomes go (`L`), the config in force
/// (`P`: events, `max_running`), the health it reports to, the wake-ups it
/// gives when a slot frees, this host's id, and the outbox it moves on.
pub(crate) struct Settler<L = Store, P = Registry> {
    ledger: L,
    plugins: P,
    health: Health,
    wakeups: Wakeups,
    holder: Arc<str>,
    outbox: Outbox<L>,
}

impl Settler {
    pub(crate) fn of(runner: &Runner) -> Settler {
        Settler {
            ledger: runner.store.clone(),
            plugins: runner.registry.clone(),
            health: runner.health.clone(),
            wakeups: runner.wakeups.clone(),
            holder: runner.store.holder().into(),
            outbox: Outbox::of(runner),
        }
    }
}

impl<L: Ledger + Clone + Send + Sync + 'static, P: Plugins> Settler<L, P> {
    /// Writes outcomes in batches (one script call per batch), retrying
    /// through Redis outages and type faults so that no outcome is dropped;
    /// only once they are stored are their leases let go and their slots
    /// freed. It owns the type's outbox, moving it on after acks that
    /// committed follow-ups and every `outbox_every` (follow-ups left by a
    /// host that died between its ack and their delivery), and once more
    /// when the queue closes.
    pub(crate) async fn run(
        self,
        task_type: TaskType,
        in_flight: Arc<InFlight>,
        metrics: Arc<crate::observe::telemetry::TypeMetrics>,
        mut queue: SettleQueue,
        outbox_every: Duration,
    ) {
        let flush_wanted = Arc::new(tokio::sync::Notify::new());
        let flusher = tokio::spawn(self.outbox.clone().run(task_type.clone(), flush_wanted.clone(), outbox_every));
        let mut gathered = Gathered::default();
        while let Some(first) = queue.outcomes.recv().await {
            gathered.push(first);
            gathered.take_more(&mut queue).await;
            let Gathered { batch, mut held, .. } = std::mem::take(&mut gathered);
            let events = || self.plugins.config().events_maxlen(&task_type);
            let (results, committed) = write_outcomes(&self.ledger, &self.health, &task_type, &batch, events).await;
            // One event per stored outcome at trace level (target `hourglass::task`).
            if tracing::enabled!(target: "hourglass::task", tracing::Level::TRACE) {
                for (s, r) in batch.iter().zip(&results) {
                    tracing::trace!(
                        target: "hourglass::task",
                        event = "settled",
                        host = &*self.holder,
                        task_type = task_type.as_str(),
                        task_id = &*crate::observe::logging::clean_id_cow(&s.lease.id),
                        outcome = r.as_str(),
                    );
                }
            }
            for (s, r) in batch.iter().zip(&results) {
                if *r == Ended::Fenced {
                    warn!(task_type = %task_type, task_id = %clean_id(&s.lease.id), attempt = s.run.attempt,
                    "outcome ignored: the lease had expired and the task was claimed again")
                }
            }
            for (target, id) in &committed.kept_existing {
                super::outbox::kept_existing(&task_type, target, id);
            }
            metrics.settled(&batch, &results);
            // A run's span ends with what Redis committed, not what the run asked for.
            for ((holding, s), ended) in held.iter_mut().zip(&batch).zip(&results) {
                if let Some(span) = holding.span.take() {
                    span.end(*ended, s.outcome.error());
                }
            }
            in_flight.settled(batch.iter().map(|s| &s.lease));
            drop(held); // frees the concurrency slots only now that the outcome is stored
            if self.plugins.serving(&task_type).is_some_and(|e| e.policy.max_running > 0) {
                // A slot of max_running is free: this host's claim loop need not wait to poll for it.
                self.wakeups.of(&task_type).notify_one();
            }
            if committed.outboxed > 0 {
                // Follow-ups (in a cluster) and workflow reports wait in the outbox; move them on now.
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

/// Longest wait between attempts to write outcomes while Redis is down or the type faulted.
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// One settle call for `batch`, retried until it is written: the script
/// checks every key before its first write, so a failed call changed nothing.
/// Returns how each outcome ended and what else it committed.
async fn write_outcomes(
    ledger: &impl Ledger,
    health: &Health,
    task_type: &TaskType,
    batch: &[Settlement],
    events_maxlen: impl Fn() -> Option<u64>,
) -> (Vec<Ended>, Committed) {
    let mut backoff = Duration::from_millis(50);
    loop {
        match ledger.settle(task_type, batch, events_maxlen()).await {
            Ok(results) => {
                health.succeeded(task_type, "settle");
                return results;
            }
            Err(e) => {
                health.failed(task_type, "settle", &e);
                health.retry_after(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::sync::Semaphore;

    use super::*;
    use crate::pipeline::fakes::{Scripted, Served};
    use crate::task::{Lease, Outcome};

    fn queued(id: &str, claim: &Arc<AtomicUsize>) -> Queued {
        let slots = Arc::new(Semaphore::new(2));
        let permits = (slots.clone().try_acquire_owned().unwrap(), slots.try_acquire_owned().unwrap());
        let lease = Lease { id: id.as_bytes().to_vec(), token: 1, claim: 1 };
        let settlement = Settlement { lease, outcome: Outcome::Cancelled, run: Default::default() };
        Queued { settlement, span: None, permits, claim_unreported: claim.clone() }
    }

    #[test]
    fn a_batch_waits_for_its_claims_until_each_has_reported_every_outcome() {
        let (first, second) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(1)));
        let mut gathered = Gathered::default();
        gathered.push(queued("a", &first));
        gathered.push(queued("b", &first));
        assert_eq!(gathered.claims.len(), 1, "a claim is tracked once");
        assert!(gathered.claims_reported(), "the first claim has no outcome still to come");
        gathered.push(queued("c", &second));
        assert!(!gathered.claims_reported(), "the second claim still runs a task");
        second.store(0, Ordering::Release);
        assert!(gathered.claims_reported());
        assert_eq!(batch_ids(&gathered), ["a", "b", "c"]);
        assert_eq!(gathered.held.len(), 3, "every slot is held until the settle");
    }

    fn queue() -> (mpsc::UnboundedSender<Queued>, SettleQueue) {
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
        gathered.push(queued("a", &claim));
        // The claim's last outcome arrives while the gather lingers (the
        // spawned task runs only once it waits), as a run sends it: counted
        // down, queued, then the settler woken. It joins the batch.
        let last = queued("b", &claim);
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
        gathered.push(queued("c", &claim));
        tx.send(queued("d", &later)).ok().unwrap();
        let started = tokio::time::Instant::now();
        gathered.take_more(&mut queue).await;
        assert_eq!(batch_ids(&gathered), ["c", "d"]);
        assert!(started.elapsed() >= SETTLE_LINGER, "{:?}", started.elapsed());
        // A batch whose claims have reported everything does not linger at all.
        let mut gathered = Gathered::default();
        gathered.push(queued("e", &claim));
        let started = tokio::time::Instant::now();
        gathered.take_more(&mut queue).await;
        assert_eq!((batch_ids(&gathered), started.elapsed()), (vec!["e".to_owned()], Duration::ZERO));
    }

    #[tokio::test(start_paused = true)]
    async fn one_batch_holds_at_most_settle_max_outcomes() {
        let (tx, mut queue) = queue();
        let claim = Arc::new(AtomicUsize::new(0));
        for i in 0..SETTLE_MAX + 10 {
            tx.send(queued(&i.to_string(), &claim)).ok().unwrap();
        }
        let mut gathered = Gathered::default();
        gathered.push(queue.outcomes.recv().await.unwrap());
        gathered.take_more(&mut queue).await;
        assert_eq!(gathered.batch.len(), SETTLE_MAX);
        assert_eq!(queue.outcomes.len(), 10, "the rest waits for the next batch");
    }

    fn t() -> TaskType {
        "t".parse().unwrap()
    }

    fn outboxed(entries: usize) -> Committed {
        Committed { outboxed: entries, kept_existing: Vec::new() }
    }

    #[tokio::test(start_paused = true)]
    async fn outcomes_are_written_through_an_outage_once_redis_answers() {
        let ledger = Scripted::new();
        ledger.settles([
            Err(anyhow::anyhow!("Connection refused (os error 111)")),
            Err(anyhow::anyhow!("Connection refused (os error 111)")),
            Ok((vec![Ended::Succeeded, Ended::Fenced], outboxed(1))),
        ]);
        let batch: Vec<Settlement> = ["a", "b"]
            .iter()
            .map(|id| Settlement {
                lease: Lease { id: id.as_bytes().to_vec(), token: 1, claim: 1 },
                outcome: Outcome::Cancelled,
                run: Default::default(),
            })
            .collect();
        let started = tokio::time::Instant::now();
        let written = write_outcomes(&ledger, &Health::default(), &t(), &batch, || Some(7)).await;
        assert_eq!(
            written,
            (vec![Ended::Succeeded, Ended::Fenced], outboxed(1)),
            "the committed answer, as Redis gave it"
        );
        assert_eq!(ledger.calls(), ["settle 2 events Some(7)"; 3], "the same batch, three times");
        // Backoff between the failed calls: 50 ms, then 100 ms (paused time: exact).
        assert_eq!(started.elapsed(), Duration::from_millis(150));
    }

    #[tokio::test(start_paused = true)]
    async fn a_settler_lets_leases_and_slots_go_only_once_stored_and_moves_the_outbox_on_after_reports() {
        let ledger = Scripted::new();
        ledger.settles([
            Err(anyhow::anyhow!("Connection refused (os error 111)")),
            Ok((vec![Ended::Succeeded, Ended::Fenced], outboxed(1))), // a group report went into the outbox
        ]);
        let health = Health::default();
        let settler = Settler {
            ledger: ledger.clone(),
            plugins: Served::new("[types.t]\nevents = true\nevents_maxlen = 500\n"),
            health: health.clone(),
            wakeups: Wakeups::default(),
            holder: "this-host".into(),
            outbox: Outbox::new(ledger.clone(), health),
        };
        let in_flight = Arc::new(InFlight::default());
        let slots = Arc::new(Semaphore::new(4));
        let claim = Arc::new(AtomicUsize::new(0));
        let (tx, queue) = queue();
        let mut leases = Vec::new();
        for id in ["a", "b"] {
            let mut f = queued(id, &claim);
            f.permits = (slots.clone().try_acquire_owned().unwrap(), slots.clone().try_acquire_owned().unwrap());
            leases.push(f.settlement.lease.clone());
            in_flight.claimed([f.settlement.lease.clone()]);
            tx.send(f).ok().unwrap();
        }
        let metrics = Arc::new(crate::observe::telemetry::TypeMetrics::new(&t()));
        let every = Duration::from_secs(10);
        let handle = tokio::spawn(settler.run(t(), in_flight.clone(), metrics, queue, every));

        tokio::time::sleep(Duration::from_millis(25)).await; // within the backoff after the failed settle
        assert_eq!(slots.available_permits(), 0, "the slots are held while the outcomes are not stored");
        assert!(leases.iter().all(|l| in_flight.holds(l)), "and so are the leases");
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(slots.available_permits(), 4, "stored: the slots are free");
        assert!(in_flight.to_hand_back().is_empty(), "and the leases let go, the fenced one too");

        tokio::time::sleep(every).await; // a tick moves the outbox on unasked
        drop(tx);
        handle.await.unwrap();
        let calls = ledger.timed_calls();
        let at = |what: &str| calls.iter().filter(|(_, c)| c == what).map(|(at, _)| at.as_millis()).collect::<Vec<_>>();
        assert_eq!(at("settle 2 events Some(500)"), [0, 50], "retried with the same batch and the type's events cap");
        assert_eq!(
            at("flush"),
            [0, 50, 10_050, 10_075],
            "at start, after the settle that reported to a group, a tick later, and when the queue closed"
        );
    }
}
