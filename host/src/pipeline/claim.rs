//! Claim: a type's loop that takes due tasks under a lease as slots free up, sleeps until the next is due, and renews leases.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use super::dispatch::Dispatcher;
use super::execute::Plugins;
use super::in_flight::InFlight;
use super::ledger::Ledger;
use super::state::{Permits, Runner, TypeState};
use crate::config::TypePolicy;
use crate::fleet::wakeup::Wakeups;
use crate::observe::health::{Health, Trouble};
use crate::observe::logging::clean_id;
use crate::registry::Registry;
use crate::store::{ClaimLimits, Store};
use crate::task::{Claim, Lease};
use crate::task_type::TaskType;

/// Longest idle sleep when keyspace notifications are live: a safety net, not the wake-up path.
const IDLE_WITH_NOTIFICATIONS: Duration = Duration::from_secs(2);
/// Ids longer than this are dead-lettered at claim time.
const MAX_ID_BYTES: usize = 1024;
/// Longest wait between claims while Redis is down or the type is faulted.
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// Most tasks one claim of a type takes: `batch_size`, but no more than
/// half of the type's slots. A claim's slots come back only when its tasks
/// are settled, so a claim that takes every slot leaves Redis idle while
/// the tasks run and the host idle while Redis claims and settles; with
/// halves, one claim is being claimed while the other's tasks run and
/// settle. Halves rather than quarters: claims twice as large cost a
/// burst 11 % less host CPU and 20 % less Redis CPU per task, and drained
/// it 7 % faster (BENCHMARKS.md, round 23).
pub(crate) fn claim_size(batch_size: usize, type_concurrency: usize) -> usize {
    batch_size.min(type_concurrency / 2).max(1)
}

/// Which part of its type's throttles a claim loop takes: shard `index` of
/// `of` (a tag being drained, none of the current shards, takes the smallest
/// part, as shard `of` would).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ShardPart {
    pub(crate) index: u16,
    pub(crate) of: u16,
}

impl ShardPart {
    /// The part of `task_type` (a type or one of its shard tags) as `store` shards it.
    pub(crate) fn of(store: &Store, task_type: &TaskType) -> ShardPart {
        let of = store.shard_count(task_type);
        ShardPart { index: store.shard_index(task_type).unwrap_or(of), of }
    }
}

/// What a type's claim loop uses: where tasks are (`L`), which plugin serves
/// the type and its policy (`P`), its wake-ups, the health it reports to,
/// the global slots, the shutdown signal, the runner's timing settings, the
/// dispatcher its claims go to, and what renews their leases.
pub(crate) struct Claimer<L = Store, P = Registry> {
    ledger: L,
    plugins: P,
    wakeups: Wakeups,
    health: Health,
    /// Slots of the global `runner.concurrency`.
    global: Arc<Semaphore>,
    /// Cancelled at shutdown: no new claims.
    stop_claiming: CancellationToken,
    poll_interval: Duration,
    lease: Duration,
    dispatcher: Dispatcher<L>,
    renewer: Renewer<L>,
}

impl Claimer {
    pub(crate) fn of(runner: &Runner) -> Claimer {
        Claimer {
            ledger: runner.store.clone(),
            plugins: runner.registry.clone(),
            wakeups: runner.wakeups.clone(),
            health: runner.health.clone(),
            global: runner.global.clone(),
            stop_claiming: runner.stop_claiming.clone(),
            poll_interval: runner.poll_interval,
            lease: runner.lease,
            dispatcher: Dispatcher::of(runner),
            renewer: Renewer { ledger: runner.store.clone(), health: runner.health.clone(), lease: runner.lease },
        }
    }
}

