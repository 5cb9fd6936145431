//! The policy and sandbox limits of a task type: `[defaults]` and `[types."T"]`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Result, bail};
use bytesize::ByteSize;
use serde::Deserialize;

use super::MAX_CONCURRENCY;
use crate::outbound::AllowedHosts;
use crate::secrets::ConfigValue;
use crate::store::Rate;
use crate::task_type::TaskType;

/// Retry policy and sandbox limits of a task type. In `[defaults]` every
/// field has a value; in `[types.<name>]` every field is optional and falls
/// back to `[defaults]`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TypePolicy {
    /// Most tasks of this type in hand at once (claimed and not yet settled); one claim takes at most half of it.
    pub concurrency: usize,
    /// Most tasks of this type running at once over every host (0: no limit beyond `concurrency` per host).
    pub max_running: u64,
    /// Most tasks of this type started per second, minute or hour over every host (`50/s`, `100/m`); none by default.
    pub rate: Option<Rate>,
    /// Share claims fairly among the keys of task ids, the part before this separator (`":"`: `tenant-7:order-1` has key `tenant-7`); off by default.
    pub fair_by: Option<String>,
    /// Attempts before a failing task is dead-lettered (1 = never retry).
    pub max_attempts: u32,
    /// First retry delay; it doubles with every attempt (with jitter).
    #[serde(with = "humantime_serde")]
    pub backoff_base: Duration,
    /// Longest retry delay.
    #[serde(with = "humantime_serde")]
    pub backoff_cap: Duration,
    /// Execution deadline of one handler run.
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    /// `scheme://host[:port]` targets the plugin may call over HTTP (`*` as a
    /// subdomain or port wildcard; private addresses only when named exactly).
    /// Empty: no outbound HTTP.
    pub allowed_outbound_hosts: AllowedHosts,
    /// Deadline of one outbound HTTP request, connect to last body byte (the run's `timeout` still applies).
    #[serde(with = "humantime_serde")]
    pub http_timeout: Duration,
    /// Largest HTTP response body a plugin may read; a longer one is cut off with an error.
    pub http_max_response: ByteSize,
    /// Most outbound HTTP requests of this type in flight at once, over all its running tasks.
    pub http_concurrency: usize,
    /// Linear memory cap of one handler instance.
    pub memory_limit: ByteSize,
    /// Most bytes the host holds for one run outside its linear memory: its
    /// follow-ups, captured output and error text, and its wasi:http state
    /// (header fields, request bodies). A run that needs more fails.
    pub host_memory_limit: ByteSize,
    /// Larger payloads are dead-lettered without running.
    pub max_payload: ByteSize,
    /// Opt-in instance reuse: one instance serves up to this many consecutive
    /// tasks (0 or 1: a fresh instance per task, the default). A trap or
    /// failure discards the instance. Faster, but a task can see what earlier
    /// tasks left in the instance's memory and globals.
    pub instance_reuse: u32,
    /// A fresh state for every task by resetting a kept instance to its
    /// state just after instantiation (the default), instead of
    /// instantiating anew: the same isolation, at about the cost of a warm
    /// instance. `false` instantiates for every task. Ignored when
    /// `instance_reuse` is over 1.
    pub instance_reset: bool,
    /// With `instance_reset`: before a kept instance's checkpoint is taken,
    /// its handler is called once with a warm-up task (attempt 0, id
    /// `hourglass:warm-up`, empty payload; its logs, output, outbound HTTP and
    /// follow-ups go nowhere), so what a first call prepares (Python's and
    /// JavaScript's lazily compiled code) is in the checkpoint and no task
    /// pays for it. No task's data is in the checkpoint either way. `false`
    /// checkpoints right after instantiation.
    pub instance_warm_up: bool,
    /// Append every outcome to the `<prefix>:{<type>}:events` stream.
    pub events: bool,
    /// Approximate most entries kept in the events stream (`XADD MAXLEN ~`).
    pub events_maxlen: u64,
    /// Types the handler may schedule follow-ups into, itself included only
    /// when listed; create-only: a follow-up whose id is already waiting or
    /// dead-lettered in its type leaves that task as it is. Empty: none.
    pub may_schedule: Vec<TaskType>,
    /// Types whose existing tasks the handler's follow-ups may also replace
    /// (re-schedule, with their payload); implies `may_schedule`.
    pub may_replace: Vec<TaskType>,
}

