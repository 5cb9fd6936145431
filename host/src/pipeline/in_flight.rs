//! The leases this host holds for one type, from claim to settle: one map, changed only through the steps of a lease's life.
//!
//! A lease is held from the moment its claim is registered until its
//! outcome is stored (settled), its run is dropped because the lease was
//! lost, or shutdown hands it back. While it is held it is renewed, may be
//! found lost or cancelled, and may run out unrenewed; each of those is one
//! method here, so "when is this lease given back?" is answered in this file.
//! Nothing else touches the map.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hourglass_task::sync::LockExt;
use tokio_util::sync::CancellationToken;

use crate::observe::logging::clean_id;
use crate::store::Extended;
use crate::task::Lease;

/// The leases of one type (or shard) that this host holds.
#[derive(Default)]
pub(crate) struct InFlight {
    held: Mutex<Held>,
}

#[derive(Default)]
struct Held {
    runs: HashMap<Lease, Holding>,
    /// Shutdown passed its grace period: every run ends at once, and the
    /// leases of runs ended so stay listed, for shutdown to hand back.
    aborted: bool,
}

/// One held lease: when it was last renewed, and its run's signals.
struct Holding {
    renewed: Instant,
    signals: RunSignals,
}

impl Holding {
    /// The lease is gone: stops the run; whether its handler was still going
    /// (a handler that already ended has its outcome fenced instead).
    fn lose(&self) -> bool {
        self.signals.lost.cancel();
        !self.signals.returned.load(Ordering::Acquire)
    }
}

/// What a run shares with its held lease: how it is told to stop, and how it says its handler ended.
#[derive(Clone, Default)]
pub(crate) struct RunSignals {
    /// Cancelled by `hourglass cancel` (through Redis): the run ends as cancelled.
    pub(crate) stop: CancellationToken,
    /// Cancelled when this host no longer holds the lease (reaped, not
    /// renewed in time, or shutdown past its grace period): the run ends
    /// where it is and nothing is settled.
    pub(crate) lost: CancellationToken,
    /// Set when the handler is done (its outcome may still wait to be settled).
    returned: Arc<AtomicBool>,
}

impl RunSignals {
    /// The run's handler is done: a lease lost from now on has its outcome fenced, and no run to stop.
    pub(crate) fn handler_returned(&self) {
        self.returned.store(true, Ordering::Release);
    }
}

impl InFlight {
    /// A claim's leases are held from now, renewed as of now: the signals of
    /// each one's run, in order. After shutdown's grace period the runs are
    /// told at once that their leases are lost.
    pub(crate) fn claimed(&self, leases: impl IntoIterator<Item = Lease>) -> Vec<RunSignals> {
        let now = Instant::now();
        let mut held = self.held.lock_unpoisoned();
        let aborted = held.aborted;
        leases
            .into_iter()
            .map(|lease| {
                let signals = RunSignals::default();
                if aborted {
                    signals.lost.cancel();
                }
                held.runs.insert(lease, Holding { renewed: now, signals: signals.clone() });
                signals
            })
            .collect()
    }

    /// `hourglass cancel` asked to stop the run of `id` under `token`: true if
    /// this host holds it and its handler was still going (it then ends as
    /// cancelled; one already done keeps its result).
    pub(crate) fn cancel(&self, id: &[u8], token: u64) -> bool {
        let held = self.held.lock_unpoisoned();
        // A cancel names the task and its token, not its claim; it is rare, so a scan will do.
        let found = held.runs.iter().find(|(lease, _)| lease.id == id && lease.token == token);
        match found {
            Some((_, holding)) if !holding.signals.returned.load(Ordering::Acquire) => {
                holding.signals.stop.cancel();
                true
            }
            _ => false,
        }
    }

    /// The leases last renewed at least `age` ago: due for renewal.
    pub(crate) fn due_for_renewal(&self, age: Duration) -> Vec<Lease> {
        let held = self.held.lock_unpoisoned();
        held.runs.iter().filter(|(_, h)| h.renewed.elapsed() >= age).map(|(lease, _)| lease.clone()).collect()
    }

