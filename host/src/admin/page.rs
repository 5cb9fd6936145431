//! What every admin page shares: the style and script, HTML escaping, the header bar, state names.

use std::fmt::Write as _;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use super::{AdminState, html};
use crate::store::TaskState;

const STYLE: &str = include_str!("dashboard.css");
pub(super) const SCRIPT: &str = include_str!("dashboard.js");

/// Escapes text for HTML content and attribute values.
pub(super) fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The page head and the header bar: this host, the task search box, the token field.
pub(super) fn header(state: &AdminState, search_type: Option<&str>, search_id: &str, h: &mut String) {
    let uptime = state.host.started.elapsed().as_secs();
    let _ = write!(
        h,
        "<!doctype html><html lang=en><head><meta charset=utf-8><meta name=viewport content=\"width=device-width\">\
         <title>Hourglass</title><style>{STYLE}</style></head><body data-token={}>\
         <header><h1><a href=\"/\">Hourglass</a></h1><span>host <b>{}</b> · up {}h{:02}m · admin {} · \
         <span id=config-applied>config applied {}</span></span>\
         <form method=get action=/task class=search role=search><input name=type required placeholder=type \
         aria-label=\"task type\" value=\"{}\"><input name=id required placeholder=\"task id\" aria-label=\"task id\" \
         value=\"{}\"><button>Find task</button></form>",
        state.token.is_some(),
        esc(&state.host.id),
        uptime / 3600,
        uptime / 60 % 60,
        esc(&state.host.addr.to_string()),
        esc(&crate::clock::format_ms(state.registry.config_applied_ms())),
        esc(search_type.unwrap_or_default()),
        esc(search_id),
    );
    if let Some(master) = state.store.master() {
        let _ = write!(h, "<span id=redis-master>redis master {}</span>", esc(&master_line(&master)));
    }
    if state.token.is_some() {
        h.push_str(
            "<label class=token>token <input id=token type=password autocomplete=off \
             placeholder=\"needed to change tasks\"></label>",
        );
    }
    h.push_str("</header>");
}

/// A task state's name as `show --json` gives it (`scheduled`, `running`, ...).
pub(super) fn state_name(state: TaskState) -> String {
    serde_json::to_value(state).ok().and_then(|s| s.as_str().map(str::to_owned)).unwrap_or_default()
}

/// A page its query does not name rightly: the header and the reason, 400, nothing to refresh.
pub(super) fn bad_query(state: &AdminState, search_type: &str, search_id: &str, why: &str) -> Response {
    let mut h = String::with_capacity(2 * 1024);
    header(state, Some(search_type), search_id, &mut h);
    let _ = write!(h, "<main><p class=bad>{}</p></main></body></html>", esc(why));
    (StatusCode::BAD_REQUEST, html(h)).into_response()
}

/// What a page shows when Redis could not be read, and its status.
pub(super) fn unreadable(e: &anyhow::Error, h: &mut String) -> StatusCode {
    let _ = write!(h, "<p class=bad>Cannot read Redis: {}</p>", esc(&format!("{e:#}")));
    StatusCode::SERVICE_UNAVAILABLE
}

/// Ends a live page (`h` opened `<main id=live>`, which the script refreshes) with `status`.
pub(super) fn live(mut h: String, status: StatusCode) -> Response {
    let _ = write!(h, "</main><script>{SCRIPT}</script></body></html>");
    (status, html(h)).into_response()
}

/// The master in use, as `/readyz` and the dashboard say it: where, since
/// when, how it was found and how many failovers this host followed.
pub(super) fn master_line(master: &crate::store::MasterInfo) -> String {
    let how = if master.sentinel { "through Sentinel, " } else { "" };
    format!(
        "{} ({how}in use since {}; {} change{} since start)",
        master.addr,
        crate::clock::format_ms(master.since_ms),
        master.changes,
        if master.changes == 1 { "" } else { "s" }
    )
}
