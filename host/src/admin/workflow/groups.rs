//! The dashboard's workflow groups: the open groups of a type, and the page of one group at `/group`.

use std::fmt::Write as _;
use std::str::FromStr as _;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde::Deserialize;

use crate::admin::AdminState;
use crate::admin::page::{bad_query, esc, header, live, state_name, unreadable};
use crate::clock::format_ms;
use crate::group::{GroupId, GroupRef};
use crate::task_type::TaskType;

/// Most open groups listed for a type.
const OPEN_SHOWN: usize = 50;
/// Of those, how many show their progress.
const PROGRESS_SHOWN: usize = 20;

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
    format!("<a href=\"/group?type={}&amp;group={}\">{}</a>", percent(callback_type), percent(group), esc(group))
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
         <th>opened</th><th>progress</th></tr></thead><tbody>",
        esc(t.as_str())
    );
    for (i, (g, opened)) in open.iter().enumerate() {
        let _ = write!(
            h,
            "<tr data-group=\"{}\"><td>{}</td><td>{}</td><td>",
            esc(g),
            link(t.as_str(), g),
            format_ms(*opened)
        );
        // Each bar is a few more reads: the oldest few have one.
        let shown = match GroupId::from_str(g) {
            Ok(id) if i < PROGRESS_SHOWN => {
                let g = GroupRef { callback_type: t.clone(), id };
                state.store.group_show(&g).await?.map(|v| (g, v))
            }
            _ => None,
        };
        if let Some((g, v)) = shown {
            progress(&v, state.store.group_progress(&g, &v).await.ok().as_ref(), h);
        }
        h.push_str("</td></tr>");
    }
    let _ = write!(
        h,
        "</tbody></table><p class=note>The {OPEN_SHOWN} oldest are listed, the {PROGRESS_SHOWN} oldest with their progress.</p></section>"
    );
    Ok(())
}

/// The link to a task's page (`child` is `<type>/<id>`, as groups list their children).
pub(crate) fn task_link(child: &str) -> String {
    let (t, id) = child.split_once('/').unwrap_or(("", child));
    format!("<a href=\"/task?type={}&amp;id={}\"><code>{}</code></a>", percent(t), percent(id), esc(child))
}

/// Every byte percent-encoded: safe in a query string whatever the name holds.
pub(crate) fn percent(s: &str) -> String {
    s.bytes().map(|b| format!("%{b:02X}")).collect()
}

/// A bar of a group's children by how they stand: succeeded, dead, cancelled, pending (of those added);
/// of the pending, the share their handlers reported done, when `done` was read.
fn progress(v: &crate::store::GroupView, done: Option<&crate::store::GroupProgress>, h: &mut String) {
    let parts = [("succeeded", v.succeeded), ("dead", v.dead), ("cancelled", v.cancelled), ("pending", v.pending)];
    let total = parts.iter().map(|(_, n)| n).sum::<u64>().max(1);
    // The pending children's reports, in children: the group's percent less its ended children.
    let ended = v.added.saturating_sub(v.pending) as f64;
    let reported = done.map_or(0.0, |d| (d.percent * v.added as f64 / 100.0 - ended).clamp(0.0, v.pending as f64));
    let _ = write!(h, "<div class=progress data-added={} title=\"", v.added);
    for (i, (name, n)) in parts.iter().enumerate() {
        let _ = write!(h, "{}{n} {name}", if i > 0 { ", " } else { "" });
    }
    if let Some(d) = done {
        let _ = write!(h, "; {:.0}% done", d.percent);
    }
    h.push_str("\">");
    for (name, n) in parts {
        let share = |n: f64| n * 100.0 / total as f64;
        if name == "pending" && reported > 0.0 {
            let _ = write!(
                h,
                "<span class=reported data-reported=\"{reported:.2}\" style=\"width:{:.2}%\"></span>",
                share(reported)
            );
        }
        let n = if name == "pending" { n as f64 - reported } else { n as f64 };
        if n > 0.0 {
            let _ = write!(h, "<span class={name} data-{name}={n} style=\"width:{:.2}%\"></span>", share(n));
        }
    }
    h.push_str("</div>");
}

