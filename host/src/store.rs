//! Every Redis read and write of Hourglass, and the Lua scripts that make them atomic.
//!
//! # Key layout (prefix `P`, task type `T`)
//!
//! Every key of a type carries the hash tag `{T}`, so a type lives in one
//! Redis Cluster slot and each script touches one slot only.
//!
//! | key                         | type   | content                                        |
//! |-----------------------------|--------|------------------------------------------------|
//! | `P:{T}:due`                 | ZSET   | id → due time (ms); written by apps (public)   |
//! | `P:{T}:payload`             | HASH   | id → payload bytes (public)                    |
//! | `P:{T}:stats`               | HASH   | succeeded, failed, retried, dead counters      |
//! | `P:{T}:leases`              | ZSET   | id → lease expiry (ms)                         |
//! | `P:{T}:tokens`              | HASH   | id → `<token>:<attempt>@<host id>` (fencing)   |
//! | `P:hosts`                   | HASH   | host id → heartbeat (see `hosts`)              |
//! | `P:{T}:attempts`            | HASH   | id → attempts that ended without an ack        |
//! | `P:{T}:errors`              | HASH   | id → last error                                |
//! | `P:{T}:dead`                | ZSET   | id → time of death (ms)                        |
//! | `P:{T}:seq`                 | STRING | token counter                                  |
//! | `P:{T}:outbox`              | HASH   | entry id → encoded follow-up                   |
//! | `P:{T}:delivered:<entry>`   | STRING | outbox delivery marker, PX 24h                 |
//! | `P:{T}:events`              | STREAM | outcomes, when `events = true` for the type    |
//!
//! All "now" times are taken from Redis `TIME` inside the scripts.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Script, Value};
use serde::Serialize;

use crate::config::KeyPrefix;
use crate::target::Target;
use crate::task::{ClaimedTask, FollowUp};
use crate::task_type::TaskType;

/// How long `connect` waits for Redis to answer before giving up.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// How long the one attempt that explains a failed connect may take.
const DIAGNOSE_TIMEOUT: Duration = Duration::from_secs(1);
/// Big claims and settles run for a while inside Redis; only a dead server should time out.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound of the per-call work of "all" dead-letter operations and outbox scans.
const BATCH: usize = 1000;

/// The names of one task type's keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys {
    /// `P:{T}:due`: ZSET id → due ms (public).
    pub due: String,
    /// `P:{T}:payload`: HASH id → payload (public).
    pub payload: String,
    /// `P:{T}:stats`: HASH of counters.
    pub stats: String,
    /// `P:{T}:leases`: ZSET id → lease expiry ms.
    pub leases: String,
    /// `P:{T}:tokens`: HASH id → `<lease token>@<holder host id>` (fencing compares the token).
    pub tokens: String,
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
            attempts: k("attempts"),
            errors: k("errors"),
            dead: k("dead"),
            seq: k("seq"),
            outbox: k("outbox"),
            delivered_prefix: k("delivered:"),
            events: k("events"),
        }
    }

    /// The delivery marker of one outbox entry, in this (the target) type's slot.
    pub fn delivered(&self, entry_id: &[u8]) -> Vec<u8> {
        let mut key = self.delivered_prefix.clone().into_bytes();
        key.extend_from_slice(entry_id);
        key
    }
}

/// What one claim may take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimLimits {
    /// Most tasks one claim takes (and most expired leases it reaps).
    pub max_tasks: usize,
    /// Lease of each claimed task.
    pub lease: Duration,
    /// Larger payloads are dead-lettered at claim.
    pub max_payload_bytes: u64,
    /// Longer ids are dead-lettered at claim.
    pub max_id_bytes: usize,
}

impl Default for ClaimLimits {
    fn default() -> Self {
        ClaimLimits {
            max_tasks: 256,
            lease: Duration::from_secs(30),
            max_payload_bytes: 1024 * 1024,
            max_id_bytes: 1024,
        }
    }
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
}

/// The outcome of one task, to settle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settlement {
    /// Task id.
    pub id: Vec<u8>,
    /// The lease token it was claimed with.
    pub token: u64,
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
}

/// How a task ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Success; the follow-ups are committed atomically with it.
    Ack {
        /// Tasks to schedule (delivered through the outbox).
        followups: Vec<FollowUp>,
    },
    /// Failure; run again after `delay`.
    Retry {
        /// Delay from now (Redis time).
        delay: Duration,
        /// Why it failed.
        error: String,
    },
    /// Failure; dead-letter it.
    Dead {
        /// Why it failed.
        error: String,
    },
}