impl Default for TypePolicy {
    fn default() -> Self {
        TypePolicy {
            concurrency: 256,
            max_running: 0,
            rate: None,
            fair_by: None,
            max_attempts: 5,
            backoff_base: Duration::from_secs(1),
            backoff_cap: Duration::from_secs(300),
            timeout: Duration::from_secs(10),
            allowed_outbound_hosts: AllowedHosts::default(),
            http_timeout: Duration::from_secs(5),
            http_max_response: ByteSize::mib(1),
            http_concurrency: 8,
            memory_limit: ByteSize::mib(64),
            host_memory_limit: ByteSize::mib(16),
            // The store refuses larger payloads at claim by the same default.
            max_payload: ByteSize::b(crate::store::ClaimLimits::default().max_payload_bytes),
            instance_reuse: 0,
            instance_reset: true,
            instance_warm_up: true,
            events: false,
            events_maxlen: 10_000,
            may_schedule: Vec::new(),
            may_replace: Vec::new(),
        }
    }
}

/// Overrides of [`TypePolicy`] for one type: `None` falls back to `[defaults]`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TypeConfig {
    /// Plugin file in the plugins folder (default: `<type>.wasm`).
    pub plugin: Option<PathBuf>,
    /// See [`TypePolicy::concurrency`].
    pub concurrency: Option<usize>,
    /// See [`TypePolicy::max_running`].
    pub max_running: Option<u64>,
    /// See [`TypePolicy::rate`].
    pub rate: Option<Rate>,
    /// See [`TypePolicy::fair_by`].
    pub fair_by: Option<String>,
    /// See [`TypePolicy::max_attempts`].
    pub max_attempts: Option<u32>,
    /// See [`TypePolicy::backoff_base`].
    #[serde(default, with = "humantime_serde::option")]
    pub backoff_base: Option<Duration>,
    /// See [`TypePolicy::backoff_cap`].
    #[serde(default, with = "humantime_serde::option")]
    pub backoff_cap: Option<Duration>,
    /// See [`TypePolicy::timeout`].
    #[serde(default, with = "humantime_serde::option")]
    pub timeout: Option<Duration>,
    /// See [`TypePolicy::allowed_outbound_hosts`].
    pub allowed_outbound_hosts: Option<AllowedHosts>,
    /// See [`TypePolicy::http_timeout`].
    #[serde(default, with = "humantime_serde::option")]
    pub http_timeout: Option<Duration>,
    /// See [`TypePolicy::http_max_response`].
    pub http_max_response: Option<ByteSize>,
    /// See [`TypePolicy::http_concurrency`].
    pub http_concurrency: Option<usize>,
    /// See [`TypePolicy::memory_limit`].
    pub memory_limit: Option<ByteSize>,
    /// See [`TypePolicy::host_memory_limit`].
    pub host_memory_limit: Option<ByteSize>,
    /// See [`TypePolicy::max_payload`].
    pub max_payload: Option<ByteSize>,
    /// See [`TypePolicy::instance_reuse`].
    pub instance_reuse: Option<u32>,
    /// See [`TypePolicy::instance_reset`].
    pub instance_reset: Option<bool>,
    /// See [`TypePolicy::instance_warm_up`].
    pub instance_warm_up: Option<bool>,
    /// See [`TypePolicy::events`].
    pub events: Option<bool>,
    /// See [`TypePolicy::events_maxlen`].
    pub events_maxlen: Option<u64>,
    /// See [`TypePolicy::may_schedule`].
    pub may_schedule: Option<Vec<TaskType>>,
    /// See [`TypePolicy::may_replace`].
    pub may_replace: Option<Vec<TaskType>>,
    /// Spread the type over this many shards, each with keys of its own hash tag (`{T}`, `{T#k}`, ...),
    /// so a hot type uses several Redis Cluster masters; an id's shard is `CLUSTER KEYSLOT <id>` mod
    /// `shards` (docs/scaling.md). Default 1: one slot, as every type has.
    pub shards: Option<u16>,
    /// Values the plugin reads through its `config` import: strings, or secrets
    /// from the host's environment (`{ env = "NAME" }`) or a file (`{ file = "path" }`).
    #[serde(default)]
    pub config: BTreeMap<String, ConfigValue>,
}

