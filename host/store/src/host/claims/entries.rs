//! A settle call's entries: the acks of one claim as masks, every other outcome in full.

use std::collections::HashMap;

use crate::task::{Lease, Outcome, Settlement};

/// One entry of a settle call: the plain acks of one claim as a mask, or one task in full.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum BatchEntry {
    /// Acks with nothing else to write (no events; no follow-ups, or with
    /// `followups` only follow-ups, delivered directly) of tasks of `claim`:
    /// byte i of `mask` is `1` for its task i (from 0, the token minus the
    /// claim id); `tasks` maps batch indexes to i.
    Plain { claim: u64, mask: Vec<u8>, tasks: Vec<(usize, usize)>, followups: bool },
    /// The batch index of a task sent with its outcome in full.
    Full(usize),
}

/// Most tasks one claim holds (claim.lua caps a claim at this many).
const CLAIM_MAX: u64 = 65535;

/// The entries of one settle call for `batch`, in the order each first
/// appears: acks of the same claim share one mask, so settling a whole
/// claim sends three arguments, not four per task. With `direct`
/// follow-ups, acks whose only other write is follow-ups share a mask of
/// their own (an id, a count and the follow-ups each, not eleven arguments
/// and the follow-ups).
pub(super) fn batch_entries(batch: &[Settlement], events: bool, direct: bool) -> Vec<BatchEntry> {
    let mut entries = Vec::new();
    let mut masks: HashMap<(u64, bool), usize> = HashMap::new(); // (claim, with follow-ups) → its entry
    for (i, s) in batch.iter().enumerate() {
        let with_followups = match &s.outcome {
            Outcome::Ack { followups, groups, graphs } if !events && groups.is_empty() && graphs.is_empty() => {
                (followups.is_empty() || direct).then_some(!followups.is_empty())
            }
            _ => None,
        };
        let Lease { token, claim, .. } = s.lease;
        let index = token.checked_sub(claim).filter(|&k| k < CLAIM_MAX);
        let (Some(followups), Some(index)) = (with_followups, index) else {
            entries.push(BatchEntry::Full(i));
            continue;
        };
        let at = *masks.entry((claim, followups)).or_insert_with(|| {
            entries.push(BatchEntry::Plain { claim, mask: Vec::new(), tasks: Vec::new(), followups });
            entries.len() - 1
        });
        let BatchEntry::Plain { mask, tasks, .. } = &mut entries[at] else { unreachable!("masks index plain entries") };
        let index = index as usize;
        if mask.len() <= index {
            mask.resize(index + 1, b'0');
        }
        mask[index] = b'1';
        tasks.push((i, index));
    }
    entries
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::task::{FollowUp, RunInfo};
    use std::time::Duration;

    fn settlement(token: u64, claim: u64, outcome: Outcome) -> Settlement {
        let lease = Lease { id: format!("t{token}").into_bytes(), token, claim };
        Settlement { lease, outcome, run: RunInfo::default() }
    }

    fn ack() -> Outcome {
        Outcome::Ack { followups: Vec::new(), groups: Vec::new(), graphs: Vec::new() }
    }

    #[test]
    fn plain_acks_of_one_claim_share_one_mask() {
        let retry = Outcome::Retry { delay: Duration::from_secs(1), error: "x".into(), progress: None };
        let batch = [
            settlement(12, 10, ack()),
            settlement(20, 20, ack()),
            settlement(11, 10, retry),
            settlement(10, 10, ack()),
        ];
        assert_eq!(
            batch_entries(&batch, false, true),
            [
                BatchEntry::Plain { claim: 10, mask: b"101".to_vec(), tasks: vec![(0, 2), (3, 0)], followups: false },
                BatchEntry::Plain { claim: 20, mask: b"1".to_vec(), tasks: vec![(1, 0)], followups: false },
                BatchEntry::Full(2),
            ]
        );
    }

    #[test]
    fn acks_with_direct_followups_share_a_mask_of_their_own() {
        let echo = || {
            let followup = FollowUp {
                task_type: "out".parse().unwrap(),
                id: b"x".to_vec(),
                payload: Vec::new(),
                due_ms: 0,
                replace: true,
            };
            Outcome::Ack { followups: vec![followup], groups: Vec::new(), graphs: Vec::new() }
        };
        let batch = [settlement(10, 10, echo()), settlement(11, 10, ack()), settlement(12, 10, echo())];
        assert_eq!(
            batch_entries(&batch, false, true),
            [
                BatchEntry::Plain { claim: 10, mask: b"101".to_vec(), tasks: vec![(0, 0), (2, 2)], followups: true },
                BatchEntry::Plain { claim: 10, mask: b"01".to_vec(), tasks: vec![(1, 1)], followups: false },
            ]
        );
        // Through the outbox (a cluster), or with events, they go in full.
        assert_eq!(
            batch_entries(&batch, false, false),
            [
                BatchEntry::Full(0),
                BatchEntry::Plain { claim: 10, mask: b"01".to_vec(), tasks: vec![(1, 1)], followups: false },
                BatchEntry::Full(2),
            ]
        );
        assert_eq!(batch_entries(&batch, true, true), [BatchEntry::Full(0), BatchEntry::Full(1), BatchEntry::Full(2)]);
    }

    #[test]
    fn acks_go_in_full_with_events_or_an_impossible_token() {
        let batch = [settlement(5, 10, ack()), settlement(10, 10, ack())];
        assert_eq!(batch_entries(&batch, true, true), [BatchEntry::Full(0), BatchEntry::Full(1)]);
        assert_eq!(
            batch_entries(&batch, false, true),
            [
                BatchEntry::Full(0),
                BatchEntry::Plain { claim: 10, mask: b"1".to_vec(), tasks: vec![(1, 0)], followups: false }
            ]
        );
    }
}
