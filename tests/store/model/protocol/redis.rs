//! The model's Redis: the prelude's helpers the scripts share (fencing, taking a task out of its claim, the hold rule, reporting an end, completing a group), as plain state changes.

use super::*;

impl Redis {
    pub(super) fn claim(&self, no: u8) -> Option<&Claim> {
        self.claims.iter().find(|c| c.no == no)
    }

    /// Per id: in how many claims it is live, and the token of the first.
    pub(super) fn live(&self) -> [(u8, Option<u8>); IDS] {
        let mut out = [(0, None); IDS];
        for c in &self.claims {
            for (k, id) in c.tasks.iter().enumerate().filter_map(|(k, t)| Some((k, (*t)? as usize))) {
                out[id].0 += 1;
                out[id].1.get_or_insert(c.no + k as u8);
            }
        }
        out
    }

    /// Fencing: whether `run` is still leased under its claim and token.
    pub(super) fn leased(&self, run: &Run) -> bool {
        let task = self.claim(run.claim).and_then(|c| c.tasks.get((run.token - run.claim) as usize));
        task == Some(&Some(run.id))
    }

    /// Takes `run`'s task out of its claim (the claim goes with its last task), if still leased.
    pub(super) fn take_out(&mut self, run: &Run) -> bool {
        let Some(i) = self.claims.iter().position(|c| c.no == run.claim).filter(|_| self.leased(run)) else {
            return false;
        };
        self.claims[i].tasks[(run.token - run.claim) as usize] = None;
        if self.claims[i].tasks.iter().all(Option::is_none) {
            self.claims.remove(i);
        }
        true
    }

    /// The hold rule's other half: a task left claim `no`, so a schedule held back for it goes back
    /// to its own time unless a client moved it; before the outcome's ZADD NX, so that one stays.
    pub(super) fn left(&mut self, id: usize, no: u8) -> bool {
        self.running[id] = self.running[id].filter(|&c| c != no);
        match self.held[id].take() {
            Some((original, bumped)) if self.due[id] == Some(bumped) => {
                self.due[id] = Some(original);
                true
            }
            _ => false,
        }
    }

    pub(super) fn zadd_nx(&mut self, id: usize, at: u8) {
        self.due[id].get_or_insert(at);
    }

    /// prelude's report_ended: a child that ended drops its mark and reports once.
    pub(super) fn report_ended(&mut self, id: usize, end: Kind) {
        if let Some(join) = self.member[id].take() {
            let report = Report { child: id as u8, join, end };
            if let Err(at) = self.outbox.binary_search(&report) {
                self.outbox.insert(at, report);
            }
        }
    }

    /// complete_group: state done, callback scheduled (counted up to 2, so a broken rule stays finite).
    pub(super) fn complete(&mut self) {
        self.group = Group::Done;
        self.callbacks = (self.callbacks + 1).min(2);
    }

    /// Whether group_reports would count `report` (its child pending under that join).
    pub(super) fn counts(&self, report: &Report) -> bool {
        self.pending[report.child as usize] == Some(report.join)
    }
}
