//! The admin HTTP server: `/healthz`, `/readyz`, `/metrics`, the dashboard at `/` and one task at `/task` (its buttons in `actions.rs`).
//!
//! Reads are plain GETs and never change anything. Re-queue, purge and the
//! task page's actions (run now, postpone, cancel, re-queue) are POSTs; they
//! need `[admin] token` when one is configured (mandatory when the server
//! listens on a non-loopback address), and a purge or cancel needs
//! `confirm=yes` as well. Cross-site form posts are refused.

mod actions;
mod dashboard;
mod page;
mod workflow;

use hourglass_task::sync::LockExt;
use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use axum::Router;
use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::config::Config;
use crate::observe::health::Health;
use crate::registry::Registry;
use crate::store::Store;
use crate::task_type::TaskType;

/// How often the sampler reads every type's stats from Redis: the dashboard's
/// rates and the backlog gauges (`hourglass_tasks_due` ...) are this fresh.
/// One stats script call per type per period, whatever the number of tasks.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(5);
/// How far back the rates look.
const RATE_WINDOW: Duration = Duration::from_secs(5 * 60);

/// A running admin server (or nothing when `[admin] enabled = false`).
pub struct Admin {
    stop: CancellationToken,
    server: Option<tokio::task::JoinHandle<()>>,
    /// The address it listens on (the real port when the config asked for 0).
    pub addr: Option<SocketAddr>,
}

impl Admin {
    /// Stops the server and its samplers; waits for the server to close.
    pub async fn stop(self) {
        self.stop.cancel();
        if let Some(server) = self.server {
            let _ = tokio::time::timeout(Duration::from_secs(5), server).await;
        }
    }
}

/// What the handlers share.
#[derive(Clone)]
pub(crate) struct AdminState {
    pub(crate) store: Store,
    pub(crate) registry: Registry,
    pub(crate) health: Health,
    pub(crate) shutdown: CancellationToken,
    pub(crate) token: Option<String>,
    pub(crate) host: Arc<HostInfo>,
    pub(crate) history: Arc<Mutex<History>>,
}

/// This host, as the dashboard shows it.
pub(crate) struct HostInfo {
    pub(crate) id: String,
    pub(crate) addr: SocketAddr,
    pub(crate) started: Instant,
    pub(crate) started_ms: i64,
}

/// Counter samples per type: (when, succeeded, failed).
#[derive(Default)]
pub(crate) struct History {
    pub(crate) samples: BTreeMap<TaskType, VecDeque<(Instant, u64, u64)>>,
}

impl History {
    /// Succeeded and failed per minute over the samples of the last [`RATE_WINDOW`], when there are two.
    pub(crate) fn rates(&self, t: &TaskType) -> Option<(f64, f64, Duration)> {
        let samples = self.samples.get(t)?;
        let (first, last) = (samples.front()?, samples.back()?);
        let span = last.0.duration_since(first.0);
        if span < Duration::from_secs(1) {
            return None;
        }
        let per_min = |a: u64, b: u64| b.saturating_sub(a) as f64 * 60.0 / span.as_secs_f64();
        Some((per_min(first.1, last.1), per_min(first.2, last.2), span))
    }

    fn record(&mut self, t: &TaskType, succeeded: u64, failed: u64) {
        let now = Instant::now();
        let samples = self.samples.entry(t.clone()).or_default();
        samples.push_back((now, succeeded, failed));
        while samples.front().is_some_and(|(at, _, _)| now.duration_since(*at) > RATE_WINDOW) {
            samples.pop_front();
        }
    }
}

/// Starts the admin server when `[admin] enabled`; it serves until [`Admin::stop`].
/// The metrics recorder is installed either way, so metrics are counted from the start.
pub async fn start(
    config: &Config,
    store: &Store,
    registry: &Registry,
    health: &Health,
    shutdown: &CancellationToken,
) -> Result<Admin> {
    crate::observe::telemetry::handle();
    let stop = CancellationToken::new();
    let admin = &config.admin;
    if !admin.enabled {
        return Ok(Admin { stop, server: None, addr: None });
    }
    let listener = tokio::net::TcpListener::bind(admin.listen)
        .await
        .with_context(|| format!("cannot listen on admin.listen = {}", admin.listen))?;
    let addr = listener.local_addr()?;
    let state = AdminState {
        store: store.clone(),
        registry: registry.clone(),
        health: health.clone(),
        shutdown: shutdown.clone(),
        token: admin.token.clone(),
        host: Arc::new(HostInfo {
            id: config.runner.host_id.clone().unwrap_or_else(crate::fleet::presence::default_host_id),
            addr,
            started: Instant::now(),
            started_ms: crate::clock::now_ms(),
        }),
        history: Arc::default(),
    };
    tokio::spawn(sample(state.clone(), stop.clone()));
    let app = router(state);
    let stopped = stop.clone();
    let server = tokio::spawn(async move {
        let serve = axum::serve(listener, app).with_graceful_shutdown(async move { stopped.cancelled().await });
        if let Err(e) = serve.await {
            warn!("admin server stopped: {e}");
        }
    });
    info!(addr = %addr, "admin server listening: http://{addr}/ (healthz, readyz, metrics, dashboard)");
    Ok(Admin { stop, server: Some(server), addr: Some(addr) })
}