impl<L: Ledger + Clone + Send + Sync + 'static, P: Plugins> Claimer<L, P> {
    /// Claims and dispatches the tasks of one type (or shard, taking `part`
    /// of its throttles) until shutdown or until the type loses its plugin.
    pub(crate) async fn run(self, task_type: TaskType, part: ShardPart, state: Arc<TypeState>) {
        let wakeup = self.wakeups.of(&task_type);
        let heartbeat = tokio::spawn(self.renewer.clone().run(task_type.clone(), state.clone()));
        let lease_watch = tokio::spawn(lease_watch(self.lease, task_type.clone(), state.clone()));
        let mut backoff = Duration::from_millis(50);
        let mut was_paused = false;
        loop {
            if self.stop_claiming.is_cancelled() {
                break;
            }
            let Some(permits) = self.claim_slots(&state).await else {
                break;
            };
            // Looked up once slots are free, just before the claim: a reload
            // applied while this loop waited for slots governs what it claims.
            let Some(entry) = self.plugins.serving(&task_type) else {
                info!(task_type = %task_type, "no plugin serves this type any more: claims stopped");
                break;
            };
            // Registered before the claim, so a notification during it is not lost.
            let notified = wakeup.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();

            let limits = self.limits(&entry.policy, part, permits.len());
            let claim = match self.ledger.claim(&task_type, &limits).await {
                Ok(claim) => claim,
                Err(e) => {
                    drop(permits);
                    // Both an outage and a fault of this type's keys are waited out;
                    // the claim script wrote nothing, so every task is where it was.
                    let _: Trouble = self.health.failed(&task_type, "claim", &e);
                    tokio::select! {
                        _ = self.stop_claiming.cancelled() => break,
                        _ = self.health.retry_after(backoff) => {}
                    }
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                    continue;
                }
            };
            backoff = Duration::from_millis(50);
            self.health.succeeded(&task_type, "claim");
            report(&task_type, &state, &claim, &mut was_paused);
            let claimed_all = claim.tasks.len() == limits.max_tasks;
            let idle = if self.wakeups.live() { IDLE_WITH_NOTIFICATIONS } else { self.poll_interval };
            let sleep = sleep_after(&claim, idle);
            // Each task takes one slot; the slots left over are freed here.
            let runnable = claim.tasks.into_iter().zip(permits).collect();
            self.dispatcher.dispatch(&state, &entry, runnable);
            if claimed_all || sleep.is_zero() {
                continue; // more may be due right now
            }
            tokio::select! {
                _ = self.stop_claiming.cancelled() => break,
                _ = notified => {}
                _ = tokio::time::sleep(sleep) => {}
            }
        }
        heartbeat.abort();
        lease_watch.abort();
        if !self.stop_claiming.is_cancelled() {
            state.stopped.store(true, Ordering::Relaxed);
        }
    }

    /// The slots of one claim: waits for one, then takes as many more as are
    /// free right now, up to the type's claim size; `None` at shutdown.
    async fn claim_slots(&self, state: &TypeState) -> Option<Vec<Permits>> {
        let first = self.acquire(state).await?;
        let mut permits = vec![first];
        while permits.len() < state.claim_size {
            let Ok(typed) = state.semaphore.clone().try_acquire_owned() else {
                break;
            };
            let Ok(global) = self.global.clone().try_acquire_owned() else {
                break;
            };
            permits.push((global, typed));
        }
        Some(permits)
    }

    /// Waits for one slot of both the type's and the global limit (the type's
    /// first, so a flooded type queues on its own limit, not the global one).
    async fn acquire(&self, state: &TypeState) -> Option<Permits> {
        tokio::select! {
            _ = self.stop_claiming.cancelled() => None,
            p = async {
                let typed = state.semaphore.clone().acquire_owned().await.ok()?;
                let global = self.global.clone().acquire_owned().await.ok()?;
                Some((global, typed))
            } => p,
        }
    }

    /// What one claim of up to `max_tasks` may take under `policy`: a shard
    /// claims its part of the type's throttles, so the shards together keep them.
    fn limits(&self, policy: &TypePolicy, part: ShardPart, max_tasks: usize) -> ClaimLimits {
        let (max_running, rate) = policy.shard_limits(part.index, part.of);
        ClaimLimits {
            max_tasks,
            lease: self.lease,
            max_payload_bytes: policy.max_payload.as_u64(),
            max_id_bytes: MAX_ID_BYTES,
            max_running,
            rate,
            fair_by: policy.fair_by.clone(),
        }
    }
}

