//! The admin HTTP server: `/healthz`, `/readyz`, `/metrics` and the dashboard at `/`.
//!
//! Reads are plain GETs and never change anything. Re-queue and purge are
//! POSTs; they need `[admin] token` when one is configured (mandatory when
//! the server listens on a non-loopback address), and a purge needs
//! `confirm=yes` as well. Cross-site form posts are refused.

mod dashboard;

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use axum::Router;
use axum::extract::{Form, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::config::Config;
use crate::registry::Registry;
use crate::store::Store;
use crate::task_type::TaskType;

/// How often the dashboard's rate history samples the counters in Redis.
const SAMPLE_EVERY: Duration = Duration::from_secs(5);
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
pub async fn start(config: &Config, store: &Store, registry: &Registry, shutdown: &CancellationToken) -> Result<Admin> {
    crate::telemetry::handle();
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
        shutdown: shutdown.clone(),
        token: admin.token.clone(),
        host: Arc::new(HostInfo {
            id: config.runner.host_id.clone().unwrap_or_else(crate::hosts::default_host_id),
            addr,
            started: Instant::now(),
            started_ms: crate::cli::now_ms(),
        }),
        history: Arc::default(),
    };
    tokio::spawn(crate::telemetry::upkeep(stop.clone()));
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
        .route("/dead/requeue", post(requeue))
        .route("/dead/purge", post(purge))
        .with_state(state)
}

/// Samples the counters of every type, for the dashboard's rates.
async fn sample(state: AdminState, stop: CancellationToken) {
    loop {
        if let Ok(types) = dashboard::all_types(&state).await {
            for t in types {
                if let Ok(s) = state.store.stats(&t).await {
                    state.history.lock().unwrap_or_else(|p| p.into_inner()).record(&t, s.succeeded, s.failed);
                }
            }
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

/// 200 when Redis answers, plugins are loaded and the host is not shutting down; 503 otherwise.
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
    if types.is_empty() {
        problems.push("plugins: none loaded".to_owned());
    }
    if problems.is_empty() {
        let names: Vec<&str> = types.iter().map(TaskType::as_str).collect();
        (StatusCode::OK, format!("ready\nredis: ok\nplugins: {}\n", names.join(", "))).into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, format!("not ready\n{}\n", problems.join("\n"))).into_response()
    }
}

async fn metrics() -> Response {
    let text = crate::telemetry::handle().render();
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response()
}

/// The form of a re-queue or purge: a type, optionally one id (hex, exact for binary ids).
#[derive(Debug, Deserialize)]
pub(crate) struct DeadForm {
    #[serde(rename = "type")]
    task_type: String,
    /// One task's id as hex; absent or empty = every dead task of the type.
    #[serde(default)]
    id_hex: Option<String>,
    /// The admin token, when one is configured.
    #[serde(default)]
    token: Option<String>,
    /// Purge only: must be `yes`.
    #[serde(default)]
    confirm: Option<String>,
}

/// A refused or malformed dashboard request: its status and reason.
type Refused = (StatusCode, String);
/// The type a dead-letter action applies to, and its ids (`None`: all of the type).
type DeadTarget = (TaskType, Option<Vec<Vec<u8>>>);

/// The target of a dead-letter action, once the request is authorized and its form parsed.
fn authorized_target(state: &AdminState, headers: &HeaderMap, form: &DeadForm) -> Result<DeadTarget, Refused> {
    authorize(state, headers, form.token.as_deref())?;
    target(form)
}

/// Refuses a mutating request without the configured token, or from another site's page.
fn authorize(state: &AdminState, headers: &HeaderMap, form_token: Option<&str>) -> Result<(), Refused> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if header("sec-fetch-site") == Some("cross-site") {
        return Err((StatusCode::FORBIDDEN, "cross-site requests are refused\n".to_owned()));
    }
    if let (Some(origin), Some(host)) = (header("origin"), header("host"))
        && origin != "null"
        && origin.split_once("://").map(|(_, rest)| rest) != Some(host)
    {
        return Err((StatusCode::FORBIDDEN, "cross-site requests are refused\n".to_owned()));
    }
    let Some(expected) = &state.token else {
        return Ok(());
    };
    let bearer = header("authorization").and_then(|v| v.strip_prefix("Bearer "));
    let given = form_token.filter(|t| !t.is_empty()).or(bearer).unwrap_or("");
    if constant_time_eq(given.as_bytes(), expected.as_bytes()) {
        Ok(())
    } else {
        Err((StatusCode::UNAUTHORIZED, "this admin server needs its token (form field `token` or `Authorization: Bearer`)\n".to_owned()))
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Parses the form's type and ids; the ids are `None` for "all of the type".
fn target(form: &DeadForm) -> Result<DeadTarget, Refused> {
    let t: TaskType = form.task_type.parse().map_err(|e| (StatusCode::BAD_REQUEST, format!("{e}\n")))?;
    let ids = match form.id_hex.as_deref().filter(|h| !h.is_empty()) {
        None => None,
        Some(h) => {
            Some(vec![hex::decode(h).map_err(|_| (StatusCode::BAD_REQUEST, "id_hex is not hex\n".to_owned()))?])
        }
    };
    Ok((t, ids))
}

fn back_to(t: &TaskType, message: &str) -> Response {
    let mut url = format!("/?type={}&msg=", t.as_str());
    url.extend(form_urlencoded_byte(message));
    Redirect::to(&url).into_response()
}

/// Percent-encodes a query value.
fn form_urlencoded_byte(s: &str) -> impl Iterator<Item = String> + '_ {
    s.bytes().map(|b| match b {
        b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' => (b as char).to_string(),
        b' ' => "+".to_owned(),
        _ => format!("%{b:02X}"),
    })
}

/// `POST /dead/requeue`: `type`, optional `id_hex`, `token` when configured.
async fn requeue(State(state): State<AdminState>, headers: HeaderMap, Form(form): Form<DeadForm>) -> Response {
    let (t, ids) = match authorized_target(&state, &headers, &form) {
        Ok(x) => x,
        Err(refused) => return refused.into_response(),
    };
    match state.store.dead_requeue(&t, ids.as_deref()).await {
        Ok(n) => {
            info!(task_type = %t, requeued = n, "dead tasks re-queued from the dashboard");
            back_to(&t, &format!("re-queued {n} dead task(s) of {t}"))
        }
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("{e:#}\n")).into_response(),
    }
}

/// `POST /dead/purge`: like re-queue, and `confirm=yes`.
async fn purge(State(state): State<AdminState>, headers: HeaderMap, Form(form): Form<DeadForm>) -> Response {
    let (t, ids) = match authorized_target(&state, &headers, &form) {
        Ok(x) => x,
        Err(refused) => return refused.into_response(),
    };
    if form.confirm.as_deref() != Some("yes") {
        return (StatusCode::BAD_REQUEST, "a purge deletes tasks for good: confirm it with confirm=yes\n")
            .into_response();
    }
    match state.store.dead_purge(&t, ids.as_deref()).await {
        Ok(n) => {
            warn!(task_type = %t, purged = n, "dead tasks purged from the dashboard");
            back_to(&t, &format!("purged {n} dead task(s) of {t}"))
        }
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("{e:#}\n")).into_response(),
    }
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
