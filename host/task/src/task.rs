//! The vocabulary of a task's life: what a claim hands out, what a handler asks to schedule, how a run ended and what settling it did.

use std::time::Duration;

use crate::task_type::TaskType;

/// A task claimed from Redis, leased to this host until it is settled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimedTask {
    /// Its type (the `{T}` of its keys).
    pub task_type: TaskType,
    /// The task id: the member of the due set, any bytes.
    pub id: Vec<u8>,
    /// The payload (empty when the payload hash has no entry).
    pub payload: Vec<u8>,
    /// 1 on first delivery, counting every claim (re-deliveries after a lost lease included).
    pub attempt: u32,
    /// The score it had in the due set: when it was due, in ms since the Unix epoch.
    pub due_ms: i64,
    /// The lease token; settling with a stale token changes nothing (fencing).
    pub token: u64,
    /// The claim that took it (the claim's first token): its lease is the claim's.
    pub claim: u64,
}

impl ClaimedTask {
    /// The lease this host holds on it.
    pub fn lease(&self) -> Lease {
        Lease { id: self.id.clone(), token: self.token, claim: self.claim }
    }
}

/// A lease on one task: its id and the token of the claim that took it.
/// Only the holder of the current token can renew, release or settle it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Lease {
    /// The task id.
    pub id: Vec<u8>,
    /// The claim's fencing token.
    pub token: u64,
    /// The claim that took it (its first token).
    pub claim: u64,
}

/// A follow-up task a handler scheduled; committed atomically with the success ack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FollowUp {
    /// Type of the new task.
    pub task_type: TaskType,
    /// Its id.
    pub id: Vec<u8>,
    /// Its payload (empty means no payload entry).
    pub payload: Vec<u8>,
    /// When it is due, in ms since the Unix epoch.
    pub due_ms: i64,
    /// Whether it replaces a task with its id that is waiting (re-schedules it,
    /// with this payload) or dead-lettered in its type (`may_replace`); when
    /// false it is created only where no such task is.
    pub replace: bool,
}

/// What one run does to one workflow group; committed with its ack, like a follow-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupWork {
    /// The group.
    pub group: crate::workflow::group::GroupRef,
    /// Opens it with this callback (an open group with the same callback is joined).
    pub open: Option<crate::workflow::group::Callback>,
    /// Children to add and schedule, in order.
    pub children: Vec<FollowUp>,
    /// Seals it once the children are added: no more can come.
    pub seal: bool,
}

/// A workflow graph one run declares; committed with its ack, like a follow-up,
/// and declared (graph_open.lua) when its outbox entry is delivered.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GraphWork {
    /// The type whose keys hold the graph.
    pub home: crate::task_type::TaskType,
    /// The graph id, used once within the home type.
    pub id: crate::workflow::group::GroupId,
    /// Its nodes, their shape checked ([`crate::workflow::graph::check`]).
    pub nodes: Vec<crate::workflow::graph::NodeSpec>,
}

/// The result of one claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// Redis `TIME` when the claim ran, in ms since the epoch.
    pub now_ms: i64,
    /// The tasks now leased to this host, oldest due first.
    pub tasks: Vec<ClaimedTask>,
    /// Tasks dead-lettered at claim (oversize id or payload), with the reason.
    pub dead_lettered: Vec<(Vec<u8>, String)>,
    /// Earliest due time still in the due set; `None` also when the claim
    /// took `max_tasks` tasks (more may be due: claim again).
    pub next_due_ms: Option<i64>,
    /// Earliest lease expiry of this type (any host's); `None` also when the claim was full.
    pub next_lease_expiry_ms: Option<i64>,
    /// When the leases of `tasks` expire unless extended.
    pub lease_expiry_ms: i64,
    /// Set when `max_running`, `rate` or a pause held the claim back: how long until it may take more (ms).
    pub throttled_ms: Option<i64>,
    /// The type is paused: nothing was claimed.
    pub paused: bool,
}

/// The outcome of one task, to settle under the lease it was run with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settlement {
    /// The lease the run held: settling with a lease that was lost changes nothing.
    pub lease: Lease,
    /// What happened.
    pub outcome: Outcome,
    /// When and how it ran, for the events stream (zeros when unknown).
    pub run: RunInfo,
}

/// The attempt and times of one run, carried into its completion event.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunInfo {
    /// Which attempt this was (1 = first).
    pub attempt: u32,
    /// The task's due time, ms since the epoch.
    pub due_ms: i64,
    /// When the handler started, ms since the epoch.
    pub started_ms: i64,
    /// When the handler finished, ms since the epoch.
    pub finished_ms: i64,
    /// How long the handler ran (finer than the two times above).
    pub ran_for: std::time::Duration,
}