    /// A renewal of `due` came back with `answers`, in order: renewed ones are
    /// marked so, a cancelled one is stopped as cancelled, a lost one is
    /// stopped where it is. Leases settled meanwhile are skipped. Returns, by
    /// claim, the ids whose handlers were still going when found lost.
    pub(crate) fn renewed(&self, due: &[Lease], answers: Vec<Extended>) -> BTreeMap<u64, Vec<String>> {
        let mut lost: BTreeMap<u64, Vec<String>> = BTreeMap::new();
        let now = Instant::now();
        let mut held = self.held.lock_unpoisoned();
        for (lease, answer) in due.iter().zip(answers) {
            let Some(holding) = held.runs.get_mut(lease) else {
                continue;
            };
            match answer {
                Extended::Extended => holding.renewed = now,
                Extended::CancelAsked => {
                    // The cancel message was missed: the mark in Redis says so.
                    holding.renewed = now;
                    holding.signals.stop.cancel();
                }
                Extended::Lost => {
                    if holding.lose() {
                        lost.entry(lease.claim).or_default().push(clean_id(&lease.id));
                    }
                }
            }
        }
        lost
    }

    /// Stops the runs whose leases were last renewed `stop_after` ago or
    /// longer and are not lost yet: the ids of those whose handlers were still going.
    pub(crate) fn expiring(&self, stop_after: Duration) -> Vec<String> {
        let held = self.held.lock_unpoisoned();
        held.runs
            .iter()
            .filter(|(_, h)| h.renewed.elapsed() >= stop_after && !h.signals.lost.is_cancelled())
            .filter(|(_, h)| h.lose())
            .map(|(lease, _)| clean_id(&lease.id))
            .collect()
    }

    /// The run under `lease` was dropped because its lease was lost: it is no
    /// longer held (the task is another host's), unless shutdown ended it,
    /// whose lease stays listed to be handed back. True if it was let go.
    pub(crate) fn dropped(&self, lease: &Lease) -> bool {
        let mut held = self.held.lock_unpoisoned();
        !held.aborted && held.runs.remove(lease).is_some()
    }