/// What settling one task did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettleResult {
    /// The outcome was committed.
    Settled,
    /// The token was stale (the lease was lost): nothing changed.
    Fenced,
}

/// Queue sizes and counters of a type.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct TypeStats {
    /// Due now or overdue, not yet claimed.
    pub due_now: u64,
    /// Due in the future.
    pub scheduled_later: u64,
    /// Leased (running or about to be reaped).
    pub in_flight: u64,
    /// In the dead-letter set now.
    pub dead: u64,
    /// Counter: acks.
    pub succeeded: u64,
    /// Counter: failed attempts.
    pub failed: u64,
    /// Counter: retries scheduled.
    pub retried: u64,
    /// Counter: tasks ever dead-lettered.
    pub dead_total: u64,
}

/// A dead-lettered task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeadTask {
    /// Task id; serialized as (lossy) UTF-8 text, see `id_hex` for the exact bytes.
    #[serde(serialize_with = "serialize_lossy")]
    pub id: Vec<u8>,
    /// The id as hex, exact for binary ids.
    pub id_hex: String,
    /// When it died, ms since the epoch.
    pub died_ms: i64,
    /// The last error.
    pub error: String,
    /// Attempts it had.
    pub attempts: u32,
    /// Size of its payload in bytes (0 when none).
    pub payload_len: u64,
}

fn serialize_lossy<S: serde::Serializer>(id: &[u8], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&String::from_utf8_lossy(id))
}

struct Scripts {
    claim: Script,
    settle: Script,
    extend: Script,
    release: Script,
    deliver: Script,
    dead_requeue: Script,
    dead_purge: Script,
    dead_list: Script,
    stats: Script,
}

/// `store/<name>.lua` behind the shared helpers of `store/prelude.lua`.
macro_rules! script {
    ($name:literal) => {
        Script::new(concat!(include_str!("store/prelude.lua"), include_str!(concat!("store/", $name, ".lua"))))
    };
}

impl Scripts {
    fn new() -> Scripts {
        Scripts {
            claim: script!("claim"),
            settle: script!("settle"),
            extend: script!("extend"),
            release: script!("release"),
            deliver: script!("deliver"),
            dead_requeue: script!("dead_requeue"),
            dead_purge: script!("dead_purge"),
            dead_list: script!("dead_list"),
            stats: script!("stats"),
        }
    }
}

/// One shared connection: to a single server (auto-reconnecting) or to a Redis
/// Cluster (follows MOVED/ASK and topology changes); cheap to clone.
#[derive(Clone)]
pub struct Conn(ConnKind);

#[derive(Clone)]
enum ConnKind {
    Single(ConnectionManager),
    Cluster(redis::cluster_async::ClusterConnection),
}

impl redis::aio::ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> redis::RedisFuture<'a, Value> {
        match &mut self.0 {
            ConnKind::Single(c) => c.req_packed_command(cmd),
            ConnKind::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<Value>> {
        match &mut self.0 {
            ConnKind::Single(c) => c.req_packed_commands(pipeline, offset, count),
            ConnKind::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match &self.0 {
            ConnKind::Single(c) => c.get_db(),
            ConnKind::Cluster(c) => c.get_db(),
        }
    }
}

/// A node of a Redis Cluster, from `CLUSTER NODES`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ClusterNode {
    /// Host or IP the node announces.
    pub host: String,
    /// Its client port.
    pub port: u16,
    /// A master (serves slots) rather than a replica.
    pub master: bool,
}

/// A handle on the Redis that holds the tasks; cheap to clone (one shared, auto-reconnecting connection).
#[derive(Clone)]
pub struct Store {
    client: redis::Client,
    conn: Conn,
    prefix: String,
    url: String,
    scripts: Arc<Scripts>,
    target: Arc<Target>,
    /// Host id recorded with every lease this store claims ("" = none).
    holder: Arc<str>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("url", &self.url).field("prefix", &self.prefix).finish()
    }
}

/// `url` without credentials or query (which may hold a password), for messages.
pub fn redact_url(url: &str) -> String {
    let url = url.split_once('?').map_or(url, |(base, _)| base);
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}://{}", &rest[at + 1..]),
        None => url.to_owned(),
    }
}

