//! The validated name of a task type, which picks the handler and the Redis keys.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, LazyLock, Mutex};

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
    /// The queue with hash tag `<type>#<k>` (keys `P:{<type>#<k>}:…`); `k = 0`
    /// is the type itself. `k` is a tag number, not a shard index: shard `i`
    /// of N is [`shard_tags`]`(T, N)[i]`. (Before, shard `i` had the tag
    /// `T#i`; those old tags are still named so.) No user can name a type so:
    /// the parser refuses `#`.
    pub fn shard(&self, k: u16) -> TaskType {
        let base = self.base();
        if k == 0 { base } else { TaskType(format!("{base}#{k}")) }
    }

    /// The type a shard belongs to (itself when it is not a shard).
    pub fn base(&self) -> TaskType {
        match self.0.split_once('#') {
            Some((base, _)) => TaskType(base.to_owned()),
            None => self.clone(),
        }
    }

    /// The `k` of a shard's tag `<type>#<k>` (0: the type itself). Which
    /// shard index a tag has depends on N: see [`shard_tags`].
    pub fn tag_number(&self) -> u16 {
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

/// The shard index, 0 to `shards - 1`, of the shard of a sharded type that
/// holds task `id`: its Redis Cluster key slot (CRC16-XMODEM of the id, or of
/// its `{hash tag}`, mod 16384, exactly `CLUSTER KEYSLOT <id>`), mod `shards`.
/// Every Redis client library ships the slot function. The shard's hash tag
/// is `shard_tags(T, shards)[index]` ([`shard_tag`] does both).
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

/// The 16384 slots split in `n` ranges, in order, exactly as `redis-cli
/// --cluster create` splits them over `n` masters. Its arithmetic is in C
/// `float`, so this is too: in `f64` some ranges would end one slot off
/// from 78 masters on.
pub fn slot_ranges(n: u16) -> Vec<std::ops::RangeInclusive<u16>> {
    const SLOTS: i64 = 16384;
    let n = n.max(1);
    let per_node = SLOTS as f32 / f32::from(n);
    let (mut first, mut cursor) = (0i64, 0f32);
    let mut ranges = Vec::with_capacity(usize::from(n));
    for i in 0..n {
        // `lround` rounds halves away from zero, as `f32::round` does.
        let mut last = (cursor + per_node - 1.0).round() as i64;
        if last > SLOTS || i == n - 1 {
            last = SLOTS - 1;
        }
        last = last.max(first);
        ranges.push(first as u16..=last as u16);
        first = last + 1;
        cursor += per_node;
    }
    ranges
}

/// The hash tags of the `shards` shards of type `t`, shard 0 first, chosen so
/// that each falls in its own range of [`slot_ranges`]`(shards)`: on a cluster
/// split evenly over N masters (by `redis-cli --cluster create`), N shards
/// land on N masters.
///
/// Shard 0 is `t` itself (so its keys stay those of an unsharded type). The
/// other ranges, in ascending order, go to shards 1 to N-1; shard `i`'s tag
/// is `T#k` for the smallest `k >= 1` whose slot lies in its range. Computed
/// once per type and N, then cached.
pub fn shard_tags(t: &TaskType, shards: u16) -> Arc<[TaskType]> {
    type Tags = HashMap<(TaskType, u16), Arc<[TaskType]>>;
    static CACHE: LazyLock<Mutex<Tags>> = LazyLock::new(Mutex::default);
    let key = (t.base(), shards.max(1));
    let mut cache = CACHE.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    cache.entry(key).or_insert_with_key(|(base, n)| compute_shard_tags(base, *n).into()).clone()
}

/// The shard of type `t` (its name, which is its hash tag) that holds task
/// `id` when `t` has `shards` shards: `shard_tags(t, shards)[shard_of(id, shards)]`.
pub fn shard_tag(t: &TaskType, id: &[u8], shards: u16) -> TaskType {
    shard_tags(t, shards)[usize::from(shard_of(id, shards))].clone()
}

fn compute_shard_tags(base: &TaskType, n: u16) -> Vec<TaskType> {
    let ranges = slot_ranges(n);
    let range_of = |slot: u16| ranges.partition_point(|r| *r.end() < slot);
    let home = range_of(key_slot(base.as_str().as_bytes()));
    let mut tags: Vec<Option<TaskType>> = vec![None; usize::from(n)];
    tags[0] = Some(base.clone());
    let mut missing = usize::from(n) - 1;
    // Each try lands in a given range with odds 1/n (n <= 256 in a config):
    // every range is found after about n·ln(n) tries, far below 65535.
    for k in 1..=u16::MAX {
        if missing == 0 {
            break;
        }
        let tag = base.shard(k);
        let range = range_of(key_slot(tag.as_str().as_bytes()));
        if range == home {
            continue;
        }
        // The ranges below shard 0's take shards 1.., those above keep their number.
        let i = if range < home { range + 1 } else { range };
        if tags[i].is_none() {
            tags[i] = Some(tag);
            missing -= 1;
        }
    }
    tags.into_iter().map(|t| t.expect("65535 tag numbers reach every slot range")).collect()
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
        assert_eq!((t.shard(2).base(), t.shard(2).tag_number(), t.tag_number()), (t.clone(), 2, 0));
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
    fn slot_ranges_split_as_redis_cli_does() {
        // What `redis-cli --cluster create` (7.0) printed for 3, 5, 7 and 78 masters.
        assert_eq!(slot_ranges(3), [0..=5460, 5461..=10922, 10923..=16383]);
        assert_eq!(slot_ranges(5), [0..=3276, 3277..=6553, 6554..=9829, 9830..=13106, 13107..=16383]);
        let seven = [0..=2340, 2341..=4680, 4681..=7021, 7022..=9361, 9362..=11702, 11703..=14042, 14043..=16383];
        assert_eq!(slot_ranges(7), seven);
        // Where `float` and `double` arithmetic part: redis-cli's is `float`.
        assert_eq!(slot_ranges(78)[67..69], [14073..=14283, 14284..=14493]);
        assert_eq!(slot_ranges(1), [0..=16383]);
        for n in 1..=256u16 {
            let r = slot_ranges(n);
            assert_eq!((r.len(), *r[0].start(), *r[r.len() - 1].end()), (usize::from(n), 0, 16383), "{n}");
            assert!(r.windows(2).all(|w| *w[1].start() == *w[0].end() + 1), "{n}: contiguous");
            assert!(r.iter().all(|r| r.len().abs_diff(16384 / usize::from(n)) <= 1), "{n}: even");
        }
    }

    #[test]
    fn shard_tags_match_the_servers_key_slots() {
        // CLUSTER KEYSLOT of a live server: hot 6093 (range 1 of 3), hot#1 10178 and hot#2 6049
        // (range 1: the old tags put all three on one master), hot#3 1920, hot#4 14183.
        for (key, slot) in [("hot", 6093), ("hot#1", 10178), ("hot#2", 6049), ("hot#3", 1920), ("hot#4", 14183)] {
            assert_eq!(key_slot(key.as_bytes()), slot, "{key}");
        }
        assert_eq!(key_slot(b"hourglass:{hot#7}:due"), 1796);
        let hot: TaskType = "hot".parse().unwrap();
        let names = |tags: &[TaskType]| tags.iter().map(ToString::to_string).collect::<Vec<_>>();
        assert_eq!(names(&shard_tags(&hot, 3)), ["hot", "hot#3", "hot#4"]);
        // order.timeout 15219 (range 2); order.timeout#3 4050 (range 0), #2 8179 (range 1).
        assert_eq!(key_slot(b"order.timeout"), 15219);
        let ot: TaskType = "order.timeout".parse().unwrap();
        assert_eq!(names(&shard_tags(&ot, 3)), ["order.timeout", "order.timeout#3", "order.timeout#2"]);
        assert_eq!(names(&shard_tags(&ot, 1)), ["order.timeout"]);
        // Cached: the same tags, computed once; a shard's name gives its type's tags.
        assert!(Arc::ptr_eq(&shard_tags(&ot, 3), &shard_tags(&ot.shard(2), 3)));
        assert_eq!(shard_tag(&hot, b"foo", 3), shard_tags(&hot, 3)[usize::from(shard_of(b"foo", 3))]);
    }

    #[test]
    fn every_names_shards_fall_in_distinct_ranges() {
        let check = |name: &str, n: u16| {
            let t: TaskType = name.parse().unwrap();
            let tags = compute_shard_tags(&t, n);
            let ranges = slot_ranges(n);
            let range_of =
                |t: &TaskType| ranges.iter().position(|r| r.contains(&key_slot(t.as_str().as_bytes()))).unwrap();
            assert_eq!((tags.len(), &tags[0]), (usize::from(n), &t), "{name} {n}");
            let mut seen: Vec<usize> = tags.iter().map(range_of).collect();
            // Shards 1.. take the other ranges in ascending order.
            assert!(seen[1..].windows(2).all(|w| w[0] < w[1]), "{name} {n}: {tags:?}");
            seen.sort_unstable();
            seen.dedup();
            assert_eq!(seen.len(), usize::from(n), "{name} {n}: {tags:?}");
            assert!(tags[1..].iter().all(|s| s.base() == t && s.tag_number() > 0), "{name} {n}");
            assert_eq!(compute_shard_tags(&t, n), tags, "deterministic");
        };
        for i in 0..20_000 {
            let name = format!("type-{i}");
            for n in (2..=8).chain([16]) {
                check(&name, n);
            }
            // The larger N on a sample: each costs about n·ln(n) hashes.
            if i % 20 == 0 {
                check(&name, 64);
                check(&name, 256);
            }
        }
        // The smallest tag number wins each range.
        let t: TaskType = "hot".parse().unwrap();
        let tags = compute_shard_tags(&t, 8);
        let ranges = slot_ranges(8);
        for s in &tags[1..] {
            let mine = ranges.iter().position(|r| r.contains(&key_slot(s.as_str().as_bytes()))).unwrap();
            assert!(
                (1..s.tag_number()).all(|k| !ranges[mine].contains(&key_slot(t.shard(k).as_str().as_bytes()))),
                "{s}"
            );
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
