//! The data that travels with one task: what a claim hands out and what a handler asks to schedule.

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