/// Counts a claim, logs what it dead-lettered, and logs a pause or resume once.
fn report(task_type: &TaskType, state: &TypeState, claim: &Claim, was_paused: &mut bool) {
    state.metrics.claimed(claim);
    if claim.paused != *was_paused {
        *was_paused = claim.paused;
        state.metrics.paused(claim.paused);
        if claim.paused {
            info!(task_type = %task_type, "type paused: no claims until it is resumed; running tasks finish");
        } else {
            info!(task_type = %task_type, "type resumed: claiming again");
        }
    }
    for (id, reason) in &claim.dead_lettered {
        error!(task_type = %task_type, task_id = %clean_id(id), "dead-lettered without running: {reason}");
    }
}

/// How long a claim loop sleeps after a claim that did not take all it
/// asked for (unless woken): until the next due task or lease expiry, at
/// most `idle`; when a throttle held the claim back, until it lets more through.
fn sleep_after(claim: &Claim, idle: Duration) -> Duration {
    if let Some(wait) = claim.throttled_ms {
        return Duration::from_millis(u64::try_from(wait).unwrap_or(1).max(1));
    }
    let next = [claim.next_due_ms, claim.next_lease_expiry_ms].into_iter().flatten().min();
    next.map(|at| Duration::from_millis(u64::try_from(at - claim.now_ms).unwrap_or(0)))
        .map_or(idle, |until| until.min(idle))
}

/// What renews a type's leases: where they are, the health it reports to, and the lease's length.
#[derive(Clone)]
struct Renewer<L> {
    ledger: L,
    health: Health,
    lease: Duration,
}

impl<L: Ledger> Renewer<L> {
    /// Extends the leases of tasks that run long, so they are not
    /// re-delivered, every third of a lease; stops the runs whose leases a
    /// renewal finds reaped or cancelled.
    async fn run(self, task_type: TaskType, state: Arc<TypeState>) {
        let every = self.lease / 3;
        loop {
            tokio::time::sleep(every).await;
            // Every run older than half a tick is renewed each tick, so a lease
            // renewed in time is at most about one tick old: far from the
            // point where `lease_watch` stops its run.
            let due = state.in_flight.due_for_renewal(every / 2);
            if !due.is_empty() {
                self.renew(&task_type, &state.in_flight, &due).await;
            }
        }
    }

    /// Renews the leases in `due` and applies the answers to the runs
    /// holding them; an unreachable Redis changes nothing here
    /// (`lease_watch` stops runs that go unrenewed too long).
    async fn renew(&self, task_type: &TaskType, in_flight: &InFlight, due: &[Lease]) {
        let lease_ms = self.lease.as_millis() as u64;
        let answers = match self.ledger.extend(task_type, due, lease_ms).await {
            Ok(answers) => answers,
            Err(e) => {
                self.health.failed(task_type, "extend", &e);
                return;
            }
        };
        self.health.succeeded(task_type, "extend");
        for (claim, ids) in in_flight.renewed(due, answers) {
            warn!(task_type = %task_type, claim, tasks = ids.len(), ids = %ids.join(","),
                "lease lost while running (reaped: another host may run these tasks): their runs are stopped");
        }
    }
}

