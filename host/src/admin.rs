//! The admin HTTP server: `/healthz`, `/readyz`, `/metrics`, the dashboard at `/` and one task at `/task`.
//!
//! Reads are plain GETs and never change anything. Re-queue, purge and the
//! task page's actions (run now, postpone, cancel, re-queue) are POSTs; they
//! need `[admin] token` when one is configured (mandatory when the server
//! listens on a non-loopback address), and a purge or cancel needs
//! `confirm=yes` as well. Cross-site form posts are refused.

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
use axum::extract::{Form, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::config::Config;
use crate::observe::health::Health;
use crate::registry::Registry;
use crate::store::{CancelEffect, Store};
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
        .route("/dead/requeue", post(requeue))
        .route("/dead/purge", post(purge))
        .route("/type/pause", post(pause))
        .route("/type/resume", post(resume))
        .route("/task", get(dashboard::task_page))
        .route("/group", get(workflow::groups::page))
        .route("/graph", get(workflow::graphs::page))
        .route("/task/run-now", post(task_run_now))
        .route("/task/postpone", post(task_postpone))
        .route("/task/cancel", post(task_cancel))
        .route("/task/requeue", post(task_requeue))
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
        Err((
            StatusCode::UNAUTHORIZED,
            "this admin server needs its token (form field `token` or `Authorization: Bearer`)\n".to_owned(),
        ))
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
        Some(h) => Some(vec![hex::decode(h).map_err(|_| (StatusCode::BAD_REQUEST, "id_hex is not hex\n".to_owned()))?]),
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

/// The form of a pause or resume: a type, an optional length (`10m`).
#[derive(Debug, Deserialize)]
pub(crate) struct PauseForm {
    #[serde(rename = "type")]
    task_type: String,
    /// How long (`10m`, `1h`); absent or empty: until resumed.
    #[serde(default, rename = "for")]
    for_: Option<String>,
    #[serde(default)]
    token: Option<String>,
}

/// The type a pause or resume applies to, once the request is authorized.
fn authorized_type(state: &AdminState, headers: &HeaderMap, form: &PauseForm) -> Result<TaskType, Refused> {
    authorize(state, headers, form.token.as_deref())?;
    form.task_type.parse().map_err(|e| (StatusCode::BAD_REQUEST, format!("{e}\n")))
}

/// `POST /type/pause`: `type`, optional `for`, `token` when configured.
async fn pause(State(state): State<AdminState>, headers: HeaderMap, Form(form): Form<PauseForm>) -> Response {
    let t = match authorized_type(&state, &headers, &form) {
        Ok(t) => t,
        Err(refused) => return refused.into_response(),
    };
    let length = match form.for_.as_deref().map(str::trim).filter(|f| !f.is_empty()) {
        None => None,
        Some(text) => match humantime::parse_duration(text) {
            Ok(d) if !d.is_zero() => Some(d),
            _ => {
                return (StatusCode::BAD_REQUEST, format!("for: not a duration like 10m or 1h: {text:?}\n"))
                    .into_response();
            }
        },
    };
    match state.store.pause(&t, length).await {
        Ok(ends) => {
            warn!(task_type = %t, "type paused from the dashboard");
            let until = ends.map_or("until resumed".to_owned(), |ms| format!("until {}", crate::clock::format_ms(ms)));
            back_to(&t, &format!("paused {t} {until}"))
        }
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("{e:#}\n")).into_response(),
    }
}

/// `POST /type/resume`: `type`, `token` when configured.
async fn resume(State(state): State<AdminState>, headers: HeaderMap, Form(form): Form<PauseForm>) -> Response {
    let t = match authorized_type(&state, &headers, &form) {
        Ok(t) => t,
        Err(refused) => return refused.into_response(),
    };
    match state.store.resume(&t).await {
        Ok(true) => {
            info!(task_type = %t, "type resumed from the dashboard");
            back_to(&t, &format!("resumed {t}"))
        }
        Ok(false) => back_to(&t, &format!("{t} was not paused")),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("{e:#}\n")).into_response(),
    }
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

/// The form of a task page action: one task, the token, and for a postpone how long.
#[derive(Debug, Deserialize)]
pub(crate) struct TaskForm {
    #[serde(rename = "type")]
    task_type: String,
    /// The task id as hex (exact for binary ids).
    id_hex: String,
    /// The admin token, when one is configured.
    #[serde(default)]
    token: Option<String>,
    /// Postpone only: a duration such as `5m`.
    #[serde(default)]
    by: Option<String>,
    /// Cancel only: must be `yes`.
    #[serde(default)]
    confirm: Option<String>,
}

/// Longest postponement the task page accepts: a typo like `5000d` is refused, not written.
const MAX_POSTPONE: Duration = Duration::from_secs(366 * 24 * 3600);

/// The task a task page action applies to, once the request is authorized and its form parsed.
fn authorized_task(state: &AdminState, headers: &HeaderMap, form: &TaskForm) -> Result<(TaskType, Vec<u8>), Refused> {
    authorize(state, headers, form.token.as_deref())?;
    let t: TaskType = form.task_type.parse().map_err(|e| (StatusCode::BAD_REQUEST, format!("{e}\n")))?;
    let id = hex::decode(&form.id_hex).map_err(|_| (StatusCode::BAD_REQUEST, "id_hex is not hex\n".to_owned()))?;
    if id.is_empty() {
        return Err((StatusCode::BAD_REQUEST, "id_hex is empty\n".to_owned()));
    }
    Ok((t, id))
}

