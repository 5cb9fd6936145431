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

impl TaskType {
    /// Shard `i` of this type: the type itself for 0, else `<type>#<i>` (keys `P:{<type>#<i>}:…`).
    /// No user can name a type so: the parser refuses `#`.
    pub fn shard(&self, i: u16) -> TaskType {
        let base = self.base();
        if i == 0 { base } else { TaskType(format!("{base}#{i}")) }
    }

    /// The type a shard belongs to (itself when it is not a shard).
    pub fn base(&self) -> TaskType {
        match self.0.split_once('#') {
            Some((base, _)) => TaskType(base.to_owned()),
            None => self.clone(),
        }
    }

    /// Which shard of its type this is (0: the type itself).
    pub fn shard_index(&self) -> u16 {
        self.0.split_once('#').and_then(|(_, i)| i.parse().ok()).unwrap_or(0)
    }

    /// A type or a shard name as found in Redis key names and messages (`order.timeout`, `order.timeout#2`).
    pub fn parse_queue(s: &str) -> Result<TaskType, InvalidTaskType> {
        let Some((base, i)) = s.split_once('#') else {
            return s.parse();
        };
        match i.parse::<u16>() {
            // Canonical numbers only (no `#02`), so each shard has one name.
            Ok(n) if n > 0 && !i.starts_with(['0', '+']) => Ok(base.parse::<TaskType>()?.shard(n)),
            _ => Err(InvalidTaskType { name: s.to_owned(), reason: "a shard number (1, 2, ...) must follow '#'" }),
        }
    }
}

/// The shard of a sharded type that holds task `id`: its Redis Cluster key
/// slot (CRC16-XMODEM of the id, or of its `{hash tag}`, mod 16384, exactly
/// `CLUSTER KEYSLOT <id>`), mod `shards`. Every Redis client library ships
/// the slot function, so an application picks the shard in one line.
pub fn shard_of(id: &[u8], shards: u16) -> u16 {
    if shards <= 1 {
        return 0;
    }
    key_slot(id) % shards
}

/// `CLUSTER KEYSLOT` of `key`: the hash tag rule of the Redis Cluster spec.
pub fn key_slot(key: &[u8]) -> u16 {
    let hashed = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let close = key[open + 1..].iter().position(|&b| b == b'}')?;
            // An empty tag (`{}`) hashes the whole key.
            (close > 0).then(|| &key[open + 1..open + 1 + close])
        })
        .unwrap_or(key);
    crc16::State::<crc16::XMODEM>::calculate(hashed) % 16384
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
    fn shards_are_named_apart_and_parse_back() {
        let t: TaskType = "order.timeout".parse().unwrap();
        assert_eq!(t.shard(0), t);
        assert_eq!(t.shard(2).as_str(), "order.timeout#2");
        assert_eq!((t.shard(2).base(), t.shard(2).shard_index(), t.shard_index()), (t.clone(), 2, 0));
        assert_eq!(TaskType::parse_queue("order.timeout#2").unwrap(), t.shard(2));
        assert_eq!(TaskType::parse_queue("order.timeout").unwrap(), t);
        for bad in ["order.timeout#0", "order.timeout#02", "order.timeout#", "order.timeout#x", "Bad#1"] {
            assert!(TaskType::parse_queue(bad).is_err(), "{bad}");
        }
        assert!("order.timeout#2".parse::<TaskType>().is_err(), "users cannot name a shard");
    }

    #[test]
    fn key_slots_match_redis() {
        // Values of CLUSTER KEYSLOT from the Redis Cluster specification and a live server.
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"somekey"), 11058);
        assert_eq!(key_slot(b"foo{hash_tag}"), 2515);
        assert_eq!(key_slot(b"{hash_tag}bar"), 2515);
        assert_eq!(key_slot(b"foo{}{bar}"), key_slot(b"foo{}{bar}"));
        assert_eq!(shard_of(b"foo", 3), 12182 % 3);
        assert_eq!(shard_of(b"foo", 1), 0);
    }

    #[test]
    fn rejects_invalid_names() {
        for name in ["", "Order", ".x", "-x", "a{b}", "a b", "a:b", "é", &"a".repeat(65)] {
            let err = name.parse::<TaskType>().unwrap_err().to_string();
            assert!(err.contains("invalid task type"), "{name}: {err}");
        }
    }
}