impl TypePolicy {
    /// The sandbox's part of it: what the type's runs are held to.
    pub fn sandbox(&self) -> crate::runtime::SandboxPolicy {
        crate::runtime::SandboxPolicy {
            timeout: self.timeout,
            memory_limit: self.memory_limit,
            host_memory_limit: self.host_memory_limit,
            max_payload: self.max_payload,
            instance_reuse: self.instance_reuse,
            instance_reset: self.instance_reset,
            instance_warm_up: self.instance_warm_up,
            allowed_outbound_hosts: self.allowed_outbound_hosts.clone(),
            http_timeout: self.http_timeout,
            http_max_response: self.http_max_response,
            http_concurrency: self.http_concurrency,
            may_schedule: self.may_schedule.clone(),
            may_replace: self.may_replace.clone(),
        }
    }

    /// Shard `shard`'s part of the type's `max_running` and `rate`, so that its
    /// `shards` shards, each claimed on its own, never exceed them together:
    /// max_running split as evenly as whole tasks allow (config validation
    /// sees that each part is at least 1), the rate into equal parts.
    pub fn shard_limits(&self, shard: u16, shards: u16) -> (u64, Option<Rate>) {
        let n = u64::from(shards.max(1));
        let max_running = match self.max_running {
            0 => 0,
            m => m / n + u64::from(u64::from(shard) < m % n),
        };
        (max_running, self.rate.map(|r| r.split(shards)))
    }

    pub(super) fn validate(&self, table: &str) -> Result<()> {
        if self.concurrency == 0 || self.concurrency > MAX_CONCURRENCY {
            bail!("{table}.concurrency must be between 1 and {MAX_CONCURRENCY}");
        }
        if self.fair_by.as_ref().is_some_and(|s| s.is_empty() || s.len() > 16) {
            bail!("{table}.fair_by must be 1 to 16 characters (the separator before which an id's key ends)");
        }
        if self.max_attempts == 0 {
            bail!("{table}.max_attempts must be at least 1");
        }
        if self.backoff_cap < self.backoff_base {
            bail!("{table}.backoff_cap must not be less than backoff_base");
        }
        if self.timeout.is_zero() {
            bail!("{table}.timeout must be more than 0");
        }
        if self.http_timeout.is_zero() {
            bail!("{table}.http_timeout must be more than 0");
        }
        if self.http_max_response.as_u64() == 0 || self.http_max_response > ByteSize::gib(1) {
            bail!("{table}.http_max_response must be between 1 byte and 1 GiB");
        }
        if self.http_concurrency == 0 || self.http_concurrency > MAX_CONCURRENCY {
            bail!("{table}.http_concurrency must be between 1 and {MAX_CONCURRENCY}");
        }
        if self.memory_limit < ByteSize::mib(1) || self.memory_limit > ByteSize::gib(4) {
            bail!("{table}.memory_limit must be between 1 MiB and 4 GiB");
        }
        if self.host_memory_limit < ByteSize::mib(4) || self.host_memory_limit > ByteSize::gib(1) {
            bail!("{table}.host_memory_limit must be between 4 MiB and 1 GiB");
        }
        if self.max_payload.as_u64() == 0 || self.max_payload > ByteSize::mib(512) {
            bail!("{table}.max_payload must be between 1 byte and 512 MiB");
        }
        if self.events_maxlen == 0 || self.events_maxlen > 100_000_000 {
            bail!("{table}.events_maxlen must be between 1 and 100000000");
        }
        for (key, list) in [("may_schedule", &self.may_schedule), ("may_replace", &self.may_replace)] {
            let mut seen = std::collections::BTreeSet::new();
            if let Some(twice) = list.iter().find(|t| !seen.insert(*t)) {
                bail!("{table}.{key} lists \"{twice}\" twice");
            }
        }
        Ok(())
    }
}
