//! The dashboard's workflow groups: the open groups of a type, and the page of one group at `/group`.

use std::fmt::Write as _;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::dashboard::{SCRIPT, esc, header};
use super::{AdminState, html};
use crate::clock::format_ms;
use crate::group::{GroupId, GroupRef};
use crate::task_type::TaskType;

/// Most open groups listed for a type.
const OPEN_SHOWN: usize = 50;

/// `GET /group?type=C&group=G`.
#[derive(Debug, Deserialize)]
pub(crate) struct GroupQuery {
    #[serde(rename = "type", default)]
    task_type: String,
    #[serde(default)]
    group: String,
}

/// The link to a group's page.
pub(crate) fn link(callback_type: &str, group: &str) -> String {
    let q = |s: &str| s.bytes().map(|b| format!("%{b:02X}")).collect::<String>();
    format!("<a href=\"/group?type={}&amp;group={}\">{}</a>", q(callback_type), q(group), esc(group))
}

/// The open groups whose callbacks are of `t`, oldest first.
pub(crate) async fn open_groups(state: &AdminState, t: &TaskType, h: &mut String) -> anyhow::Result<()> {
    let open = state.store.groups_open(t, OPEN_SHOWN).await?;
    if open.is_empty() {
        return Ok(());
    }
    let _ = write!(
        h,
        "<section><h2>Open workflow groups with {} callbacks</h2><table id=groups><thead><tr><th>group</th>\
         <th>opened</th></tr></thead><tbody>",
        esc(t.as_str())
    );
    for (g, opened) in &open {
        let _ = write!(h, "<tr><td>{}</td><td>{}</td></tr>", link(t.as_str(), g), format_ms(*opened));
    }
    let _ = write!(h, "</tbody></table><p class=note>The {OPEN_SHOWN} oldest are listed.</p></section>");
    Ok(())
}

/// `GET /group?type=C&group=G`: one group's state, counts, callback and some children.
pub(crate) async fn page(State(state): State<AdminState>, Query(query): Query<GroupQuery>) -> Response {
    let mut h = String::with_capacity(8 * 1024);
    header(&state, Some(&query.task_type), "", &mut h);
    h.push_str("<main id=live>");
    let parsed = query.task_type.parse::<TaskType>().map_err(|e| e.to_string()).and_then(|callback_type| {
        let id: GroupId = query.group.parse().map_err(|e: anyhow::Error| e.to_string())?;
        Ok(GroupRef { callback_type, id })
    });
    let g = match parsed {
        Ok(g) => g,
        Err(why) => {
            let _ = write!(h, "<p class=bad>{}</p></main></body></html>", esc(&why));
            return (StatusCode::BAD_REQUEST, html(h)).into_response();
        }
    };
    let status = match state.store.group_show(&g).await {
        Ok(Some(v)) => {
            let _ = write!(
                h,
                "<section id=group data-state={state}><h2>group {t} / <code>{id}</code></h2>\
                 <p class=\"headline\">{state}</p><table><tbody>\
                 <tr><th>callback</th><td>{t} / <code>{cb}</code> (when {when})</td></tr>\
                 <tr><th>children</th><td>{added} added, {pending} pending, {ok} succeeded, {dead} dead, \
                 {cancelled} cancelled</td></tr><tr><th>opened</th><td>{opened}</td></tr>",
                state = esc(&v.state),
                t = esc(&v.callback_type),
                id = esc(&v.group),
                cb = esc(&v.callback_id),
                when = esc(&v.when),
                added = v.added,
                pending = v.pending,
                ok = v.succeeded,
                dead = v.dead,
                cancelled = v.cancelled,
                opened = format_ms(v.opened_ms),
            );
            if let (Some(at), Some(fired)) = (v.completed_ms, &v.fired) {
                let _ = write!(h, "<tr><th>completed</th><td>{} (callback: {})</td></tr>", format_ms(at), esc(fired));
            }
            for child in &v.pending_sample {
                let _ = write!(h, "<tr><th>pending</th><td><code>{}</code></td></tr>", esc(child));
            }
            for (child, how) in &v.failed_sample {
                let _ = write!(h, "<tr><th>{}</th><td><code>{}</code></td></tr>", esc(how), esc(child));
            }
            h.push_str("</tbody></table></section>");
            StatusCode::OK
        }
        Ok(None) => {
            let _ = write!(
                h,
                "<p class=bad>No group {} (never opened, or done more than 7 days ago).</p>",
                esc(&g.to_string())
            );
            StatusCode::NOT_FOUND
        }
        Err(e) => {
            let _ = write!(h, "<p class=bad>Cannot read Redis: {}</p>", esc(&format!("{e:#}")));
            StatusCode::SERVICE_UNAVAILABLE
        }
    };
    let _ = write!(h, "</main><script>{SCRIPT}</script></body></html>");
    (status, html(h)).into_response()
}