/// One group: the way back, its state, the progress of its children (each linked to its task page), its callback.
fn group_view(
    v: &crate::store::GroupView,
    done: Option<&crate::store::GroupProgress>,
    callback_run: Option<&crate::store::TaskView>,
    h: &mut String,
) {
    let back = percent(&v.callback_type);
    let _ = write!(
        h,
        "<p class=back><a id=back href=\"/?type={back}\">&larr; dashboard ({t})</a></p>\
         <section id=group data-state={state}><h2>group {t} / <code>{id}</code></h2>\
         <p class=\"headline\">{state}</p>",
        state = esc(&v.state),
        t = esc(&v.callback_type),
        id = esc(&v.group),
    );
    progress(v, done, h);
    if let Some(d) = done {
        let _ = write!(
            h,
            "<p class=note id=done>{:.0}% done: each ended child counts in full, each pending one as far as its handler \
             reported ({} of the {} pending children read have reported)</p>",
            d.percent, d.reporting, d.pending_read
        );
    }
    let callback = task_link(&format!("{}/{}", v.callback_type, v.callback_id));
    let _ = write!(
        h,
        "<p class=note id=counts>{ok} succeeded · {dead} dead · {cancelled} cancelled · {pending} pending, of {added} added</p>\
         <table><tbody><tr><th>callback</th><td>{cb} (when {when})</td></tr><tr><th>opened</th><td>{opened}</td></tr>",
        added = v.added,
        pending = v.pending,
        ok = v.succeeded,
        dead = v.dead,
        cancelled = v.cancelled,
        cb = callback,
        when = esc(&v.when),
        opened = format_ms(v.opened_ms),
    );
    if let (Some(at), Some(fired)) = (v.completed_ms, &v.fired) {
        let _ = write!(h, "<tr><th>completed</th><td>{} (callback: {})</td></tr>", format_ms(at), esc(fired));
    }
    if let Some(run) = callback_run {
        // Where it is now; once it ended, how, if this host settled it lately (its
        // task page and the type's events have the rest).
        let ended = crate::observe::telemetry::recent()
            .into_iter()
            .find(|c| c.task_type == v.callback_type && c.id == v.callback_id && c.outcome != "fenced");
        let (state, what) = match ended {
            Some(c) if run.state == crate::store::TaskState::Unknown => {
                (c.outcome.to_owned(), format!("{} at {} (attempt {})", c.outcome, format_ms(c.finished_ms), c.attempt))
            }
            // Gone from Redis and not settled here lately: another host ran it.
            // Not waiting, running or dead-lettered, so it succeeded or was cancelled.
            None if run.state == crate::store::TaskState::Unknown => (
                "ended".to_owned(),
                "ended on another host: succeeded or cancelled (not waiting, running or dead-lettered); \
                 the type's events stream, when on, says which"
                    .to_owned(),
            ),
            _ => (state_name(run.state), crate::show::headline(run)),
        };
        let _ = write!(
            h,
            "<tr id=callback-run data-state={}><th>callback's run</th><td>{} {}</td></tr>",
            esc(&state),
            callback,
            esc(&what),
        );
    }
    for child in &v.pending_sample {
        let _ = write!(h, "<tr class=child data-child=pending><th>pending</th><td>{}</td></tr>", task_link(child));
    }
    for (child, how) in &v.failed_sample {
        let _ = write!(
            h,
            "<tr class=child data-child={how}><th>{how}</th><td>{}</td></tr>",
            task_link(child),
            how = esc(how)
        );
    }
    h.push_str("</tbody></table></section>");
}

/// `GET /group?type=C&group=G`: one group's state, counts, callback and some children.
pub(crate) async fn page(State(state): State<AdminState>, Query(query): Query<GroupQuery>) -> Response {
    let parsed = query.task_type.parse::<TaskType>().map_err(|e| e.to_string()).and_then(|callback_type| {
        let id: GroupId = query.group.parse().map_err(|e: anyhow::Error| e.to_string())?;
        Ok(GroupRef { callback_type, id })
    });
    let g = match parsed {
        Ok(g) => g,
        Err(why) => return bad_query(&state, &query.task_type, "", &why),
    };
    let mut h = String::with_capacity(8 * 1024);
    header(&state, Some(g.callback_type.as_str()), "", &mut h);
    h.push_str("<main id=live>");
    let status = match state.store.group_show(&g).await {
        Ok(Some(v)) => {
            // Once the callback fired, its own run: where it is now (its task page has the rest).
            let callback_run = match (&v.fired, v.callback_type.parse::<TaskType>()) {
                (Some(_), Ok(t)) => state.store.show(&t, v.callback_id.as_bytes()).await.ok(),
                _ => None,
            };
            let done = state.store.group_progress(&g, &v).await.ok();
            group_view(&v, done.as_ref(), callback_run.as_ref(), &mut h);
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
        Err(e) => unreadable(&e, &mut h),
    };
    live(h, status)
}
