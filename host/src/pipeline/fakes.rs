//! The pipeline's unit-test stand-ins: a ledger with scripted answers, a handler that ends each task as its id says, and plugins that serve one type.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Result;

use super::execute::{Execute, Plugins};
use super::ledger::Ledger;
use crate::config::{Config, TypePolicy};
use crate::registry::Entry;
use crate::runtime::RunHooks;
use crate::runtime::{Failure, TaskRun};
use crate::store::{ClaimLimits, Committed, Extended, OutboxFlush, ProgressReport};
use crate::task::{Claim, ClaimedTask, Ended, Lease, Settlement};
use crate::task_type::TaskType;

/// A settle's answer: how each outcome ended, and what else it committed.
pub(crate) type Settled = Result<(Vec<Ended>, Committed)>;

/// A ledger whose answers are scripted per call, and which records what it
/// was asked (with the paused clock's time). Unscripted: a claim finds
/// nothing due, a renewal renews everything, a settle stores every outcome,
/// a hand-back finds every lease held, the outbox is empty; traceparents
/// are never asked (tracing is off in unit tests).
#[derive(Clone, Default)]
pub(crate) struct Scripted {
    inner: Arc<Script>,
}

#[derive(Default)]
struct Script {
    claims: Mutex<VecDeque<Result<Claim>>>,
    extends: Mutex<VecDeque<Result<Vec<Extended>>>>,
    settles: Mutex<VecDeque<Settled>>,
    calls: Mutex<Vec<(Duration, String)>>,
    started: Mutex<Option<tokio::time::Instant>>,
}

impl Scripted {
    pub(crate) fn new() -> Scripted {
        let s = Scripted::default();
        *s.inner.started.lock().unwrap() = Some(tokio::time::Instant::now());
        s
    }

    pub(crate) fn claims(&self, answers: impl IntoIterator<Item = Result<Claim>>) -> &Self {
        self.inner.claims.lock().unwrap().extend(answers);
        self
    }

    pub(crate) fn extends(&self, answers: impl IntoIterator<Item = Result<Vec<Extended>>>) -> &Self {
        self.inner.extends.lock().unwrap().extend(answers);
        self
    }

    pub(crate) fn settles(&self, answers: impl IntoIterator<Item = Settled>) -> &Self {
        self.inner.settles.lock().unwrap().extend(answers);
        self
    }

    /// What it was asked, in order.
    pub(crate) fn calls(&self) -> Vec<String> {
        self.inner.calls.lock().unwrap().iter().map(|(_, c)| c.clone()).collect()
    }

    /// What it was asked, each with the time since [`Scripted::new`].
    pub(crate) fn timed_calls(&self) -> Vec<(Duration, String)> {
        self.inner.calls.lock().unwrap().clone()
    }

    fn record(&self, call: String) {
        let since = self.inner.started.lock().unwrap().map(|s| s.elapsed()).unwrap_or_default();
        self.inner.calls.lock().unwrap().push((since, call));
    }
}

/// A claim taken at `now_ms` of `ids` (as tasks of type `t`, claim `claim`), with when the next task is due.
pub(crate) fn claim_of(claim: u64, ids: &[&str], next_due_ms: Option<i64>) -> Claim {
    Claim {
        now_ms: 0,
        tasks: ids
            .iter()
            .zip(1..)
            .map(|(id, token)| ClaimedTask {
                task_type: "t".parse().unwrap(),
                id: id.as_bytes().to_vec(),
                payload: Vec::new(),
                attempt: 1,
                due_ms: 0,
                token: claim * 1000 + token,
                claim,
            })
            .collect(),
        dead_lettered: Vec::new(),
        next_due_ms,
        next_lease_expiry_ms: None,
        lease_expiry_ms: 30_000,
        throttled_ms: None,
        paused: false,
    }
}

impl Ledger for Scripted {
    async fn claim(&self, _: &TaskType, limits: &ClaimLimits) -> Result<Claim> {
        self.record(format!("claim {}", limits.max_tasks));
        let scripted = self.inner.claims.lock().unwrap().pop_front();
        scripted.unwrap_or_else(|| Ok(claim_of(0, &[], None)))
    }