/// Why connecting took longer than `waited`: the connection manager and the
/// cluster client retry every failure, a refused TLS certificate or password
/// too, until the timeout hides it. One more plain attempt names the cause.
async fn why_no_answer(client: &redis::Client, target: &Target, waited: Duration) -> String {
    let config = redis::AsyncConnectionConfig::new().set_connection_timeout(Some(DIAGNOSE_TIMEOUT));
    let attempt = client.get_multiplexed_async_connection_with_config(&config);
    match tokio::time::timeout(DIAGNOSE_TIMEOUT, attempt).await {
        Ok(Err(e)) => target.scrub(&e.to_string()),
        _ => format!("no answer within {}s", waited.as_secs()),
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
        let client = target.client()?;
        let conn = if target.is_cluster() {
            let cluster = target.cluster_client(CONNECT_TIMEOUT, RESPONSE_TIMEOUT)?;
            match tokio::time::timeout(CONNECT_TIMEOUT * 2, cluster.get_async_connection()).await {
                Ok(Ok(conn)) => Conn(ConnKind::Cluster(conn)),
                Ok(Err(e)) => bail!("cannot connect to Redis at {shown}: {}", target.scrub(&e.to_string())),
                Err(_) => bail!("cannot connect to Redis at {shown}: {}", why_no_answer(&client, target, CONNECT_TIMEOUT * 2).await),
            }
        } else {
            Conn(ConnKind::Single(Store::single(&client, &shown, target).await?))
        };
        let store = Store {
            client,
            conn,
            prefix: prefix.as_str().to_owned(),
            url: shown,
            scripts: Arc::new(Scripts::new()),
            target: Arc::new(target.clone()),
            holder: Arc::from(""),
        };
        store.ping().await?;
        Ok(store)
    }

    async fn single(client: &redis::Client, shown: &str, target: &Target) -> Result<ConnectionManager> {
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(Some(RESPONSE_TIMEOUT));
        let conn =
            match tokio::time::timeout(CONNECT_TIMEOUT, ConnectionManager::new_with_config(client.clone(), config))
                .await
            {
                Ok(Ok(conn)) => conn,
                Ok(Err(e)) => bail!("cannot connect to Redis at {shown}: {}", target.scrub(&e.to_string())),
                Err(_) => bail!("cannot connect to Redis at {shown}: {}", why_no_answer(client, target, CONNECT_TIMEOUT).await),
            };
        Ok(conn)
    }

    /// This store, recording `host_id` as the holder of every lease it claims (shown by `hourglass stats`).
    pub fn with_holder(mut self, host_id: &str) -> Store {
        self.holder = Arc::from(host_id);
        self
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

    /// The underlying client, e.g. for pub/sub connections.
    pub fn client(&self) -> &redis::Client {
        &self.client
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

    /// Schedules (or re-schedules) a task, as an app would: payload and due time in one MULTI.
    pub async fn schedule(&self, t: &TaskType, id: &[u8], due_ms: i64, payload: Option<&[u8]>) -> Result<()> {
        let k = self.keys(t);
        let mut pipe = redis::pipe();
        pipe.atomic();
        match payload {
            Some(p) if !p.is_empty() => pipe.hset(&k.payload, id, p).ignore(),
            _ => pipe.hdel(&k.payload, id).ignore(),
        };
        pipe.zadd(&k.due, id, due_ms).ignore();
        let mut conn = self.conn.clone();
        let () = pipe.query_async(&mut conn).await.with_context(|| format!("cannot schedule a {t} task"))?;
        Ok(())
    }

    /// Cancels a scheduled task; true if it was scheduled.
    pub async fn cancel(&self, t: &TaskType, id: &[u8]) -> Result<bool> {
        let k = self.keys(t);
        let mut conn = self.conn.clone();
        let (removed, _): (i64, i64) = redis::pipe()
            .atomic()
            .zrem(&k.due, id)
            .hdel(&k.payload, id)
            .query_async(&mut conn)
            .await
            .with_context(|| format!("cannot cancel a {t} task"))?;
        Ok(removed > 0)
    }

    /// Reaps expired leases, then leases up to `limits.max_tasks` due tasks of type `t`.
    pub async fn claim(&self, t: &TaskType, limits: &ClaimLimits) -> Result<Claim> {
        let k = self.keys(t);
        let mut conn = self.conn.clone();
        let value: Value = self
            .scripts
            .claim
            .key(&k.due)
            .key(&k.payload)
            .key(&k.leases)
            .key(&k.tokens)
            .key(&k.attempts)
            .key(&k.errors)
            .key(&k.dead)
            .key(&k.seq)
            .key(&k.stats)
            .arg(limits.max_tasks.max(1))
            .arg(duration_ms(limits.lease).max(1))
            .arg(limits.max_payload_bytes)
            .arg(limits.max_id_bytes)
            .arg(&*self.holder)
            .invoke_async(&mut conn)
            .await
            .with_context(|| format!("cannot claim {t} tasks"))?;
        parse_claim(t, value).with_context(|| format!("unexpected claim reply for {t}"))
    }

    /// Commits the outcomes of finished tasks of type `t` in one atomic step, then
    /// delivers any follow-ups from the outbox.
    pub async fn settle(&self, t: &TaskType, batch: &[Settlement]) -> Result<Vec<SettleResult>> {
        self.settle_with_events(t, batch, None).await
    }

    /// [`Store::settle`], also appending one entry per committed outcome to
    /// `P:{T}:events` (capped at about `events_maxlen`) in the same atomic step.
    pub async fn settle_with_events(
        &self,
        t: &TaskType,
        batch: &[Settlement],
        events_maxlen: Option<u64>,
    ) -> Result<Vec<SettleResult>> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let k = self.keys(t);
        let mut inv = self.scripts.settle.prepare_invoke();
        inv.key(&k.due)
            .key(&k.payload)
            .key(&k.leases)
            .key(&k.tokens)
            .key(&k.attempts)
            .key(&k.errors)
            .key(&k.dead)
            .key(&k.stats)
            .key(&k.outbox)
            .key(&k.events)
            .arg(t.as_str())
            .arg(events_maxlen.unwrap_or(0));
        let mut any_followups = false;
        for s in batch {
            // Most outcomes are acks with nothing else to write: three arguments, not ten.
            if events_maxlen.is_none() && matches!(&s.outcome, Outcome::Ack { followups } if followups.is_empty()) {
                inv.arg("a").arg(&s.id).arg(s.token);
                continue;
            }
            let (kind, delay_ms, error, followups) = match &s.outcome {
                Outcome::Ack { followups } => ("ack", 0, "", followups.as_slice()),
                Outcome::Retry { delay, error } => ("retry", duration_ms(*delay), error.as_str(), &[][..]),
                Outcome::Dead { error } => ("dead", 0, error.as_str(), &[][..]),
            };
            any_followups |= !followups.is_empty();
            inv.arg(kind).arg(&s.id).arg(s.token).arg(s.run.attempt).arg(s.run.due_ms).arg(s.run.started_ms);
            inv.arg(s.run.finished_ms).arg(delay_ms).arg(error).arg(followups.len());
            for f in followups {
                inv.arg(encode_followup(f));
            }
        }
        let mut conn = self.conn.clone();
        let flags: Vec<i64> =
            inv.invoke_async(&mut conn).await.with_context(|| format!("cannot settle {} {t} tasks", batch.len()))?;
        if flags.len() != batch.len() {
            bail!("settle of {t}: {} results for {} tasks", flags.len(), batch.len());
        }
        let results: Vec<SettleResult> =
            flags.into_iter().map(|f| if f == 1 { SettleResult::Settled } else { SettleResult::Fenced }).collect();
        let committed_followups = any_followups
            && batch.iter().zip(&results).any(|(s, r)| {
                *r == SettleResult::Settled && matches!(&s.outcome, Outcome::Ack { followups } if !followups.is_empty())
            });
        if committed_followups {
            // The acks are committed; the outbox keeps the follow-ups safe, so a
            // failed delivery here is retried by the next flush, not reported as a failed settle.
            if let Err(e) = self.flush_outbox(t).await {
                tracing::warn!(task_type = %t, "follow-ups stay in the outbox for now: {e:#}");
            }
        }
        Ok(results)
    }

    /// Extends the leases of running tasks to now + `lease_ms`; false where the lease was lost.
    pub async fn extend(&self, t: &TaskType, leases: &[(Vec<u8>, u64)], lease_ms: u64) -> Result<Vec<bool>> {
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        let k = self.keys(t);
        let mut inv = self.scripts.extend.prepare_invoke();
        inv.key(&k.leases).key(&k.tokens).arg(lease_ms.max(1));
        for (id, token) in leases {
            inv.arg(id).arg(*token);
        }
        let mut conn = self.conn.clone();
        let flags: Vec<i64> =
            inv.invoke_async(&mut conn).await.with_context(|| format!("cannot extend {} {t} leases", leases.len()))?;
        Ok(flags.into_iter().map(|f| f == 1).collect())
    }

    /// Hands leased tasks back, due now, without counting the attempt; returns how many.
    pub async fn release(&self, t: &TaskType, leases: &[(Vec<u8>, u64)]) -> Result<usize> {
        if leases.is_empty() {
            return Ok(0);
        }
        let k = self.keys(t);
        let mut inv = self.scripts.release.prepare_invoke();
        inv.key(&k.leases).key(&k.tokens).key(&k.due);
        for (id, token) in leases {
            inv.arg(id).arg(*token);
        }
        let mut conn = self.conn.clone();
        let n: usize =
            inv.invoke_async(&mut conn).await.with_context(|| format!("cannot release {} {t} leases", leases.len()))?;
        Ok(n)
    }

    /// Moves every follow-up in `t`'s outbox into its target type's due set
    /// (exactly once, see `deliver.lua`); returns how many entries were moved.
    pub async fn flush_outbox(&self, t: &TaskType) -> Result<usize> {
        let k = self.keys(t);
        let mut conn = self.conn.clone();
        let mut moved = 0;
        let mut cursor: u64 = 0;
        loop {
            let (next, flat): (u64, Vec<Vec<u8>>) = redis::cmd("HSCAN")
                .arg(&k.outbox)
                .arg(cursor)
                .arg("COUNT")
                .arg(BATCH)
                .query_async(&mut conn)
                .await
                .with_context(|| format!("cannot read the {t} outbox"))?;
            for pair in flat.chunks_exact(2) {
                let (entry_id, encoded) = (&pair[0], &pair[1]);
                match decode_followup(encoded) {
                    Ok(f) => {
                        let tk = self.keys(&f.task_type);
                        let _: i64 = self
                            .scripts
                            .deliver
                            .key(&tk.due)
                            .key(&tk.payload)
                            .key(tk.delivered(entry_id))
                            .arg(&f.id)
                            .arg(f.due_ms)
                            .arg(&f.payload)
                            .arg(if f.payload.is_empty() { "0" } else { "1" })
                            .invoke_async(&mut conn)
                            .await
                            .with_context(|| format!("cannot deliver a follow-up from {t} to {}", f.task_type))?;
                    }
                    // A corrupt entry can never be delivered; dropping it keeps the outbox moving.
                    Err(e) => tracing::error!(task_type = %t, "dropping a bad outbox entry: {e:#}"),
                }
                let _: i64 = redis::cmd("HDEL")
                    .arg(&k.outbox)
                    .arg(entry_id)
                    .query_async(&mut conn)
                    .await
                    .with_context(|| format!("cannot clear the {t} outbox"))?;
                moved += 1;
            }
            cursor = next;
            if cursor == 0 {
                return Ok(moved);
            }
        }
    }

    /// Queue sizes and counters of type `t`.
    pub async fn stats(&self, t: &TaskType) -> Result<TypeStats> {
        let k = self.keys(t);
        let mut conn = self.conn.clone();
        let v: Vec<Option<u64>> = self
            .scripts
            .stats
            .key(&k.due)
            .key(&k.leases)
            .key(&k.dead)
            .key(&k.stats)
            .invoke_async(&mut conn)
            .await
            .with_context(|| format!("cannot read the stats of {t}"))?;
        let n = |i: usize| v.get(i).copied().flatten().unwrap_or(0);
        Ok(TypeStats {
            due_now: n(0),
            scheduled_later: n(1).saturating_sub(n(0)),
            in_flight: n(2),
            dead: n(3),
            succeeded: n(4),
            failed: n(5),
            retried: n(6),
            dead_total: n(7),
        })
    }

    /// How many tasks of `t` fall due in each of `buckets` consecutive windows of
    /// `width_ms` starting at `from_ms` (one ZCOUNT per window, pipelined).
    pub async fn due_buckets(&self, t: &TaskType, from_ms: i64, width_ms: i64, buckets: usize) -> Result<Vec<u64>> {
        let k = self.keys(t);
        let mut pipe = redis::pipe();
        for b in 0..buckets as i64 {
            let lo = from_ms + b * width_ms;
            pipe.cmd("ZCOUNT").arg(&k.due).arg(lo).arg(format!("({}", lo + width_ms));
        }
        let mut conn = self.conn.clone();
        pipe.query_async(&mut conn).await.with_context(|| format!("cannot count due {t} tasks"))
    }

    /// Every task type that has keys under this prefix, sorted.
    /// SCAN sees the keys of one node only, so in a cluster every master is scanned.
    pub async fn known_types(&self) -> Result<Vec<TaskType>> {
        let pattern = format!("{}:{{*}}:*", glob_escape(&self.prefix));
        let head = format!("{}:{{", self.prefix);
        let mut types = Vec::new();
        if self.target.is_cluster() {
            for node in self.cluster_nodes().await?.into_iter().filter(|n| n.master) {
                let client = self.target.node_client(&node.host, node.port)?;
                let mut conn = tokio::time::timeout(CONNECT_TIMEOUT, client.get_multiplexed_async_connection())
                    .await
                    .map_err(|_| anyhow!("no answer within {}s", CONNECT_TIMEOUT.as_secs()))
                    .and_then(|r| r.map_err(|e| anyhow!("{}", self.target.scrub(&e.to_string()))))
                    .with_context(|| format!("cannot list task types on cluster node {}:{}", node.host, node.port))?;
                scan_types(&mut conn, &pattern, &head, &mut types).await?;
            }
        } else {
            let mut conn = self.conn.clone();
            scan_types(&mut conn, &pattern, &head, &mut types).await?;
        }
        types.sort();
        types.dedup();
        Ok(types)
    }

    /// Up to `limit` dead-lettered tasks of type `t`, oldest death first.
    pub async fn dead_list(&self, t: &TaskType, limit: usize) -> Result<Vec<DeadTask>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let k = self.keys(t);
        let mut conn = self.conn.clone();
        let value: Value = self
            .scripts
            .dead_list
            .key(&k.dead)
            .key(&k.errors)
            .key(&k.attempts)
            .key(&k.payload)
            .arg(limit)
            .invoke_async(&mut conn)
            .await
            .with_context(|| format!("cannot list dead {t} tasks"))?;
        let flat = array(value)?;
        if flat.len() % 5 != 0 {
            bail!("unexpected dead list reply for {t}");
        }
        let mut out = Vec::with_capacity(flat.len() / 5);
        let mut it = flat.into_iter();
        while let (Some(id), Some(died), Some(error), Some(attempts), Some(len)) =
            (it.next(), it.next(), it.next(), it.next(), it.next())
        {
            let id = bytes(id)?;
            out.push(DeadTask {
                id_hex: hex::encode(&id),
                id,
                died_ms: score(died)?.unwrap_or(0),
                error: opt_bytes(error)?.map(|e| String::from_utf8_lossy(&e).into_owned()).unwrap_or_default(),
                attempts: opt_int(attempts)?.unwrap_or(0).clamp(0, u32::MAX as i64) as u32,
                payload_len: opt_int(len)?.unwrap_or(0).max(0) as u64,
            });
        }
        Ok(out)
    }

    /// Requeues dead tasks (all when `ids` is None), due now with attempts reset; returns how many.
    pub async fn dead_requeue(&self, t: &TaskType, ids: Option<&[Vec<u8>]>) -> Result<u64> {
        let k = self.keys(t);
        let keys = [&k.dead, &k.attempts, &k.errors, &k.due];
        self.dead_op(&self.scripts.dead_requeue, &keys, ids)
            .await
            .with_context(|| format!("cannot requeue dead {t} tasks"))
    }

    /// Deletes dead tasks for good (all when `ids` is None); returns how many.
    pub async fn dead_purge(&self, t: &TaskType, ids: Option<&[Vec<u8>]>) -> Result<u64> {
        let k = self.keys(t);
        let keys = [&k.dead, &k.attempts, &k.errors, &k.due, &k.payload];
        self.dead_op(&self.scripts.dead_purge, &keys, ids).await.with_context(|| format!("cannot purge dead {t} tasks"))
    }

    async fn dead_op(&self, script: &Script, keys: &[&String], ids: Option<&[Vec<u8>]>) -> Result<u64> {
        let mut conn = self.conn.clone();
        let mut total = 0;
        match ids {
            Some(ids) => {
                for chunk in ids.chunks(BATCH) {
                    let mut inv = script.prepare_invoke();
                    for key in keys {
                        inv.key(*key);
                    }
                    inv.arg("ids");
                    for id in chunk {
                        inv.arg(id);
                    }
                    let n: u64 = inv.invoke_async(&mut conn).await?;
                    total += n;
                }
            }
            None => loop {
                // Bounded per call so one huge dead set never blocks Redis for long.
                let mut inv = script.prepare_invoke();
                for key in keys {
                    inv.key(*key);
                }
                let n: u64 = inv.arg("all").arg(BATCH).invoke_async(&mut conn).await?;
                total += n;
                if n < BATCH as u64 {
                    break;
                }
            },
        }
        Ok(total)
    }
}

