//! Claim: a type's loop that takes due tasks under a lease as slots free up, sleeps until the next is due, and renews leases.

use hourglass_task::sync::LockExt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use super::dispatch::Dispatcher;
use super::ledger::{Ledger, renew};
use super::outbox::Outbox;
use super::state::{Permits, Runner, TypeState};
use crate::health::{Health, Trouble};
use crate::logging::clean_id;
use crate::registry::Registry;
use crate::store::{ClaimLimits, Store};
use crate::task::Lease;
use crate::task_type::TaskType;
use crate::wakeup::Wakeups;

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

/// What a type's claim loop uses: where tasks are, which plugin serves the
/// type (and its policy), its wake-ups, the health it reports to, the global
/// slots, the shutdown signal, the runner's timing settings, the dispatcher
/// its claims go to, and what renews their leases.
pub(crate) struct Claimer {
    store: Store,
    registry: Registry,
    wakeups: Wakeups,
    health: Health,
    /// Slots of the global `runner.concurrency`.
    global: Arc<Semaphore>,
    /// Cancelled at shutdown: no new claims.
    stop_claiming: CancellationToken,
    poll_interval: Duration,
    lease: Duration,
    dispatcher: Dispatcher,
    renewer: Renewer,
}

impl Claimer {
    pub(crate) fn of(runner: &Runner) -> Claimer {
        Claimer {
            store: runner.store.clone(),
            registry: runner.registry.clone(),
            wakeups: runner.wakeups.clone(),
            health: runner.health.clone(),
            global: runner.global.clone(),
            stop_claiming: runner.stop_claiming.clone(),
            poll_interval: runner.poll_interval,
            lease: runner.lease,
            dispatcher: Dispatcher::of(runner),
            renewer: Renewer {
                store: runner.store.clone(),
                health: runner.health.clone(),
                lease: runner.lease,
                outbox: Outbox::of(runner),
            },
        }
    }

