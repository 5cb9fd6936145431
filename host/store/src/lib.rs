//! Hourglass's Redis side: every read and write of tasks, and the Lua scripts that make them atomic.
//!
//! This crate links no wasmtime: an application that schedules, cancels or
//! inspects tasks from Rust depends on it alone, and the host (`hourglass`)
//! builds its pipeline on top of it. Cargo keeps the arrow one way.
//!
//! It serves two audiences. An application gets the application API
//! (schedule, show, cancel, postpone, pause, stats, dead letters, recurring
//! schedules, workflow groups and graphs, progress). What only a host may do
//! (claim, settle, extend, release, presence, progress writes) is behind the
//! `host` feature, which the `hourglass` crate turns on: an application that
//! links this crate alone cannot call it (`cargo test -p hourglass-store
//! --doc`, run on its own so the host's features are not merged in, shows a
//! settle refused at compile time).
//!
//! # Key layout (prefix `P`, task type `T`, a group's or graph's home type `C`, its id `G`)
//!
//! Every key of a type carries the hash tag `{T}`, so a type lives in one
//! Redis Cluster slot and each script touches one slot only. The names are
//! written once, in [`Keys`] (a test holds this table to it).
//!
//! | key                         | type   | content                                        |
//! |-----------------------------|--------|------------------------------------------------|
//! | `P:{T}:due`                 | ZSET   | id → due time (ms); written by apps (public)   |
//! | `P:{T}:payload`             | HASH   | id → payload bytes (public)                    |
//! | `P:{T}:stats`               | HASH   | succeeded, failed, retried, dead counters      |
//! | `P:{T}:claims`              | ZSET   | claim id → lease expiry (ms): one per claim    |
//! | `P:{T}:claimed`             | HASH   | claim id → holder, ids, attempts; which live   |
//! | `P:{T}:running`             | SET    | ids leased under claims (one run of an id)     |
//! | `P:{T}:held`                | HASH   | id → schedules held while a run holds it       |
//! | `P:{T}:leases`              | ZSET   | per-task leases of older hosts: reaped only    |
//! | `P:{T}:tokens`              | HASH   | their tokens: reaped only                      |
//! | `P:{T}:attempts`            | HASH   | id → attempts that ended without an ack        |
//! | `P:{T}:errors`              | HASH   | id → last error                                |
//! | `P:{T}:dead`                | ZSET   | id → time of death (ms)                        |
//! | `P:{T}:seq`                 | STRING | token counter                                  |
//! | `P:{T}:outbox`              | HASH   | entry id → follow-up, group work or report     |
//! | `P:{T}:delivered:<entry>`   | STRING | outbox delivery marker, PX 24h                 |
//! | `P:{T}:events`              | STREAM | outcomes, when `events = true` (made at start) |
//! | `P:{T}:recur`               | HASH   | recurring schedules and their armed occurrences|
//! | `P:{T}:throttle`            | HASH   | the token bucket of the type's `rate`          |
//! | `P:{T}:paused`              | STRING | exists while the type is paused                |
//! | `P:{T}:cancels`             | HASH   | id → lease token a cancel asked to stop (24 h) |
//! | `P:{T}:trace`               | HASH   | id → client traceparent (public, optional)     |
//! | `P:{T}:progress`            | HASH   | id → latest progress reported (JSON), till end |
//! | `P:{T}:member`              | HASH   | id → the group or graph it is a child of       |
//! | `P:{T}:groups`              | ZSET   | group id → opened ms, groups not done          |
//! | `P:{T}:graphs`              | ZSET   | graph id → opened ms, graphs not done          |
//! | `P:{C}:group:<G>`           | HASH   | a group's callback, state and counts           |
//! | `P:{C}:group-pending:<G>`   | HASH   | its children not ended → join number           |
//! | `P:{C}:group-failed:<G>`    | HASH   | its children that failed → dead, cancelled     |
//! | `P:{C}:graph:<G>`           | HASH   | a graph's state, its nodes counted by state    |
//! | `P:{C}:graph-nodes:<G>`     | HASH   | node index → the node (JSON)                   |
//! | `P:hosts`                   | HASH   | host id → heartbeat (the host API's presence)  |
//! | `P:cancel` (channel)        | PUBSUB | "<type>\n<token>\n<id>": stop that run        |
//! | `P:recurring`               | SET    | types that have recurring schedules            |
//!
//! All "now" times are taken from Redis `TIME` inside the scripts. Every
//! script checks the types of the keys it touches (and the numbers it will
//! increment) before its first write, so bad data in Redis fails a call
//! cleanly (an `HGFAULT` error naming the key) instead of losing tasks.
//!
//! # Layout
//!
//! The vocabulary first (re-exported from `hourglass-task`, which the
//! runtime shares), then the rooms of the store, cut by audience:
//!
//! - [`task_type`]: the validated type name, its shards and hash tags; [`task`]: a task's life
//!   (claimed, leased, its outcome, settled); [`group`], [`graph`]: workflow groups and graphs as data;
//! - the connection: [`target`]: where Redis is (one server, a cluster, Sentinel; ACL credentials,
//!   TLS) and the `[redis]` table; `conn.rs`: one server or a cluster, `CLUSTER NODES`;
//!   `follow.rs`: the one server's master, found again after a failover; `servers.rs`: the servers
//!   themselves (notification settings, pub/sub, info); [`redis_server`]: the one spawner of a
//!   `redis-server` (the host's managed one, the bench, the tests);
//! - `keys.rs`: the key layout; `scripts/`: the scripts, each headed with its KEYS, ARGV and
//!   guarantees; `reply.rs`: reading replies;
//! - `app/`: the application API (schedule, pause, show, postpone, stats, dead letters, recurring
//!   schedules, progress read);
//! - `workflow/`: follow-ups, groups and graphs: what the outbox holds, its passes (each entry
//!   moved on exactly once), the one delivery of reports, cancel, and group and graph progress;
//! - `host/` (feature `host`): the host API: claim, settle, extend, release, presence, progress
//!   written, recurring times kept.