/// Back to the task's page with a message.
fn back_to_task(t: &TaskType, id: &[u8], message: &str) -> Response {
    let mut url = format!("/task?type={}&id_hex={}&msg=", t.as_str(), hex::encode(id));
    url.extend(form_urlencoded_byte(message));
    Redirect::to(&url).into_response()
}

/// Names a task in messages and logs (ids are any bytes: control characters escaped).
fn task_name(t: &TaskType, id: &[u8]) -> String {
    format!("{t}/{}", crate::observe::logging::clean_id(id))
}

/// `POST /task/run-now`: a scheduled task becomes due now; anything else is left alone.
async fn task_run_now(State(state): State<AdminState>, headers: HeaderMap, Form(form): Form<TaskForm>) -> Response {
    let (t, id) = match authorized_task(&state, &headers, &form) {
        Ok(x) => x,
        Err(refused) => return refused.into_response(),
    };
    moved(&t, &id, "run now", state.store.reschedule(&t, &id, None).await)
}

/// `POST /task/postpone`: a scheduled task moves `by` later than the later of its due time and now.
async fn task_postpone(State(state): State<AdminState>, headers: HeaderMap, Form(form): Form<TaskForm>) -> Response {
    let (t, id) = match authorized_task(&state, &headers, &form) {
        Ok(x) => x,
        Err(refused) => return refused.into_response(),
    };
    let by = form.by.as_deref().unwrap_or_default().trim();
    let delay = match humantime::parse_duration(by) {
        Ok(d) if !d.is_zero() && d <= MAX_POSTPONE => d,
        _ => {
            return (
                StatusCode::BAD_REQUEST,
                format!("postpone by {by:?}: give a duration from 1s to 366d, like 30s, 5m or 2h\n"),
            )
                .into_response();
        }
    };
    moved(
        &t,
        &id,
        &format!("postponed by {}", humantime::format_duration(delay)),
        state.store.reschedule(&t, &id, Some(delay)).await,
    )
}

/// The answer to a run-now or postpone: back to the task page, saying what happened.
fn moved(t: &TaskType, id: &[u8], what: &str, result: Result<Option<i64>>) -> Response {
    let name = task_name(t, id);
    match result {
        Ok(Some(due_ms)) => {
            info!(task_type = %t, task_id = %crate::observe::logging::clean_id(id), due_ms, "task {what} from the dashboard");
            back_to_task(t, id, &format!("{name}: {what}, due at {}", crate::clock::format_ms(due_ms)))
        }
        Ok(None) => {
            back_to_task(t, id, &format!("{name} was not moved: it is no longer scheduled (running, dead or gone)"))
        }
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("{e:#}\n")).into_response(),
    }
}

/// `POST /task/cancel`: removes a scheduled task and its payload, or stops a running one; needs `confirm=yes`.
async fn task_cancel(State(state): State<AdminState>, headers: HeaderMap, Form(form): Form<TaskForm>) -> Response {
    let (t, id) = match authorized_task(&state, &headers, &form) {
        Ok(x) => x,
        Err(refused) => return refused.into_response(),
    };
    if form.confirm.as_deref() != Some("yes") {
        return (StatusCode::BAD_REQUEST, "a cancel deletes the task and its payload: confirm it with confirm=yes\n")
            .into_response();
    }
    let name = task_name(&t, &id);
    match state.store.cancel(&t, &id).await {
        Ok(CancelEffect::Scheduled) => {
            warn!(task_type = %t, task_id = %crate::observe::logging::clean_id(&id), "scheduled task cancelled from the dashboard");
            back_to_task(&t, &id, &format!("{name}: cancelled (it was scheduled; removed with its payload)"))
        }
        Ok(CancelEffect::Running { holder }) => {
            warn!(task_type = %t, task_id = %crate::observe::logging::clean_id(&id), %holder, "running task cancelled from the dashboard");
            let on = if holder.is_empty() {
                String::new()
            } else {
                format!(" on host {}", crate::observe::logging::Clean(&holder))
            };
            back_to_task(&t, &id, &format!("{name}: cancelled while running{on}; its handler is being stopped"))
        }
        Ok(CancelEffect::Unknown) => back_to_task(
            &t,
            &id,
            &format!("{name} was not cancelled: it is neither scheduled nor running (dead or gone)"),
        ),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("{e:#}\n")).into_response(),
    }
}

/// `POST /task/requeue`: a dead task becomes due now, attempts reset.
async fn task_requeue(State(state): State<AdminState>, headers: HeaderMap, Form(form): Form<TaskForm>) -> Response {
    let (t, id) = match authorized_task(&state, &headers, &form) {
        Ok(x) => x,
        Err(refused) => return refused.into_response(),
    };
    let name = task_name(&t, &id);
    match state.store.dead_requeue(&t, Some(std::slice::from_ref(&id))).await {
        Ok(1) => {
            info!(task_type = %t, task_id = %crate::observe::logging::clean_id(&id), "dead task re-queued from the dashboard");
            back_to_task(&t, &id, &format!("{name}: re-queued, due now"))
        }
        Ok(_) => back_to_task(&t, &id, &format!("{name} was not re-queued: it is not dead")),
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