    /// Claims and dispatches the tasks of one type until shutdown or until the type loses its plugin.
    pub(crate) async fn run(self, task_type: TaskType, state: Arc<TypeState>) {
        let wakeup = self.wakeups.of(&task_type);
        let heartbeat = tokio::spawn(self.renewer.clone().run(task_type.clone(), state.clone()));
        let lease_watch = tokio::spawn(lease_watch(self.lease, task_type.clone(), state.clone()));
        let mut backoff = Duration::from_millis(50);
        let mut was_paused = false;
        // A tag being drained (none of the current shards) takes the smallest part, as shard N would.
        let shard = self.store.shard_index(&task_type).unwrap_or_else(|| self.store.shard_count(&task_type));
        loop {
            if self.stop_claiming.is_cancelled() {
                break;
            }
            let Some(entry) = self.registry.get(&task_type) else {
                info!(task_type = %task_type, "no plugin serves this type any more: claims stopped");
                break;
            };
            // Wait for one slot, then take as many more as are free, up to a claim.
            let Some(first) = self.acquire(&state).await else {
                break;
            };
            let mut permits = vec![first];
            permits.extend(self.try_acquire(&state, state.claim_size - 1));

            // Registered before the claim, so a notification during it is not lost.
            let notified = wakeup.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();

            // A shard claims its part of the type's throttles, so the shards together keep them.
            let (max_running, rate) = entry.policy.shard_limits(shard, self.store.shard_count(&task_type));
            let limits = ClaimLimits {
                max_tasks: permits.len(),
                lease: self.lease,
                max_payload_bytes: entry.policy.max_payload.as_u64(),
                max_id_bytes: MAX_ID_BYTES,
                max_running,
                rate,
                fair_by: entry.policy.fair_by.clone(),
            };
            let claim = match Ledger::claim(&self.store, &task_type, &limits).await {
                Ok(c) => {
                    state.metrics.claimed(&c);
                    if c.paused != was_paused {
                        was_paused = c.paused;
                        state.metrics.paused(c.paused);
                        if c.paused {
                            info!(task_type = %task_type, "type paused: no claims until it is resumed; running tasks finish");
                        } else {
                            info!(task_type = %task_type, "type resumed: claiming again");
                        }
                    }
                    self.health.succeeded(&task_type, "claim");
                    backoff = Duration::from_millis(50);
                    c
                }
                Err(e) => {
                    drop(permits);
                    // Both an outage and a fault of this type's keys are waited out;
                    // the claim script wrote nothing, so every task is where it was.
                    let _: Trouble = self.health.failed(&task_type, "claim", &e);
                    tokio::select! {
                        _ = self.stop_claiming.cancelled() => break,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                    continue;
                }
            };
            for (id, reason) in &claim.dead_lettered {
                error!(task_type = %task_type, task_id = %clean_id(id), "dead-lettered without running: {reason}");
            }
            let claimed_all = claim.tasks.len() == limits.max_tasks;
            let mut runnable = Vec::with_capacity(claim.tasks.len());
            for task in claim.tasks {
                let Some(task_permits) = permits.pop() else {
                    break;
                };
                runnable.push((task, task_permits));
            }
            drop(permits);
            self.dispatcher.dispatch(&state, &entry, runnable);
            if claimed_all {
                continue; // more may be due right now
            }
            // Sleep until the next due task or lease expiry, or until woken; when
            // a throttle held the claim back, until it lets more through.
            let next = [claim.next_due_ms, claim.next_lease_expiry_ms].into_iter().flatten().min();
            let idle = if self.wakeups.live() { IDLE_WITH_NOTIFICATIONS } else { self.poll_interval };
            let sleep = match claim.throttled_ms {
                Some(wait) => Duration::from_millis(u64::try_from(wait).unwrap_or(1).max(1)),
                None => next
                    .map(|at| Duration::from_millis(u64::try_from(at - claim.now_ms).unwrap_or(0)))
                    .map_or(idle, |until| until.min(idle)),
            };
            if sleep.is_zero() {
                continue;
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

    /// Takes up to `n` slots that are free right now.
    fn try_acquire(&self, state: &TypeState, n: usize) -> Vec<Permits> {
        let mut out = Vec::new();
        while out.len() < n {
            let Ok(typed) = state.semaphore.clone().try_acquire_owned() else {
                break;
            };
            let Ok(global) = self.global.clone().try_acquire_owned() else {
                break;
            };
            out.push((global, typed));
        }
        out
    }
}

/// What renews a type's leases: where they are, the health it reports to,
/// the lease's length, and the outbox it moves on at each tick.
#[derive(Clone)]
struct Renewer {
    store: Store,
    health: Health,
    lease: Duration,
    outbox: Outbox,
}

impl Renewer {
    /// Extends the leases of tasks that run long, so they are not re-delivered,
    /// and stops the runs whose leases a renewal finds reaped. It also moves
    /// on follow-ups left in the type's outbox by a host that died between
    /// its ack and the delivery (at start, then every tick).
    async fn run(self, task_type: TaskType, state: Arc<TypeState>) {
        let every = self.lease / 3;
        loop {
            let moved = self.outbox.flush(&task_type).await;
            if moved > 0 {
                info!(task_type = %task_type, delivered = moved, "delivered follow-ups left in the outbox");
            }
            tokio::time::sleep(every).await;
            // Every run older than half a tick is renewed each tick, so a lease
            // renewed in time is at most about one tick old: far from the
            // point where `lease_watch` stops its run.
            let due: Vec<Lease> = {
                let map = state.in_flight.lock_unpoisoned();
                map.iter().filter(|(_, run)| run.renewed.elapsed() >= every / 2).map(|(k, _)| k.clone()).collect()
            };
            if due.is_empty() {
                continue;
            }
            let lease_ms = self.lease.as_millis() as u64;
            let lost = renew(&self.store, &self.health, &task_type, &state.in_flight, &due, lease_ms).await;
            for (claim, ids) in lost {
                warn!(task_type = %task_type, claim, tasks = ids.len(), ids = %ids.join(","),
                    "lease lost while running (reaped: another host may run these tasks): their runs are stopped");
            }
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
        let mut expiring = Vec::new();
        {
            let map = state.in_flight.lock_unpoisoned();
            for (key, run) in map.iter() {
                if run.renewed.elapsed() >= stop_after && !run.lost.is_cancelled() && run.lose() {
                    expiring.push(clean_id(&key.id));
                }
            }
        }
        if !expiring.is_empty() {
            warn!(task_type = %task_type, tasks = expiring.len(), ids = %expiring.join(","),
                "no lease renewal reached Redis in time: the runs of these tasks are stopped before their leases run out (they run again once the leases lapse)");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::claim_size;

    #[test]
    fn a_claim_takes_half_the_type_slots_at_most() {
        assert_eq!(claim_size(256, 256), 128, "the defaults: two claims of 128 overlap");
        assert_eq!(claim_size(256, 128), 64);
        assert_eq!(claim_size(256, 1024), 256, "batch_size caps a large type's claims");
        assert_eq!(claim_size(10, 128), 10, "batch_size still caps it");
        assert_eq!(claim_size(256, 3), 1, "a tiny type still claims");
        assert_eq!(claim_size(256, 1), 1);
    }
}
