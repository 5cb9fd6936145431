//! The key layout of a type, written once: every other module asks [`Keys`] for a key's name.

use serde::Deserialize;

use crate::task_type::TaskType;

/// The names of one task type's keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys {
    /// `P:{T}:due`: ZSET id → due ms (public).
    pub due: String,
    /// `P:{T}:payload`: HASH id → payload (public).
    pub payload: String,
    /// `P:{T}:stats`: HASH of counters.
    pub stats: String,
    /// `P:{T}:leases`: ZSET id → lease expiry ms, of hosts that leased per task (before claim leases):
    /// still reaped, never written.
    pub leases: String,
    /// `P:{T}:tokens`: HASH id → `<token>:<attempt>[@<holder host id>]`, of hosts that leased per task:
    /// still reaped, never written.
    pub tokens: String,
    /// `P:{T}:claims`: ZSET claim id → lease expiry ms (one lease per claim).
    pub claims: String,
    /// `P:{T}:claimed`: HASH claim id → its holder, ids and attempts; `<claim id>:live` → which are
    /// still leased; `leased` → how many tasks are (see `scripts/prelude.lua`).
    pub claimed: String,
    /// `P:{T}:running`: SET of the ids leased under claims (one run of an id at a time).
    pub running: String,
    /// `P:{T}:held`: HASH id → `<due ms the client gave>:<due ms while held>`, of ids scheduled
    /// again while an earlier run holds its lease (see `scripts/prelude.lua`'s unhold).
    pub held: String,
    /// `P:{T}:attempts`: HASH id → attempts so far.
    pub attempts: String,
    /// `P:{T}:errors`: HASH id → last error text.
    pub errors: String,
    /// `P:{T}:dead`: ZSET id → time of death ms.
    pub dead: String,
    /// `P:{T}:seq`: token counter.
    pub seq: String,
    /// `P:{T}:outbox`: HASH entry id → encoded follow-up.
    pub outbox: String,
    /// `P:{T}:delivered:`: prefix of the outbox delivery markers.
    pub delivered_prefix: String,
    /// `P:{T}:events`: STREAM of outcomes, when enabled for the type.
    pub events: String,
    /// `P:{T}:recur`: HASH of the type's recurring schedules and their armed occurrences.
    pub recur: String,
    /// `P:{T}:throttle`: HASH, the token bucket of the type's `rate`.
    pub throttle: String,
    /// `P:{T}:paused`: STRING, exists while the type is paused (its end in ms, or 0).
    pub paused: String,
    /// `P:{T}:cancels`: HASH id → the lease token `hourglass cancel` asked to stop.
    pub cancels: String,
    /// `P:{T}:trace`: HASH id → W3C traceparent a client attached (optional; read while tracing is on).
    pub trace: String,
    /// `P:{T}:member`: HASH id → `<callback type>\n<group id>`, of the type's tasks that are
    /// workflow group children (see `scripts/group_join.lua`).
    pub member: String,
    /// `P:{T}:progress`: HASH id → the latest progress its handler reported (JSON), until it ends.
    pub progress: String,
    /// `P:{T}:groups`: ZSET group id → opened ms, of the groups with callbacks of this type that
    /// are not done.
    pub groups: String,
    /// `P:{T}:graphs`: ZSET graph id → opened ms, of the workflow graphs living in this type that
    /// are not done.
    pub graphs: String,
    prefix_tag: String,
}

/// The keys of one workflow graph, in its home type's slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GraphKeys {
    /// `P:{C}:graph:<G>`: HASH, the graph's state and its nodes counted by state.
    pub graph: String,
    /// `P:{C}:graph-nodes:<G>`: HASH node index → the node (JSON: name, task, rule, parents, children, state).
    pub nodes: String,
}

/// The keys of one workflow group, in its callback type's slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupKeys {
    /// `P:{C}:group:<G>`: HASH, the group's callback, state and counts.
    pub group: String,
    /// `P:{C}:group-pending:<G>`: HASH of children not ended yet, each `<type>\n<id>` → its join number.
    pub pending: String,
    /// `P:{C}:group-failed:<G>`: HASH child → `dead` | `cancelled`.
    pub failed: String,
}

impl Keys {
    /// Builds the key names of type `t` under `prefix`.
    pub fn new(prefix: &str, t: &TaskType) -> Keys {
        let k = |suffix: &str| format!("{prefix}:{{{t}}}:{suffix}");
        Keys {
            due: k("due"),
            payload: k("payload"),
            stats: k("stats"),
            leases: k("leases"),
            tokens: k("tokens"),
            claims: k("claims"),
            claimed: k("claimed"),
            running: k("running"),
            held: k("held"),
            attempts: k("attempts"),
            errors: k("errors"),
            dead: k("dead"),
            seq: k("seq"),
            outbox: k("outbox"),
            delivered_prefix: k("delivered:"),
            events: k("events"),
            recur: k("recur"),
            throttle: k("throttle"),
            paused: k("paused"),
            cancels: k("cancels"),
            trace: k("trace"),
            member: k("member"),
            progress: k("progress"),
            groups: k("groups"),
            graphs: k("graphs"),
            prefix_tag: k(""),
        }
    }

