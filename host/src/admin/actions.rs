//! The dashboard's buttons: re-queue, purge, pause, resume, and one task's run now, postpone, cancel and re-queue; each POST authorized first, then one store call.

use std::time::Duration;

use anyhow::Result;
use axum::extract::{Form, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use serde::Deserialize;
use tracing::{info, warn};

use super::AdminState;
use crate::store::CancelEffect;
use crate::task_type::TaskType;

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
pub(super) async fn requeue(
    State(state): State<AdminState>,
    headers: HeaderMap,
    Form(form): Form<DeadForm>,
) -> Response {
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
pub(super) async fn purge(State(state): State<AdminState>, headers: HeaderMap, Form(form): Form<DeadForm>) -> Response {
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
pub(super) async fn pause(
    State(state): State<AdminState>,
    headers: HeaderMap,
    Form(form): Form<PauseForm>,
) -> Response {
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
pub(super) async fn resume(
    State(state): State<AdminState>,
    headers: HeaderMap,
    Form(form): Form<PauseForm>,
) -> Response {
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
pub(super) async fn task_run_now(
    State(state): State<AdminState>,
    headers: HeaderMap,
    Form(form): Form<TaskForm>,
) -> Response {
    let (t, id) = match authorized_task(&state, &headers, &form) {
        Ok(x) => x,
        Err(refused) => return refused.into_response(),
    };
    moved(&t, &id, "run now", state.store.reschedule(&t, &id, None).await)
}

/// `POST /task/postpone`: a scheduled task moves `by` later than the later of its due time and now.
pub(super) async fn task_postpone(
    State(state): State<AdminState>,
    headers: HeaderMap,
    Form(form): Form<TaskForm>,
) -> Response {
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
pub(super) async fn task_cancel(
    State(state): State<AdminState>,
    headers: HeaderMap,
    Form(form): Form<TaskForm>,
) -> Response {
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
pub(super) async fn task_requeue(
    State(state): State<AdminState>,
    headers: HeaderMap,
    Form(form): Form<TaskForm>,
) -> Response {
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