// What an application's build (no `host` feature) may and may not call,
// checked by `cargo test -p hourglass-store --doc` (the Makefile's `test`):
// a build with the feature (the workspace's) has no such test.
#![cfg_attr(
    not(feature = "host"),
    doc = r#"
# An application's build

It schedules:

```no_run
# async fn app(store: hourglass_store::Store) -> anyhow::Result<()> {
let t: hourglass_store::task_type::TaskType = "order.expire".parse()?;
store.schedule(&t, b"o-1", 1_700_000_000_000, Some(b"{}"), hourglass_store::ScheduleMode::Upsert).await?;
# Ok(()) }
```

and cannot settle, claim or extend, which only a host may:

```compile_fail,E0599
# async fn app(store: hourglass_store::Store) {
let t: hourglass_store::task_type::TaskType = "order.expire".parse().unwrap();
let _ = store.settle(&t, &[], None).await;
# }
```
"#
)]

pub use hourglass_task::{graph, group, task, task_type};
pub mod redis_server;
pub mod target;

mod app;
mod conn;
mod follow;
#[cfg(feature = "host")]
mod host;
mod keys;
mod reply;
mod scripts;
mod servers;
mod workflow;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};

pub use app::lookup::{LeaseView, PayloadPreview, TaskState, TaskView};
pub use app::progress::{ProgressReport, ProgressView};
pub use app::queues::{DeadTask, Paused, TypeStats};
pub use app::recurring::{RecurState, SyncOutcome};
pub use app::tasks::{MAX_BATCH_BYTES, MAX_BATCH_TASKS, NewTask, ScheduleMode};
pub use conn::{ClusterNode, Conn, Trouble, classify, parse_cluster_nodes};
#[cfg(feature = "host")]
pub use host::claims::{ClaimLimits, Committed, Extended, Rate};
#[cfg(feature = "host")]
pub use host::presence::{HolderCount, Presence};
#[cfg(feature = "host")]
pub use host::progress::stored_value;
pub use keys::{GraphKeys, GroupKeys, KeyPrefix, Keys};
pub use servers::{Message, Server, Subscription, answers, shut_down};
pub use target::{RedisConfig, Secret, Target, loopback_port};
pub use workflow::cancel::CancelEffect;
pub use workflow::entries::{decode_followup, decode_work, encode_followup, encode_work};
pub use workflow::graphs::{
    Declared, GraphCancelEffect, GraphRefusal, GraphView, MAX_EDGES, MAX_NODES, NodeSpec, NodeView,
};
pub use workflow::groups::{
    Added, CHILDREN_PER_CALL, Fired, GroupMoves, GroupRefusal, GroupView, NewChild, Sealed, group_refusal,
};
pub use workflow::outbox::OutboxFlush;
pub use workflow::progress::{GraphProgress, GroupProgress};

use crate::task_type::{TaskType, shard_tags};
use conn::{CONNECT_TIMEOUT, ConnKind, RESPONSE_TIMEOUT};
pub use follow::MasterInfo;
use follow::{Master, why_no_answer};
use scripts::Scripts;
pub use scripts::holders_source;

/// Bound of the per-call work of "all" dead-letter operations and outbox scans.
const BATCH: usize = 1000;