    /// The keys of group `g` whose callback is of this type (the group id
    /// comes last, so no id can name another group's key).
    pub fn group(&self, g: &crate::group::GroupId) -> GroupKeys {
        GroupKeys {
            group: format!("{}group:{g}", self.prefix_tag),
            pending: format!("{}group-pending:{g}", self.prefix_tag),
            failed: format!("{}group-failed:{g}", self.prefix_tag),
        }
    }

    /// The keys of graph `g` living in this type (the graph id comes last).
    pub fn graph(&self, g: &crate::group::GroupId) -> GraphKeys {
        GraphKeys {
            graph: format!("{}graph:{g}", self.prefix_tag),
            nodes: format!("{}graph-nodes:{g}", self.prefix_tag),
        }
    }

    /// Every key of the type with a fixed name (not the per-entry delivery markers).
    pub fn fixed(&self) -> [&str; 23] {
        [
            &self.due,
            &self.payload,
            &self.stats,
            &self.leases,
            &self.tokens,
            &self.claims,
            &self.claimed,
            &self.running,
            &self.held,
            &self.attempts,
            &self.errors,
            &self.dead,
            &self.seq,
            &self.outbox,
            &self.events,
            &self.recur,
            &self.throttle,
            &self.paused,
            &self.cancels,
            &self.trace,
            &self.member,
            &self.progress,
            &self.groups,
        ]
    }

    /// The delivery marker of one outbox entry, in this (the target) type's slot.
    pub fn delivered(&self, entry_id: &[u8]) -> Vec<u8> {
        let mut key = self.delivered_prefix.clone().into_bytes();
        key.extend_from_slice(entry_id);
        key
    }
}

/// A key prefix: 1 to 64 characters, no whitespace, braces or glob characters.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct KeyPrefix(String);

impl Default for KeyPrefix {
    fn default() -> Self {
        KeyPrefix("hourglass".into())
    }
}

impl KeyPrefix {
    /// The prefix as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for KeyPrefix {
    type Error = String;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        if s.is_empty() || s.len() > 64 {
            return Err(format!("invalid key prefix {s:?}: it must be 1 to 64 characters"));
        }
        // Braces would break the hash tag; glob characters the notification pattern.
        if s.chars().any(|c| c.is_whitespace() || "{}*?[]\\".contains(c)) {
            return Err(format!("invalid key prefix {s:?}: no whitespace, braces or * ? [ ] \\ allowed"));
        }
        Ok(KeyPrefix(s))
    }
}

impl std::str::FromStr for KeyPrefix {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        KeyPrefix::try_from(s.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_names_carry_the_hash_tag() {
        let k = Keys::new("hg", &"order.timeout".parse().unwrap());
        assert_eq!(k.due, "hg:{order.timeout}:due");
        assert_eq!(k.delivered(b"x:1:0"), b"hg:{order.timeout}:delivered:x:1:0".to_vec());
        assert_eq!(k.group(&"g:1".parse().unwrap()).pending, "hg:{order.timeout}:group-pending:g:1");
    }
}

/// The key table in the crate's docs (`lib.rs`) names every key [`Keys`],
/// [`GroupKeys`] and [`GraphKeys`] document, and nothing they do not (the
/// three keys outside a type's slot aside, each found where it is made).
#[cfg(test)]
mod table {
    use std::collections::BTreeSet;

    /// The backticked `P:...` names at the start of each line's text that `starts` picks.
    fn names(source: &str, starts: &str) -> BTreeSet<String> {
        source
            .lines()
            .filter_map(|l| l.trim_start().strip_prefix(starts))
            .filter_map(|rest| rest.trim_start().strip_prefix("`P:"))
            .filter_map(|rest| rest.split('`').next())
            .map(|name| format!("P:{name}"))
            .collect()
    }

    #[test]
    fn the_docs_key_table_is_the_key_layout() {
        let table = names(include_str!("lib.rs"), "//! |");
        let fields = names(include_str!("keys.rs"), "///");
        assert!(fields.len() >= 30 && table.len() >= 30, "read {} fields, {} rows", fields.len(), table.len());
        // keys.rs documents the markers by their prefix; the table by one marker.
        let fields: BTreeSet<String> =
            fields.into_iter().map(|f| if f.ends_with(":delivered:") { f + "<entry>" } else { f }).collect();
        let missing: Vec<&String> = fields.difference(&table).collect();
        assert!(missing.is_empty(), "keys.rs has keys the table in lib.rs omits: {missing:?}");
        let outside = ["P:hosts", "P:cancel", "P:recurring"];
        let extra: Vec<&String> = table.difference(&fields).filter(|k| !outside.contains(&k.as_str())).collect();
        assert!(extra.is_empty(), "the table in lib.rs has keys keys.rs does not make: {extra:?}");
        let made =
            [include_str!("host/presence.rs"), include_str!("lib.rs"), include_str!("app/recurring.rs")].concat();
        for key in outside {
            let made_as = format!("\"{{}}:{}\"", &key[2..]);
            assert!(made.contains(&made_as), "{key} is in the table but no code makes it ({made_as})");
        }
    }
}
