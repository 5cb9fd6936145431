//! Workflow groups: a group's name, its callback, and the summary its callback receives.
//!
//! A group is opened with a callback task, gets children (tasks of any
//! type), and is sealed; once sealed and every child has ended, its callback
//! is scheduled exactly once. The group lives in its callback type's slot
//! (`P:{C}:group:<id>`), so a group id is unique per callback type. The
//! callback's payload is a JSON summary written by `group_end.lua` (the SDK's
//! `workflow::Summary` reads it). See docs/workflows.md.

use std::fmt;
use std::str::FromStr;

use crate::task_type::TaskType;

/// A group id: 1 to 200 bytes of text without control characters.
///
/// It is part of key names and of the callback's JSON summary, so it must
/// be text; it names the group within its callback type.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct GroupId(String);

impl From<GroupId> for String {
    fn from(id: GroupId) -> String {
        id.0
    }
}

impl GroupId {
    /// The longest allowed id, in bytes.
    pub const MAX_LEN: usize = 200;

    /// The id as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for GroupId {
    type Error = anyhow::Error;

    fn try_from(id: String) -> anyhow::Result<GroupId> {
        if id.is_empty() || id.len() > Self::MAX_LEN {
            anyhow::bail!("invalid group id {id:?}: it must be 1 to {} bytes", Self::MAX_LEN);
        }
        if id.chars().any(char::is_control) {
            anyhow::bail!("invalid group id {id:?}: it may not contain control characters");
        }
        Ok(GroupId(id))
    }
}

impl FromStr for GroupId {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> anyhow::Result<GroupId> {
        GroupId::try_from(s.to_owned())
    }
}

impl fmt::Display for GroupId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Where a group lives: its callback's type and its id there.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct GroupRef {
    /// The type of the callback task; the group's keys are in its slot.
    pub callback_type: TaskType,
    /// The group's id within that type.
    pub id: GroupId,
}

impl GroupRef {
    /// How a child's mark names its group: `<callback type>\n<group id>`.
    pub fn membership(&self) -> String {
        format!("{}\n{}", self.callback_type, self.id)
    }
}

impl fmt::Display for GroupRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.callback_type, self.id)
    }
}

/// When a completed group schedules its callback.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FireWhen {
    /// Once every child has ended, however it ended (the callback learns how).
    #[default]
    AllEnded,
    /// Only if every child succeeded; otherwise the group completes without
    /// it (a chain: the next step runs only after this one succeeded).
    AllSucceeded,
}

impl FireWhen {
    /// The name stored in the group (`when`).
    pub fn as_str(self) -> &'static str {
        match self {
            FireWhen::AllEnded => "all",
            FireWhen::AllSucceeded => "success",
        }
    }
}

impl FromStr for FireWhen {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> anyhow::Result<FireWhen> {
        match s {
            "all" => Ok(FireWhen::AllEnded),
            "success" => Ok(FireWhen::AllSucceeded),
            other => anyhow::bail!("invalid group trigger {other:?}: expected \"all\" or \"success\""),
        }
    }
}

/// The task a group schedules when it completes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Callback {
    /// Its id in the callback type; text (it appears in the summary).
    pub id: String,
    /// Text handed on to the callback under `"payload"` in its summary.
    pub payload: String,
    /// When it fires.
    pub when: FireWhen,
    /// Whether it replaces a task with its id that is waiting or dead
    /// (otherwise the group completes and leaves that task as it is).
    pub replace: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_ids_are_short_text() {
        assert!("order-17".parse::<GroupId>().is_ok());
        assert!("".parse::<GroupId>().is_err());
        assert!("a\nb".parse::<GroupId>().is_err());
        assert!("x".repeat(201).parse::<GroupId>().is_err());
        assert_eq!("success".parse::<FireWhen>().unwrap(), FireWhen::AllSucceeded);
        assert!("sometimes".parse::<FireWhen>().unwrap_err().to_string().contains("sometimes"));
    }
}