/// A handle on the Redis that holds the tasks; cheap to clone (one shared, auto-reconnecting connection).
#[derive(Clone)]
pub struct Store {
    conn: Conn,
    prefix: String,
    url: String,
    scripts: Arc<Scripts>,
    target: Arc<Target>,
    /// Host id recorded with every lease this store claims ("" = none).
    holder: Arc<str>,
    /// The shards (their tags, shard 0 first) of the sharded types (`[types.T] shards`); absent: one.
    shards: Arc<HashMap<TaskType, Arc<[TaskType]>>>,
    /// Whether settles deliver follow-ups themselves: on one server, until a
    /// proxy in front of it refuses a script's keys of several slots (CROSSSLOT).
    direct_followups: Arc<std::sync::atomic::AtomicBool>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("url", &self.url).field("prefix", &self.prefix).finish()
    }
}

impl Store {
    /// Connects to Redis; fails within about 4s when nothing answers, naming the cause when known.
    /// `url` may also be a `redis+cluster://h1:p1,h2:p2` seed list (see [`Target`]).
    pub async fn connect(url: &str, prefix: &KeyPrefix) -> Result<Store> {
        Store::connect_to(&Target::parse(url)?, prefix).await
    }

    /// Connects to one server or a cluster, with the target's credentials and TLS.
    pub async fn connect_to(target: &Target, prefix: &KeyPrefix) -> Result<Store> {
        let shown = target.shown();
        let conn = if target.is_cluster() {
            let client = target.client()?;
            let cluster = target.cluster_client(CONNECT_TIMEOUT, RESPONSE_TIMEOUT)?;
            match tokio::time::timeout(CONNECT_TIMEOUT * 2, cluster.get_async_connection()).await {
                Ok(Ok(conn)) => Conn(ConnKind::Cluster(conn)),
                Ok(Err(e)) => bail!("cannot connect to Redis at {shown}: {}", target.scrub(&e.to_string())),
                Err(_) => bail!(
                    "cannot connect to Redis at {shown}: {}",
                    why_no_answer(&client, target, CONNECT_TIMEOUT * 2).await
                ),
            }
        } else {
            Conn(ConnKind::Single(Master::connect(target, CONNECT_TIMEOUT, RESPONSE_TIMEOUT).await?))
        };
        let store = Store {
            conn,
            prefix: prefix.as_str().to_owned(),
            url: shown,
            scripts: Arc::new(Scripts::new()),
            target: Arc::new(target.clone()),
            holder: Arc::from(""),
            shards: Arc::default(),
            direct_followups: Arc::new(std::sync::atomic::AtomicBool::new(!target.is_cluster())),
        };
        store.ping().await?;
        Ok(store)
    }

    /// A clone of the store's shared connection, for commands of a caller's
    /// own (the benchmark's load, an operator's tool).
    pub fn connection(&self) -> Conn {
        self.conn.clone()
    }

    /// This store, recording `host_id` as the holder of every lease it claims (shown by `hourglass stats`).
    pub fn with_holder(mut self, host_id: &str) -> Store {
        self.holder = Arc::from(host_id);
        self
    }

    /// This store, with scripts that take "now" (ms) from the integer at
    /// `clock_key` instead of Redis `TIME`. For tests only: the model test
    /// (tests/store/model.rs) steps time by hand to expire leases exactly when it
    /// means to. One server only (the key is outside every type's slot).
    /// Built only with the `manual-clock` feature, which the store's own
    /// tests turn on: a production build has no such switch.
    #[cfg(feature = "manual-clock")]
    pub fn with_manual_clock(mut self, clock_key: &str) -> Store {
        self.scripts = Arc::new(Scripts::with_manual_clock(clock_key));
        self
    }

