//! Many hosts on one Redis: each host's id, its heartbeats, and which host
//! holds which leases.
//!
//! - Every `hourglass run` has an id: `[runner] host_id`, else `<hostname>-<pid>`.
//! - It beats every [`BEAT_EVERY`] into the `P:hosts` hash (Redis `TIME`, one
//!   small script); a host silent for [`GONE_AFTER`] is shown as gone, and is
//!   forgotten after [`FORGET_AFTER`]. A graceful exit marks it `stopped`.
//! - Each lease it claims records it: `P:{T}:tokens` holds `<token>:<attempt>@<host id>`
//!   (fencing compares only the token), so `hourglass stats` shows the tasks
//!   each host holds. A dead host's tasks stay listed under it until their
//!   leases expire and another host claims them again.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result};
use serde::Serialize;
use tracing::{debug, info};

use crate::store::Store;
use crate::task_type::TaskType;

/// How often a running host beats.
pub const BEAT_EVERY: Duration = Duration::from_secs(2);
/// A host silent for this long is shown as gone.
pub const GONE_AFTER: Duration = Duration::from_secs(10);
/// A host silent for this long is dropped from `P:hosts`.
pub const FORGET_AFTER: Duration = Duration::from_secs(24 * 3600);
/// Most task ids listed per host and type.
const IDS_SHOWN: usize = 20;

/// `<hostname>-<pid>`.
pub fn default_host_id() -> String {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty() && !s.chars().any(char::is_whitespace))
        .unwrap_or_else(|| "host".to_owned());
    format!("{name}-{}", std::process::id())
}

/// Static facts a host publishes with its beats.
#[derive(Debug, Clone, Serialize, serde::Deserialize, Default, PartialEq, Eq)]
pub struct HostFacts {
    /// Process id.
    pub pid: u32,
    /// Host name of the machine.
    pub hostname: String,
    /// When it started, ms since the epoch (its own clock).
    pub started_ms: i64,
    /// Hourglass version.
    pub version: String,
}

/// A running host's heartbeat; [`Presence::stop`] on graceful exit.
pub struct Presence {
    store: Store,
    id: String,
    facts: String,
    task: tokio::task::JoinHandle<()>,
}

impl Presence {
    /// Registers `id` and beats until [`Presence::stop`] (or drop).
    pub async fn start(store: &Store, id: &str) -> Result<Presence> {
        let facts = HostFacts {
            pid: std::process::id(),
            hostname: default_host_id().rsplit_once('-').map(|(h, _)| h.to_owned()).unwrap_or_default(),
            started_ms: crate::clock::now_ms(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
        };
        let facts = serde_json::to_string(&facts)?;
        beat(store, id, "up", &facts).await.context("cannot register this host in Redis")?;
        info!(host_id = %id, "host registered; heartbeats every {:?}", BEAT_EVERY);
        let task = {
            let (store, id, facts) = (store.clone(), id.to_owned(), facts.clone());
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(BEAT_EVERY).await;
                    // A failed beat is the Redis outage the runner already reports.
                    if let Err(e) = beat(&store, &id, "up", &facts).await {
                        debug!("host heartbeat: {e:#}");
                    }
                }
            })
        };
        Ok(Presence { store: store.clone(), id: id.to_owned(), facts, task })
    }

    /// This host's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Stops beating and marks the host `stopped` (graceful exit).
    pub async fn stop(self) {
        self.task.abort();
        if let Err(e) = beat(&self.store, &self.id, "stopped", &self.facts).await {
            debug!("cannot mark the host stopped: {e:#}");
        }
    }
}

impl Drop for Presence {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn beat(store: &Store, id: &str, state: &str, facts: &str) -> Result<()> {
    store.beat(id, state, facts, FORGET_AFTER.as_millis() as u64).await
}

/// Whether a host is beating.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Liveness {
    /// Heartbeats arrive.
    Alive,
    /// Exited gracefully (its leases were handed back).
    Stopped,
    /// Heartbeats stopped without a goodbye: crashed, killed or cut off.
    Gone,
}

impl std::fmt::Display for Liveness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Liveness::Alive => "alive",
            Liveness::Stopped => "stopped",
            Liveness::Gone => "gone",
        })
    }
}

/// Leases of one type a host holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Held {
    /// How many.
    pub count: u64,
    /// Up to 20 of their ids (lossy UTF-8).
    pub ids: Vec<String>,
}

/// One host as `hourglass stats` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HostInfo {
    /// Its id; "" for leases taken by hosts that record no id.
    pub id: String,
    /// Alive, stopped or gone.
    pub state: Liveness,
    /// Last heartbeat, ms since the epoch (Redis time); 0 when unknown.
    pub last_seen_ms: i64,
    /// How long ago that was, in ms (Redis time).
    pub silent_ms: i64,
    /// What it published.
    pub facts: HostFacts,
    /// Leases held, per type.
    pub holds: BTreeMap<String, Held>,
}

/// Every registered host with the leases it holds of `types`, sorted by id.
pub async fn list(store: &Store, types: &[TaskType]) -> Result<Vec<HostInfo>> {
    let presence = store.presence().await?;
    let mut hosts: BTreeMap<String, HostInfo> = BTreeMap::new();
    for (id, value) in presence.beats {
        let mut parts = value.splitn(3, ' ');
        let seen: i64 = parts.next().and_then(|s| s.parse().ok()).unwrap_or(0);
        let stopped = parts.next() == Some("stopped");
        let facts = parts.next().and_then(|j| serde_json::from_str(j).ok()).unwrap_or_default();
        let silent = presence.now_ms - seen;
        let state = if stopped {
            Liveness::Stopped
        } else if silent > GONE_AFTER.as_millis() as i64 {
            Liveness::Gone
        } else {
            Liveness::Alive
        };
        hosts.insert(
            id.clone(),
            HostInfo { id, state, last_seen_ms: seen, silent_ms: silent, facts, holds: BTreeMap::new() },
        );
    }
    // A sharded type's leases are listed per shard (`hot#1`), where they are.
    for t in types.iter().flat_map(|t| store.shards_of(t)) {
        for held in store.holders(&t, IDS_SHOWN).await? {
            let entry = hosts.entry(held.host.clone()).or_insert_with(|| HostInfo {
                id: held.host.clone(),
                // Leases of a host that never beat (or was forgotten): nobody renews them.
                state: Liveness::Gone,
                last_seen_ms: 0,
                silent_ms: 0,
                facts: HostFacts::default(),
                holds: BTreeMap::new(),
            });
            entry.holds.insert(
                t.to_string(),
                Held {
                    count: held.count,
                    ids: held.ids.iter().map(|i| String::from_utf8_lossy(i).into_owned()).collect(),
                },
            );
        }
    }
    Ok(hosts.into_values().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_id_is_hostname_and_pid() {
        let id = default_host_id();
        assert!(id.ends_with(&format!("-{}", std::process::id())), "{id}");
        assert!(!id.chars().any(char::is_whitespace));
    }
}