fn router(state: AdminState) -> Router {
    Router::new()
        .route("/", get(dashboard::page))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/dead/requeue", post(actions::requeue))
        .route("/dead/purge", post(actions::purge))
        .route("/type/pause", post(actions::pause))
        .route("/type/resume", post(actions::resume))
        .route("/task", get(dashboard::task_page))
        .route("/group", get(workflow::groups::page))
        .route("/graph", get(workflow::graphs::page))
        .route("/task/run-now", post(actions::task_run_now))
        .route("/task/postpone", post(actions::task_postpone))
        .route("/task/cancel", post(actions::task_cancel))
        .route("/task/requeue", post(actions::task_requeue))
        .with_state(state)
}

/// Samples the stats of every type: the counters for the dashboard's rates,
/// the queue sizes for the backlog gauges. A type whose keys are all gone
/// drops to 0 rather than keeping its last value.
async fn sample(state: AdminState, stop: CancellationToken) {
    let mut sampled: Vec<TaskType> = Vec::new();
    loop {
        if let Ok(types) = dashboard::all_types(&state).await {
            for t in sampled.iter().filter(|t| !types.contains(t)) {
                crate::observe::telemetry::backlog(t, 0, 0, 0);
                crate::observe::telemetry::groups_open(t, 0);
            }
            for t in &types {
                if let Ok(s) = state.store.stats(t).await {
                    crate::observe::telemetry::backlog(t, s.due_now, s.scheduled_later, s.oldest_due_age_ms);
                    crate::observe::telemetry::groups_open(t, s.groups_open);
                    if s.graphs_opened > 0 {
                        crate::observe::telemetry::graphs(
                            t,
                            s.graphs_running,
                            s.graphs_opened,
                            s.graphs_completed,
                            s.graphs_failed,
                        );
                    }
                    state.history.lock_unpoisoned().record(t, s.succeeded, s.failed);
                }
            }
            sampled = types;
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(SAMPLE_EVERY) => {}
        }
    }
}

async fn healthz() -> &'static str {
    "ok\n"
}

/// 200 when Redis answers, plugins are loaded, at least one type is not
/// faulted and the host is not shutting down; 503 otherwise. Faulted types
/// are listed either way: one type's bad data does not make the host unready.
async fn readyz(State(state): State<AdminState>) -> Response {
    let mut problems = Vec::new();
    if state.shutdown.is_cancelled() {
        problems.push("shutting down".to_owned());
    }
    match tokio::time::timeout(Duration::from_secs(2), state.store.ping()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => problems.push(format!("redis: {e:#}")),
        Err(_) => problems.push("redis: no answer within 2s".to_owned()),
    }
    let types = state.registry.types();
    if let Some((done, total)) = state.registry.loading() {
        problems.push(format!("loading plugins {done}/{total}"));
    } else if types.is_empty() {
        problems.push("plugins: none loaded".to_owned());
    }
    let faults = state.health.faults();
    if !types.is_empty() && types.iter().all(|t| faults.contains_key(t)) {
        problems.push("every type is faulted".to_owned());
    }
    let faulted: String = faults.iter().map(|(t, why)| format!("faulted: {t}: {why}\n")).collect();
    let mut config = format!("config: applied {}\n", crate::clock::format_ms(state.registry.config_applied_ms()));
    if let Some(master) = state.store.master() {
        config.push_str(&format!("redis master: {}\n", page::master_line(&master)));
    }
    if problems.is_empty() {
        let names: Vec<&str> = types.iter().map(TaskType::as_str).collect();
        let body = format!("ready\nredis: ok\nplugins: {}\n{config}{faulted}", names.join(", "));
        (StatusCode::OK, body).into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, format!("not ready\n{}\n{config}{faulted}", problems.join("\n")))
            .into_response()
    }
}

async fn metrics() -> Response {
    let text = crate::observe::telemetry::handle().render();
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response()
}

/// The query of the task page: a type and an id (text, or hex for any bytes).
#[derive(Debug, Default, Deserialize)]
pub(crate) struct TaskQuery {
    #[serde(rename = "type", default)]
    pub(crate) task_type: String,
    pub(crate) id: Option<String>,
    pub(crate) id_hex: Option<String>,
    pub(crate) msg: Option<String>,
}

/// The `?type=` and `?msg=` of the dashboard.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct PageQuery {
    #[serde(rename = "type")]
    pub(crate) task_type: Option<String>,
    pub(crate) msg: Option<String>,
}

pub(crate) type PageParams = Query<PageQuery>;

pub(crate) fn html(body: String) -> Html<String> {
    Html(body)
}
