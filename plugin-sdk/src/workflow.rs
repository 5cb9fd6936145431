//! Workflow groups (fan out to child tasks and fan in to one callback task) and graphs (tasks that wait for several others).
//!
//! ```no_run
//! use hourglass_sdk::workflow::{self, FireWhen, Group};
//! use hourglass_sdk::{Failure, Task, now_ms};
//!
//! fn handle(task: Task) -> Result<(), Failure> {
//!     let order = task.id_str().into_owned();
//!     // When all three ended, `order.ship` task `<order>` runs with a summary.
//!     let group = Group::new("order.ship", &order);
//!     group.open(&order, "", FireWhen::AllSucceeded)?;
//!     for step in ["order.reserve", "order.charge", "order.mail"] {
//!         group.add(step, &order, b"", now_ms())?;
//!     }
//!     group.seal()?;
//!     Ok(())
//! }
//! # fn main() {}
//! ```
//!
//! Everything is buffered and committed with this run's success (like
//! [`crate::schedule`]); the type needs `may_schedule` grants for the
//! callback's type and each child's type. The callback then reads the
//! summary with [`Summary::of`].

use crate::bindings::hourglass::plugin::workflow as wit;
use crate::{PayloadError, Task};

/// When a completed group schedules its callback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FireWhen {
    /// Once every child has ended, however it ended.
    AllEnded,
    /// Only if every child succeeded (a chain); otherwise the group completes without it.
    AllSucceeded,
}

/// A workflow group, named by its callback's type and its id there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    callback_type: String,
    id: String,
}

/// The host refused some work on a group.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot work on group: {0}")]
pub struct GroupError(pub String);

impl From<GroupError> for crate::Failure {
    fn from(e: GroupError) -> crate::Failure {
        crate::Failure::Error(e.to_string())
    }
}

impl Group {
    /// The group `id` whose callback is of `callback_type`.
    pub fn new(callback_type: &str, id: &str) -> Group {
        Group { callback_type: callback_type.to_owned(), id: id.to_owned() }
    }

    /// Opens it: its callback is task `callback_id`, and `payload` reaches
    /// the callback under `"payload"` in its summary.
    pub fn open(&self, callback_id: &str, payload: &str, when: FireWhen) -> Result<(), GroupError> {
        let when = match when {
            FireWhen::AllEnded => wit::FireWhen::AllEnded,
            FireWhen::AllSucceeded => wit::FireWhen::AllSucceeded,
        };
        wit::open(&self.callback_type, &self.id, callback_id, payload, when).map_err(GroupError)
    }

    /// Adds child `id` of `task_type`, due at `due_ms`, to the open group.
    pub fn add(&self, task_type: &str, id: &str, payload: impl AsRef<[u8]>, due_ms: u64) -> Result<(), GroupError> {
        wit::add(&self.callback_type, &self.id, task_type, id, payload.as_ref(), due_ms).map_err(GroupError)
    }

    /// Seals it: no more children; it completes once none is pending.
    pub fn seal(&self) -> Result<(), GroupError> {
        wit::seal(&self.callback_type, &self.id).map_err(GroupError)
    }
}

/// A node of a workflow graph ([`graph`]): a task that runs once its parents
/// (names of other nodes) have ended as `when` says.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Node {
    /// Its name in the graph, which its children's `parents` use.
    pub name: String,
    /// The task's type.
    #[serde(rename = "type")]
    pub task_type: String,
    /// The task's id; `None`: `<graph id>/<name>`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The task's payload (text; empty: none).
    pub payload: String,
    /// [`FireWhen::AllEnded`]: once every parent ended, however;
    /// [`FireWhen::AllSucceeded`]: only if all succeeded, else skipped.
    #[serde(serialize_with = "when_word")]
    pub when: FireWhen,
    /// The names of the nodes it waits for.
    pub parents: Vec<String>,
}

impl Node {
    /// Node `name`, a task of `task_type` with its default id and no payload, run once all `parents` ended.
    pub fn new(name: &str, task_type: &str, parents: &[&str]) -> Node {
        Node {
            name: name.to_owned(),
            task_type: task_type.to_owned(),
            id: None,
            payload: String::new(),
            when: FireWhen::AllEnded,
            parents: parents.iter().map(|p| p.to_string()).collect(),
        }
    }
}

fn when_word<S: serde::Serializer>(when: &FireWhen, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(match when {
        FireWhen::AllEnded => "all",
        FireWhen::AllSucceeded => "success",
    })
}

/// Declares workflow graph `graph` of `home_type` with `nodes`, committed
/// with this run's success. Refused at once for a cycle, an unknown parent,
/// a name or task used twice, a type not granted; a graph id or a task
/// already in use is found when a host declares it (the graph is then
/// refused whole, and the host logs why).
pub fn graph(home_type: &str, graph: &str, nodes: &[Node]) -> Result<(), GroupError> {
    let json = serde_json::json!({ "nodes": nodes }).to_string();
    wit::graph(home_type, graph, &json).map_err(GroupError)
}

/// What a group's callback receives as its payload.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
pub struct Summary {
    /// The group id.
    pub group: String,
    /// The payload given when the group was opened.
    pub payload: String,
    /// Children added in all.
    pub added: u64,
    /// Children that succeeded.
    pub succeeded: u64,
    /// Children dead-lettered.
    pub dead: u64,
    /// Children cancelled (or refused: their id was another group's child).
    pub cancelled: u64,
    /// Up to 100 children that did not succeed.
    pub failed: Vec<FailedChild>,
    /// Whether `failed` lists all of them.
    pub failed_listed_all: bool,
}

/// A child that did not succeed.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
pub struct FailedChild {
    /// Its type.
    #[serde(rename = "type")]
    pub task_type: String,
    /// Its id.
    pub id: String,
    /// `dead` or `cancelled`.
    pub outcome: String,
}

impl Summary {
    /// The summary in a callback task's payload.
    pub fn of(task: &Task) -> Result<Summary, PayloadError> {
        task.json()
    }
}