/// Encodes a follow-up for the outbox: `<type>\n<due_ms>\n<id_len>\n<id><payload>` (binary-safe).
pub fn encode_followup(f: &FollowUp) -> Vec<u8> {
    let mut out = format!("{}\n{}\n{}\n", f.task_type, f.due_ms, f.id.len()).into_bytes();
    out.extend_from_slice(&f.id);
    out.extend_from_slice(&f.payload);
    out
}

/// Decodes what [`encode_followup`] wrote.
pub fn decode_followup(data: &[u8]) -> Result<FollowUp> {
    let mut parts = data.splitn(4, |&b| b == b'\n');
    let mut text = |what: &str| -> Result<&str> {
        let part = parts.next().ok_or_else(|| anyhow!("outbox entry has no {what}"))?;
        std::str::from_utf8(part).with_context(|| format!("outbox entry {what} is not text"))
    };
    let task_type: TaskType = text("type")?.parse()?;
    let due_ms: i64 = text("due time")?.parse().context("bad due time in outbox entry")?;
    let id_len: usize = text("id length")?.parse().context("bad id length in outbox entry")?;
    let rest = parts.next().unwrap_or_default();
    if rest.len() < id_len {
        bail!("outbox entry is truncated");
    }
    let (id, payload) = rest.split_at(id_len);
    Ok(FollowUp { task_type, id: id.to_vec(), payload: payload.to_vec(), due_ms })
}