    /// This store, spreading each of `sharded` (a type and its `shards = N`)
    /// over its N shards (see [`Store::shard_for`]). Their tags are computed
    /// here, once, so routing a task costs one map lookup.
    pub fn with_shards<'a>(mut self, sharded: impl IntoIterator<Item = (&'a TaskType, u16)>) -> Store {
        self.shards = Arc::new(sharded.into_iter().map(|(t, n)| (t.clone(), shard_tags(t, n))).collect());
        self
    }

    /// This store, spreading type `t` over `shards` shards as hosts with
    /// `[types.T] shards = N` do: for an application that schedules through
    /// this API without a `runner.toml` (the Python and Node clients take the
    /// same map).
    pub fn with_type_shards(mut self, t: &TaskType, shards: u16) -> Store {
        let mut map = (*self.shards).clone();
        if shards > 1 {
            map.insert(t.base(), shard_tags(t, shards));
        } else {
            map.remove(&t.base());
        }
        self.shards = Arc::new(map);
        self
    }

    /// How many shards type `t` has (1 unless `[types.T] shards` says more).
    pub fn shard_count(&self, t: &TaskType) -> u16 {
        self.tags_of(t).map_or(1, |tags| tags.len() as u16)
    }

    /// The current shards of `t`'s type, shard 0 first; `None` when it has one.
    fn tags_of(&self, t: &TaskType) -> Option<&Arc<[TaskType]>> {
        // A type's own name needs no copy to look up; only a shard's does.
        if t.tag_number() == 0 { self.shards.get(t) } else { self.shards.get(&t.base()) }
    }

    /// Every shard of `t`, shard 0 (the type itself) first; a shard name is its own only shard.
    pub fn shards_of(&self, t: &TaskType) -> Vec<TaskType> {
        if t.tag_number() > 0 {
            return vec![t.clone()];
        }
        self.tags_of(t).map_or_else(|| vec![t.clone()], |tags| tags.to_vec())
    }

    /// The shard of `t` that holds task `id`: its tag from
    /// [`shard_tags`], at the index [`shard_of`](crate::task_type::shard_of)
    /// its id; `t` itself when it has one shard or is a shard name.
    pub fn shard_for(&self, t: &TaskType, id: &[u8]) -> TaskType {
        if t.tag_number() > 0 {
            return t.clone();
        }
        match self.tags_of(t) {
            Some(tags) => tags[usize::from(crate::task_type::shard_of(id, tags.len() as u16))].clone(),
            None => t.clone(),
        }
    }

    /// Which shard (0 to N-1) of its type `t` is; `None` for a tag that is
    /// none of the type's current shards (left by a lowered `shards` or by
    /// the tags of an earlier version, `T#1` to `T#N-1`).
    pub fn shard_index(&self, t: &TaskType) -> Option<u16> {
        match self.tags_of(t) {
            Some(tags) => tags.iter().position(|s| s == t).map(|i| i as u16),
            None => (t.tag_number() == 0).then_some(0),
        }
    }

    /// Where to look for task `id` of `t`: its own shard, then the others
    /// (where its recurring occurrences and group callbacks are, in shard 0),
    /// then the tags earlier versions gave the same N shards (`T#1` to
    /// `T#N-1`) that are not current, whose tasks the hosts drain.
    pub(crate) fn lookup_order(&self, t: &TaskType, id: &[u8]) -> Vec<TaskType> {
        let own = self.shard_for(t, id);
        let mut order = vec![own.clone()];
        if t.tag_number() == 0 {
            let current = self.shards_of(t);
            order.extend(current.iter().filter(|s| **s != own).cloned());
            order.extend((1..self.shard_count(t)).map(|k| t.shard(k)).filter(|s| !current.contains(s)));
        }
        order
    }

    /// The host id recorded with claims ("" when none).
    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// Where this store is connected: one server or a cluster, credentials and TLS.
    pub fn target(&self) -> &Target {
        &self.target
    }

    /// The shared connection, for commands of other modules (routed by key in a cluster).
    pub fn conn(&self) -> Conn {
        self.conn.clone()
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The channel hosts listen on for cancels of running tasks.
    pub fn cancel_channel(&self) -> String {
        format!("{}:cancel", self.prefix)
    }

    /// Every node of the cluster (empty for a single server), from `CLUSTER NODES`;
    /// nodes marked failed or without an address are left out.
    pub async fn cluster_nodes(&self) -> Result<Vec<ClusterNode>> {
        if !self.target.is_cluster() {
            return Ok(Vec::new());
        }
        let mut conn = self.conn.clone();
        let text: String =
            redis::cmd("CLUSTER").arg("NODES").query_async(&mut conn).await.context("cannot list cluster nodes")?;
        Ok(parse_cluster_nodes(&text))
    }

    /// The master in use and when it last changed (`None` for a cluster,
    /// whose client follows its masters by itself).
    pub fn master(&self) -> Option<MasterInfo> {
        match &self.conn.0 {
            ConnKind::Single(master) => Some(master.info()),
            ConnKind::Cluster(_) => None,
        }
    }

    /// A receiver whose value changes each time the master in use changes
    /// (never, for a cluster): listeners subscribe again, retries go at once.
    pub fn master_changes(&self) -> tokio::sync::watch::Receiver<u64> {
        match &self.conn.0 {
            ConnKind::Single(master) => master.changes(),
            ConnKind::Cluster(_) => tokio::sync::watch::Sender::new(0).subscribe(),
        }
    }

    /// The key names of type `t`.
    pub fn keys(&self, t: &TaskType) -> Keys {
        Keys::new(&self.prefix, t)
    }

    /// Checks that Redis answers.
    pub async fn ping(&self) -> Result<()> {
        let mut conn = self.conn.clone();
        let _: String = redis::cmd("PING")
            .query_async(&mut conn)
            .await
            .with_context(|| format!("Redis at {} does not answer PING", self.url))?;
        Ok(())
    }
}

fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