    async fn extend(&self, _: &TaskType, leases: &[Lease], lease_ms: u64) -> Result<Vec<Extended>> {
        self.record(format!("extend {} for {lease_ms} ms", leases.len()));
        let scripted = self.inner.extends.lock().unwrap().pop_front();
        scripted.unwrap_or_else(|| Ok(vec![Extended::Extended; leases.len()]))
    }

    async fn settle(&self, _: &TaskType, batch: &[Settlement], events: Option<u64>) -> Settled {
        self.record(format!("settle {} events {events:?}", batch.len()));
        let scripted = self.inner.settles.lock().unwrap().pop_front();
        scripted.unwrap_or_else(|| Ok((vec![Ended::Succeeded; batch.len()], Committed::default())))
    }

    async fn release(&self, _: &TaskType, leases: &[Lease]) -> Result<usize> {
        self.record(format!("release {}", leases.len()));
        Ok(leases.len())
    }

    async fn trace_parents(&self, _: &TaskType, _: &[Vec<u8>]) -> Result<Vec<Option<String>>> {
        unreachable!("tracing is off in unit tests")
    }

    async fn flush_outbox(&self, _: &TaskType) -> Result<OutboxFlush> {
        self.record("flush".to_owned());
        Ok(OutboxFlush::default())
    }

    /// Recorded as `progress <id>@<token>=<percent> ...`, by id.
    async fn write_progress(&self, _: &TaskType, reports: &[ProgressReport], _: Option<u64>) -> Result<usize> {
        let mut each: Vec<String> = reports
            .iter()
            .map(|r| format!("{}@{}={}", String::from_utf8_lossy(&r.lease.id), r.lease.token, r.progress.percent))
            .collect();
        each.sort();
        self.record(format!("progress {}", each.join(" ")));
        Ok(reports.len())
    }
}

/// A handler that ends each task as its id says, without wasmtime: `ok…`
/// (success), `fail` (an error), `bad` (a permanent failure); any other id
/// runs until stopped.
pub(crate) struct ByName;

impl Execute for ByName {
    async fn execute(&self, task: &ClaimedTask, _: RunHooks) -> TaskRun {
        let result = match task.id.as_slice() {
            id if id.starts_with(b"ok") => Ok(()),
            b"fail" => Err(Failure::Error("boom".into())),
            b"bad" => Err(Failure::Permanent("bad input".into())),
            _ => std::future::pending().await,
        };
        TaskRun::returned(result)
    }
}

/// The policy the fakes' type runs under: 3 attempts, backoff from 1 s to 60 s.
pub(crate) fn policy(max_attempts: u32) -> TypePolicy {
    TypePolicy {
        max_attempts,
        backoff_base: Duration::from_secs(1),
        backoff_cap: Duration::from_secs(60),
        ..TypePolicy::default()
    }
}

/// An entry serving a type with `handler`.
pub(crate) fn entry<E>(handler: E) -> Arc<Entry<E>> {
    Arc::new(Entry { handler: Arc::new(handler), policy: policy(3), file: "fake.wasm".into(), hash: "h".into() })
}

/// Plugins serving the one type `t` with [`ByName`] (until [`Served::unload`]), under `runner_toml`.
#[derive(Clone)]
pub(crate) struct Served {
    entry: Arc<Mutex<Option<Arc<Entry<ByName>>>>>,
    config: Arc<Config>,
}

impl Served {
    pub(crate) fn new(runner_toml: &str) -> Served {
        let config = Config::parse(runner_toml, "test").expect("a valid config");
        Served { entry: Arc::new(Mutex::new(Some(entry(ByName)))), config: Arc::new(config) }
    }

    /// The type loses its plugin.
    pub(crate) fn unload(&self) {
        self.entry.lock().unwrap().take();
    }
}

impl Plugins for Served {
    type Handler = ByName;

    fn serving(&self, task_type: &TaskType) -> Option<Arc<Entry<ByName>>> {
        (task_type.as_str() == "t").then(|| self.entry.lock().unwrap().clone()).flatten()
    }

    fn config(&self) -> Arc<Config> {
        self.config.clone()
    }
}