/// SCANs one node for keys matching `pattern` and collects the task types in their hash tags.
async fn scan_types(
    conn: &mut impl redis::aio::ConnectionLike,
    pattern: &str,
    head: &str,
    types: &mut Vec<TaskType>,
) -> Result<()> {
    let mut cursor: u64 = 0;
    loop {
        let (next, keys): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(BATCH)
            .query_async(conn)
            .await
            .context("cannot list task types (SCAN)")?;
        for key in keys {
            let Some(rest) = key.strip_prefix(head.as_bytes()) else {
                continue;
            };
            let Some(end) = rest.iter().position(|&b| b == b'}') else {
                continue;
            };
            if rest.get(end + 1) != Some(&b':') {
                continue;
            }
            if let Ok(name) = std::str::from_utf8(&rest[..end])
                && let Ok(t) = name.parse::<TaskType>()
            {
                types.push(t);
            }
        }
        cursor = next;
        if cursor == 0 {
            return Ok(());
        }
    }
}

/// `CLUSTER NODES` text → nodes that are up and have an address.
/// A line: `<id> <ip:port@cport[,hostname]> <flags> <master> <ping> <pong> <epoch> <state> <slots>...`
pub fn parse_cluster_nodes(text: &str) -> Vec<ClusterNode> {
    let mut nodes = Vec::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (Some(addr), Some(flags)) = (fields.get(1), fields.get(2)) else {
            continue;
        };
        let flags: Vec<&str> = flags.split(',').collect();
        if flags.iter().any(|f| matches!(*f, "fail" | "noaddr" | "handshake")) {
            continue;
        }
        let addr = addr.split(['@', ',']).next().unwrap_or_default();
        let Some((host, port)) = addr.rsplit_once(':') else {
            continue;
        };
        let Ok(port) = port.parse::<u16>() else {
            continue;
        };
        if host.is_empty() || port == 0 {
            continue;
        }
        nodes.push(ClusterNode { host: host.to_owned(), port, master: flags.contains(&"master") });
    }
    nodes.sort();
    nodes
}

fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

fn parse_claim(t: &TaskType, value: Value) -> Result<Claim> {
    let mut top = array(value)?.into_iter();
    let mut next = || top.next().ok_or_else(|| anyhow!("short reply"));
    let now_ms = int(next()?)?;
    let claimed = array(next()?)?;
    let dead = array(next()?)?;
    let next_due_ms = score(next()?)?;
    let next_lease_expiry_ms = score(next()?)?;
    let lease_expiry_ms = int(next()?)?;
    let first_token = u64::try_from(int(next()?)?).context("negative token")?;

    if claimed.len() % 4 != 0 || dead.len() % 2 != 0 {
        bail!("odd list lengths");
    }
    let mut tasks = Vec::with_capacity(claimed.len() / 4);
    let mut it = claimed.into_iter();
    let mut token = first_token;
    while let (Some(id), Some(payload), Some(attempt), Some(due)) = (it.next(), it.next(), it.next(), it.next()) {
        tasks.push(ClaimedTask {
            task_type: t.clone(),
            id: bytes(id)?,
            payload: opt_bytes(payload)?.unwrap_or_default(),
            attempt: u32::try_from(int(attempt)?).unwrap_or(u32::MAX),
            due_ms: score(due)?.unwrap_or(0),
            token,
        });
        token += 1;
    }
    let mut dead_lettered = Vec::with_capacity(dead.len() / 2);
    let mut it = dead.into_iter();
    while let (Some(id), Some(reason)) = (it.next(), it.next()) {
        dead_lettered.push((bytes(id)?, String::from_utf8_lossy(&bytes(reason)?).into_owned()));
    }
    Ok(Claim { now_ms, tasks, dead_lettered, next_due_ms, next_lease_expiry_ms, lease_expiry_ms })
}