/// Stops the runs whose leases are about to run out unrenewed (Redis
/// unreachable or stalled): a sixth of the lease before Redis would let
/// another host take the task, so the run does not go on beside the next
/// one. It makes no Redis call, so a Redis that does not answer cannot
/// hold it back; the task runs again once its lease lapses.
async fn lease_watch(lease: Duration, task_type: TaskType, state: Arc<TypeState>) {
    let stop_after = lease - lease / 6;
    let mut tick = tokio::time::interval(lease / 12);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let expiring = state.in_flight.expiring(stop_after);
        if !expiring.is_empty() {
            warn!(task_type = %task_type, tasks = expiring.len(), ids = %expiring.join(","),
                "no lease renewal reached Redis in time: the runs of these tasks are stopped before their leases run out (they run again once the leases lapse)");
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio_util::task::TaskTracker;

    use super::*;
    use crate::pipeline::fakes::{Scripted, Served, claim_of};
    use crate::pipeline::state::SettleQueue;
    use crate::store::Extended;

    #[test]
    fn a_claim_takes_half_the_type_slots_at_most() {
        assert_eq!(claim_size(256, 256), 128, "the defaults: two claims of 128 overlap");
        assert_eq!(claim_size(256, 128), 64);
        assert_eq!(claim_size(256, 1024), 256, "batch_size caps a large type's claims");
        assert_eq!(claim_size(10, 128), 10, "batch_size still caps it");
        assert_eq!(claim_size(256, 3), 1, "a tiny type still claims");
        assert_eq!(claim_size(256, 1), 1);
    }

    #[test]
    fn after_a_claim_the_loop_sleeps_until_the_next_task_is_due_or_a_throttle_lets_more_through() {
        let idle = Duration::from_secs(2);
        let at = |next_due_ms, next_lease_expiry_ms, throttled_ms| {
            let claim =
                Claim { now_ms: 1_000, next_due_ms, next_lease_expiry_ms, throttled_ms, ..claim_of(1, &[], None) };
            sleep_after(&claim, idle)
        };
        assert_eq!(at(None, None, None), idle, "nothing due: the idle sleep");
        assert_eq!(at(Some(1_300), None, None), Duration::from_millis(300));
        assert_eq!(at(Some(1_300), Some(1_100), None), Duration::from_millis(100), "a lease to reap comes first");
        assert_eq!(at(Some(60_000), None, None), idle, "a far due time: the idle sleep is a safety net");
        assert_eq!(at(Some(900), None, None), Duration::ZERO, "already due (Redis's clock moved on): at once");
        assert_eq!(at(Some(1_001), None, Some(40)), Duration::from_millis(40), "a throttle's wait wins");
        assert_eq!(at(None, None, Some(0)), Duration::from_millis(1), "a throttle never spins");
    }

    /// A claim loop of type `t` on `ledger`, with `slots` slots (claims of 2),
    /// polling every second (no keyspace notifications), leases of 30 s.
    struct Loop {
        claimer: Option<Claimer<Scripted, Served>>,
        state: Arc<TypeState>,
        queue: SettleQueue,
        stop: CancellationToken,
        plugins: Served,
        wakeups: Wakeups,
    }

    impl Loop {
        fn new(ledger: &Scripted, slots: usize) -> Loop {
            let (state, queue) = TypeState::new(&t(), Arc::new(Semaphore::new(slots)), 2);
            let (stop, plugins, wakeups, health) =
                (CancellationToken::new(), Served::new(""), Wakeups::default(), Health::default());
            let lease = Duration::from_secs(30);
            let claimer = Claimer {
                ledger: ledger.clone(),
                plugins: plugins.clone(),
                wakeups: wakeups.clone(),
                health: health.clone(),
                global: Arc::new(Semaphore::new(slots)),
                stop_claiming: stop.clone(),
                poll_interval: Duration::from_secs(1),
                lease,
                dispatcher: Dispatcher::new(
                    tokio::runtime::Handle::current(),
                    ledger.clone(),
                    "this-host".into(),
                    TaskTracker::new(),
                ),
                renewer: Renewer { ledger: ledger.clone(), health, lease },
            };
            Loop { claimer: Some(claimer), state: Arc::new(state), queue, stop, plugins, wakeups }
        }

        /// Starts the loop, as shard 0 of 1.
        fn start(&mut self) -> tokio::task::JoinHandle<()> {
            let claimer = self.claimer.take().expect("started once");
            tokio::spawn(claimer.run(t(), ShardPart { index: 0, of: 1 }, self.state.clone()))
        }
    }

    fn t() -> TaskType {
        "t".parse().unwrap()
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    // Paused time: every sleep is stepped by tokio, exactly, not by this machine's speed.
    #[tokio::test(start_paused = true)]
    async fn the_loop_claims_again_while_claims_come_back_full_backs_off_through_outages_and_sleeps_until_the_next_due()
    {
        let ledger = Scripted::new();
        ledger.claims([
            Err(anyhow::anyhow!("Connection refused (os error 111)")),
            Ok(claim_of(1, &["ok-a", "ok-b"], None)),
            Ok(claim_of(2, &["ok-c"], Some(300))),
        ]);
        let mut l = Loop::new(&ledger, 8);
        let handle = l.start();
        tokio::time::sleep(ms(1_400)).await;
        l.stop.cancel();
        handle.await.unwrap();

        let claims: Vec<(Duration, String)> =
            ledger.timed_calls().into_iter().filter(|(_, call)| call.starts_with("claim")).collect();
        let expected = [
            (ms(0), "claim 2"),     // fails: backs off 50 ms
            (ms(50), "claim 2"),    // full: claims again at once
            (ms(50), "claim 2"),    // one of two, the next due 300 ms later
            (ms(350), "claim 2"),   // nothing due: the poll interval
            (ms(1_350), "claim 2"), // and again
        ];
        assert_eq!(claims, expected.map(|(at, c)| (at, c.to_owned())));
        // Three tasks ran; each holds one slot and its lease until the settler stores its outcome.
        let mut outcomes = Vec::new();
        while let Ok(queued) = l.queue.outcomes.try_recv() {
            assert!(l.state.in_flight.holds(&queued.settlement.lease));
            outcomes.push(queued);
        }
        assert_eq!(outcomes.len(), 3);
        assert_eq!(l.state.semaphore.available_permits(), 5, "the slots a claim took and did not use came back");
        assert!(!l.state.stopped.load(Ordering::Relaxed), "a shutdown, not a type that lost its plugin");
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_while_the_loop_waits_for_a_slot_ends_it_without_a_claim() {
        let ledger = Scripted::new();
        let mut l = Loop::new(&ledger, 1);
        let taken = l.state.semaphore.clone().try_acquire_owned().unwrap();
        let handle = l.start();
        tokio::time::sleep(ms(500)).await;
        l.stop.cancel();
        handle.await.unwrap();
        assert!(ledger.calls().is_empty(), "{:?}", ledger.calls());
        drop(taken);
    }

    #[tokio::test(start_paused = true)]
    async fn a_type_that_loses_its_plugin_stops_claiming_once_woken() {
        let ledger = Scripted::new();
        let mut l = Loop::new(&ledger, 4);
        let handle = l.start();
        tokio::time::sleep(ms(10)).await;
        l.plugins.unload();
        l.wakeups.of(&t()).notify_one();
        handle.await.unwrap();
        assert_eq!(ledger.calls(), ["claim 2"], "woken from its idle sleep, it finds no plugin and claims no more");
        assert!(l.state.stopped.load(Ordering::Relaxed), "marked stopped: a plugin that comes back starts a new loop");
    }

    #[tokio::test]
    async fn a_renewal_applies_redis_answers_and_one_redis_does_not_answer_changes_no_run() {
        let ledger = Scripted::new();
        ledger.extends([Err(anyhow::anyhow!("Connection refused (os error 111)")), Ok(vec![Extended::Lost])]);
        let health = Health::default();
        let renewer = Renewer { ledger: ledger.clone(), health: health.clone(), lease: Duration::from_secs(30) };
        let in_flight = InFlight::default();
        let lease = Lease { id: b"a".to_vec(), token: 1, claim: 1 };
        let signals = in_flight.claimed([lease.clone()]).remove(0);
        renewer.renew(&t(), &in_flight, std::slice::from_ref(&lease)).await;
        assert!(!signals.lost.is_cancelled() && !signals.stop.is_cancelled(), "no answer: lease_watch decides in time");
        renewer.renew(&t(), &in_flight, std::slice::from_ref(&lease)).await;
        assert!(signals.lost.is_cancelled(), "found reaped: the run is stopped");
        assert_eq!(ledger.calls(), ["extend 1 for 30000 ms"; 2]);
    }
}