    /// These outcomes are stored: their leases are no longer held.
    pub(crate) fn settled<'a>(&self, leases: impl IntoIterator<Item = &'a Lease>) {
        let mut held = self.held.lock_unpoisoned();
        for lease in leases {
            held.runs.remove(lease);
        }
    }

    /// Shutdown passed its grace period: ends every run now and every one
    /// claimed from now on; how many handlers were still going.
    pub(crate) fn abort_all(&self) -> usize {
        let mut held = self.held.lock_unpoisoned();
        held.aborted = true;
        held.runs.values().filter(|h| h.lose()).count()
    }

    /// The leases still held, for shutdown to hand back once the settler is done.
    pub(crate) fn to_hand_back(&self) -> Vec<Lease> {
        self.held.lock_unpoisoned().runs.keys().cloned().collect()
    }

    /// Whether `lease` is held.
    #[cfg(test)]
    pub(crate) fn holds(&self, lease: &Lease) -> bool {
        self.held.lock_unpoisoned().runs.contains_key(lease)
    }

    /// Backdates every held lease's last renewal by `by` (tests of renewal and expiry without waiting).
    #[cfg(test)]
    pub(crate) fn age_all(&self, by: Duration) {
        for h in self.held.lock_unpoisoned().runs.values_mut() {
            h.renewed -= by;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(id: &str, claim: u64) -> Lease {
        Lease { id: id.as_bytes().to_vec(), token: claim, claim }
    }

    const HOUR: Duration = Duration::from_secs(3600);

    #[test]
    fn a_lease_is_held_from_its_claim_until_its_outcome_is_stored() {
        let in_flight = InFlight::default();
        let leases = [lease("a", 1), lease("b", 1)];
        let signals = in_flight.claimed(leases.clone());
        assert_eq!(signals.len(), 2);
        assert!(leases.iter().all(|l| in_flight.holds(l)));
        assert!(in_flight.due_for_renewal(HOUR).is_empty(), "renewed as of the claim");
        assert_eq!(in_flight.due_for_renewal(Duration::ZERO).len(), 2);

        signals[0].handler_returned();
        assert!(in_flight.holds(&leases[0]), "an ended handler's lease is held until its outcome is stored");
        in_flight.settled(&leases[..1]);
        assert!(!in_flight.holds(&leases[0]) && in_flight.holds(&leases[1]));
        assert_eq!(in_flight.to_hand_back(), [leases[1].clone()]);
        assert!(signals.iter().all(|s| !s.stop.is_cancelled() && !s.lost.is_cancelled()), "nothing stopped a run");
    }

    #[test]
    fn a_renewal_marks_the_renewed_stops_the_cancelled_and_the_lost_and_skips_the_settled() {
        let in_flight = InFlight::default();
        let due = [lease("kept", 1), lease("cancelled", 1), lease("lost", 2), lease("lost-done", 2), lease("gone", 3)];
        let signals = in_flight.claimed(due.clone());
        // Its handler already ended: its outcome will be fenced, there is nothing to stop.
        signals[3].handler_returned();
        // "gone" was settled while the renewal was on its way.
        in_flight.settled(&due[4..]);
        in_flight.age_all(HOUR);

        let (renewed, cancelled, lost) = (Extended::Extended, Extended::CancelAsked, Extended::Lost);
        let lost = in_flight.renewed(&due, vec![renewed, cancelled, lost, lost, renewed]);
        assert_eq!(lost, BTreeMap::from([(2, vec!["lost".to_owned()])]), "only the handler still going is reported");
        assert!(!signals[0].stop.is_cancelled() && !signals[0].lost.is_cancelled());
        assert!(signals[1].stop.is_cancelled() && !signals[1].lost.is_cancelled());
        assert!(signals[2].lost.is_cancelled() && signals[3].lost.is_cancelled());
        assert!(!in_flight.holds(&due[4]), "a renewal does not bring a settled lease back");
        let due_again = in_flight.due_for_renewal(HOUR / 2);
        assert_eq!(due_again.len(), 2, "the lost ones are not marked renewed: {due_again:?}");
        assert!(due_again.iter().all(|l| l.id.starts_with(b"lost")));
    }

    #[test]
    fn a_lease_lost_while_its_outcome_is_settling_stops_nothing_and_is_let_go_once_stored() {
        let in_flight = InFlight::default();
        let l = lease("done", 1);
        let signals = in_flight.claimed([l.clone()]);
        signals[0].handler_returned(); // its outcome is in the settle queue
        assert!(in_flight.renewed(std::slice::from_ref(&l), vec![Extended::Lost]).is_empty(), "no handler to stop");
        in_flight.age_all(HOUR);
        assert!(in_flight.expiring(Duration::ZERO).is_empty(), "already lost: not stopped twice");
        assert!(in_flight.holds(&l), "still held: the settle writes its outcome (fenced) and then lets it go");
        in_flight.settled([&l]);
        assert!(in_flight.to_hand_back().is_empty(), "a settled lease is never handed back");
    }

    #[test]
    fn a_cancel_stops_a_running_handler_but_not_one_whose_result_is_in() {
        let in_flight = InFlight::default();
        let (running, done) = (lease("running", 7), lease("done", 8));
        let signals = in_flight.claimed([running.clone(), done.clone()]);
        signals[1].handler_returned();
        assert!(!in_flight.cancel(b"running", 8), "the token names one lease of the id");
        assert!(!in_flight.cancel(b"elsewhere", 7), "a task this host does not hold");
        assert!(in_flight.cancel(b"running", 7));
        assert!(signals[0].stop.is_cancelled());
        assert!(!in_flight.cancel(b"done", 8), "the result is in: it is settled as it ended");
        assert!(!signals[1].stop.is_cancelled());
        assert!(in_flight.holds(&done), "its lease is held until the result is stored");
    }

    #[test]
    fn a_lease_not_renewed_in_time_stops_its_run_once() {
        let in_flight = InFlight::default();
        let (old, young) = (lease("old", 1), lease("young", 1));
        let signals = in_flight.claimed([old.clone()]);
        in_flight.age_all(Duration::from_secs(60));
        in_flight.claimed([young.clone()]);
        assert_eq!(in_flight.expiring(Duration::from_secs(30)), ["old"]);
        assert!(signals[0].lost.is_cancelled());
        assert!(in_flight.expiring(Duration::from_secs(30)).is_empty(), "reported once");
        assert!(in_flight.dropped(&old), "the dropped run lets its lease go: the task is another host's");
        assert!(!in_flight.holds(&old) && in_flight.holds(&young));
    }

    #[test]
    fn shutdown_mid_claim_ends_every_run_and_keeps_their_leases_to_hand_back() {
        let in_flight = InFlight::default();
        let (running, done, late) = (lease("running", 1), lease("done", 1), lease("late", 2));
        let signals = in_flight.claimed([running.clone(), done.clone()]);
        signals[1].handler_returned();
        assert_eq!(in_flight.abort_all(), 1, "one handler was still going");
        assert!(signals.iter().all(|s| s.lost.is_cancelled()));
        // A claim on its way when the grace period ended: its runs end at once.
        let late_signals = in_flight.claimed([late.clone()]);
        assert!(late_signals[0].lost.is_cancelled());
        assert!(!in_flight.dropped(&running) && !in_flight.dropped(&late), "kept listed");
        in_flight.settled([&done]);
        let mut back = in_flight.to_hand_back();
        back.sort_by(|a, b| a.id.cmp(&b.id));
        assert_eq!(back, [late, running], "handed back: every lease whose outcome was not stored");
    }
}