fn array(v: Value) -> Result<Vec<Value>> {
    match v {
        Value::Array(items) | Value::Set(items) => Ok(items),
        Value::Nil => Ok(Vec::new()),
        other => bail!("expected an array, got {other:?}"),
    }
}

fn opt_bytes(v: Value) -> Result<Option<Vec<u8>>> {
    match v {
        Value::Nil => Ok(None),
        Value::BulkString(b) => Ok(Some(b)),
        Value::SimpleString(s) => Ok(Some(s.into_bytes())),
        Value::Okay => Ok(Some(b"OK".to_vec())),
        Value::Int(i) => Ok(Some(i.to_string().into_bytes())),
        other => bail!("expected a string, got {other:?}"),
    }
}

fn bytes(v: Value) -> Result<Vec<u8>> {
    opt_bytes(v)?.ok_or_else(|| anyhow!("unexpected nil"))
}

fn opt_int(v: Value) -> Result<Option<i64>> {
    match v {
        Value::Int(i) => Ok(Some(i)),
        Value::Nil => Ok(None),
        other => {
            let b = bytes(other)?;
            let s = std::str::from_utf8(&b).context("number is not text")?;
            Ok(Some(s.trim().parse().with_context(|| format!("bad integer {s:?}"))?))
        }
    }
}