/// How far a run has got, as its handler reported it (the `progress` import).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Progress {
    /// 0 to 100.
    pub percent: u8,
    /// JSON text the handler gave with it (at most 1 KiB), or empty.
    pub detail: String,
}

/// How a task ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Success; the follow-ups are committed atomically with it.
    Ack {
        /// Tasks to schedule (delivered through the outbox).
        followups: Vec<FollowUp>,
        /// Workflow groups it opens, adds children to or seals (delivered through the outbox).
        groups: Vec<GroupWork>,
        /// Workflow graphs it declares (delivered through the outbox).
        graphs: Vec<GraphWork>,
    },
    /// Failure; run again after `delay`.
    Retry {
        /// Delay from now (Redis time).
        delay: Duration,
        /// Why it failed.
        error: String,
        /// The last progress the run reported, if any: kept with the task,
        /// so watchers of the next attempt see where this one got to.
        progress: Option<Progress>,
    },
    /// Failure; dead-letter it.
    Dead {
        /// Why it failed.
        error: String,
    },
    /// Stopped by `hourglass cancel`: never retried.
    Cancelled,
}

impl Outcome {
    /// The failure's text (retry and dead letter); `None` otherwise.
    pub fn error(&self) -> Option<&str> {
        match self {
            Outcome::Retry { error, .. } | Outcome::Dead { error } => Some(error),
            Outcome::Ack { .. } | Outcome::Cancelled => None,
        }
    }
}

/// How a run ended once it was settled: its outcome as settle.lua committed
/// it, or fenced. `Store::settle` (hourglass-store) decodes it once from
/// the script's reply; metrics, events, spans and logs all read this.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// The ack was committed.
    Succeeded,
    /// The failure was committed, and the task is due again.
    Retried,
    /// The task was dead-lettered.
    Dead,
    /// The run was stopped by `hourglass cancel` (or its failure came after a cancel was asked).
    Cancelled,
    /// The run failed for good, but a client had scheduled the id again meanwhile: that schedule stands.
    Rescheduled,
    /// The outcome was ignored: the lease had been lost.
    Fenced,
}

impl Ended {
    /// Its name in metrics, spans and the dashboard.
    pub fn as_str(self) -> &'static str {
        match self {
            Ended::Succeeded => "succeeded",
            Ended::Retried => "retried",
            Ended::Dead => "dead",
            Ended::Cancelled => "cancelled",
            Ended::Rescheduled => "rescheduled",
            Ended::Fenced => "fenced",
        }
    }

    /// The end named `name` (settle.lua replies with [`Ended::as_str`]'s names); `None` for another word.
    pub fn from_name(name: &str) -> Option<Ended> {
        [Ended::Succeeded, Ended::Retried, Ended::Dead, Ended::Cancelled, Ended::Rescheduled, Ended::Fenced]
            .into_iter()
            .find(|e| e.as_str() == name)
    }
}

/// A request to stop one run, from `hourglass cancel` through Redis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CancelRequest {
    /// Its type.
    pub task_type: TaskType,
    /// Its id.
    pub id: Vec<u8>,
    /// The lease token of the run to stop (a later run of the same id is left alone).
    pub token: u64,
}

impl CancelRequest {
    /// Reads a cancel message: `<type>\n<token>\n<id>`.
    pub fn parse(message: &[u8]) -> Option<CancelRequest> {
        let mut parts = message.splitn(3, |&b| b == b'\n');
        // A shard's name: its lease is in the shard's keys.
        let task_type = TaskType::parse_queue(std::str::from_utf8(parts.next()?).ok()?).ok()?;
        let token = std::str::from_utf8(parts.next()?).ok()?.parse().ok()?;
        Some(CancelRequest { task_type, token, id: parts.next()?.to_vec() })
    }
}

#[cfg(test)]
mod tests {
    use super::CancelRequest;

    #[test]
    fn cancel_messages_parse_with_any_id_bytes() {
        let r = CancelRequest::parse(b"order.timeout\n42\na\nb\xff").unwrap();
        assert_eq!((r.task_type.as_str(), r.token, r.id.as_slice()), ("order.timeout", 42, &b"a\nb\xff"[..]));
        assert!(CancelRequest::parse(b"Bad Type\n1\nx").is_none());
        assert_eq!(CancelRequest::parse(b"t#3\n1\nx").unwrap().task_type.tag_number(), 3);
        assert!(CancelRequest::parse(b"t\nnot-a-number\nx").is_none());
        assert!(CancelRequest::parse(b"t\n1").is_none());
    }
}
