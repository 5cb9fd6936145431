//! The validated name of a task type, which picks the handler and the Redis keys.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A task type name: `[a-z0-9][a-z0-9._-]{0,63}`.
///
/// The name goes inside a Redis Cluster hash tag (`{order.timeout}`), so it
/// must never contain braces, and it doubles as a plugin file stem, so it
/// must be safe as a file name too.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct TaskType(String);

/// Why a string is not a valid task type name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidTaskType {
    name: String,
    reason: &'static str,
}

impl fmt::Display for InvalidTaskType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid task type {:?}: {} (allowed: [a-z0-9][a-z0-9._-]{{0,63}})", self.name, self.reason)
    }
}

impl std::error::Error for InvalidTaskType {}

impl TaskType {
    /// The longest allowed name, in bytes.
    pub const MAX_LEN: usize = 64;

    /// The name as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for TaskType {
    type Error = InvalidTaskType;

    fn try_from(name: String) -> Result<Self, Self::Error> {
        let invalid = |reason| Err(InvalidTaskType { name: name.clone(), reason });
        let mut bytes = name.bytes();
        match bytes.next() {
            None => return invalid("it is empty"),
            Some(b) if !(b.is_ascii_lowercase() || b.is_ascii_digit()) => {
                return invalid("it must start with a lowercase letter or a digit");
            }
            Some(_) => {}
        }
        if name.len() > Self::MAX_LEN {
            return invalid("it is longer than 64 characters");
        }
        if !bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b)) {
            return invalid("it may only contain a-z, 0-9, '.', '_' and '-'");
        }
        Ok(TaskType(name))
    }
}

impl FromStr for TaskType {
    type Err = InvalidTaskType;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        TaskType::try_from(s.to_owned())
    }
}

impl From<TaskType> for String {
    fn from(t: TaskType) -> String {
        t.0
    }
}

impl fmt::Display for TaskType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for TaskType {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_valid_names() {
        for name in ["a", "order.timeout", "device-offline", "x_1", "0", &"a".repeat(64)] {
            assert_eq!(name.parse::<TaskType>().unwrap().as_str(), name);
        }
    }

    #[test]
    fn rejects_invalid_names() {
        for name in ["", "Order", ".x", "-x", "a{b}", "a b", "a:b", "é", &"a".repeat(65)] {
            let err = name.parse::<TaskType>().unwrap_err().to_string();
            assert!(err.contains("invalid task type"), "{name}: {err}");
        }
    }
}