fn int(v: Value) -> Result<i64> {
    opt_int(v)?.ok_or_else(|| anyhow!("unexpected nil"))
}

/// A sorted-set score as whole ms; `inf`/`-inf` (allowed to clients) saturate.
fn score(v: Value) -> Result<Option<i64>> {
    match v {
        Value::Nil => Ok(None),
        Value::Int(i) => Ok(Some(i)),
        Value::Double(d) => Ok(Some(d as i64)),
        other => {
            let b = bytes(other)?;
            let s = std::str::from_utf8(&b).context("score is not text")?;
            let d: f64 = s.trim().parse().with_context(|| format!("bad score {s:?}"))?;
            Ok(Some(d as i64))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_credentials_and_query() {
        assert_eq!(redact_url("redis://user:secret@host:6379/0"), "redis://host:6379/0");
        assert_eq!(redact_url("redis://:secret@host"), "redis://host");
        assert_eq!(redact_url("redis://host:6379"), "redis://host:6379");
        assert_eq!(redact_url("redis+unix:///tmp/r.sock?pass=x"), "redis+unix:///tmp/r.sock");
    }

    #[test]
    fn followup_encoding_round_trips() {
        let f = FollowUp {
            task_type: "a.b".parse().unwrap(),
            id: vec![0, 10, 255, b'\n'],
            payload: vec![b'\n', 0, 1],
            due_ms: -5,
        };
        assert_eq!(decode_followup(&encode_followup(&f)).unwrap(), f);
        assert!(decode_followup(b"a\n1\n9\nxy").is_err());
    }

    #[test]
    fn key_names_carry_the_hash_tag() {
        let k = Keys::new("hg", &"order.timeout".parse().unwrap());
        assert_eq!(k.due, "hg:{order.timeout}:due");
        assert_eq!(k.delivered(b"x:1:0"), b"hg:{order.timeout}:delivered:x:1:0".to_vec());
        assert_eq!(glob_escape("a*b"), "a\\*b");
    }
}
