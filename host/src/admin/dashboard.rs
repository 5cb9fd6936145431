//! The dashboard at `/` and the task page at `/task`: server-rendered HTML,
//! a little JavaScript that refreshes it in place, no outside resources (it works offline).

use hourglass_task::sync::LockExt;
use std::fmt::Write as _;

use anyhow::Result;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use super::page::{SCRIPT, bad_query, esc, header, live, state_name, unreadable};
use super::{AdminState, PageParams, TaskQuery, html};
use crate::clock::format_ms;
use crate::store::{TaskState, TaskView};
use crate::task_type::TaskType;

/// Minutes shown by the "due over the next hour" chart (one bar each).
const CHART_MINUTES: usize = 60;
/// Most dead letters listed.
const DEAD_SHOWN: usize = 100;

/// Every type with a plugin here or keys in Redis, sorted.
pub(crate) async fn all_types(state: &AdminState) -> Result<Vec<TaskType>> {
    let mut types = state.store.known_types().await?;
    types.extend(state.registry.types());
    types.sort();
    types.dedup();
    Ok(types)
}

/// `GET /`: the whole page. Reads only.
pub(crate) async fn page(State(state): State<AdminState>, query: PageParams) -> Response {
    match render(&state, &query).await {
        Ok(body) => html(body).into_response(),
        Err(e) => (
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            html(format!(
                "<!doctype html><meta charset=utf-8><title>Hourglass</title><p>Cannot read Redis: {}</p>\
                 <script>setTimeout(() => location.reload(), 3000)</script>",
                esc(&format!("{e:#}"))
            )),
        )
            .into_response(),
    }
}

/// The type the page opens on: the most tasks ended per minute lately
/// (the sampled rates), then the most waiting or running now, then the most
/// ended ever; the first in name order among equals.
fn busiest(state: &AdminState, stats: &[(TaskType, crate::store::TypeStats)]) -> Option<TaskType> {
    let history = state.history.lock_unpoisoned();
    let activity = |t: &TaskType, s: &crate::store::TypeStats| {
        let per_min = history.rates(t).map_or(0.0, |(ok, failed, _)| ok + failed);
        (per_min, s.due_now + s.in_flight, s.succeeded + s.failed)
    };
    let mut best: Option<(&TaskType, (f64, u64, u64))> = None;
    for (t, s) in stats {
        let a = activity(t, s);
        if best.as_ref().is_none_or(|(_, b)| a.partial_cmp(b) == Some(std::cmp::Ordering::Greater)) {
            best = Some((t, a));
        }
    }
    best.map(|(t, _)| t.clone())
}

async fn render(state: &AdminState, query: &PageParams) -> Result<String> {
    let types = all_types(state).await?;
    let mut stats = Vec::with_capacity(types.len());
    for t in &types {
        stats.push((t.clone(), state.store.stats(t).await?));
    }
    let selected: Option<TaskType> =
        query.task_type.as_deref().and_then(|t| t.parse().ok()).or_else(|| busiest(state, &stats));

    let mut h = String::with_capacity(16 * 1024);
    header(state, selected.as_ref().map(TaskType::as_str), "", &mut h);
    h.push_str("<main id=live>");
    if let Some(msg) = &query.msg {
        let _ = write!(h, "<p class=msg id=msg>{}</p>", esc(msg));
    }

    // Per type counts and rates.
    h.push_str(
        "<section><h2>Task types</h2><table id=types><thead><tr><th>type</th><th>due now</th><th>later</th>\
         <th>in flight</th><th>dead</th><th>succeeded/min</th><th>failed/min</th><th>succeeded</th>\
         <th>failed</th><th>retried</th><th>open groups</th><th>plugin</th><th>claims</th></tr></thead><tbody>",
    );
    if stats.is_empty() {
        h.push_str("<tr><td colspan=13>no task types yet</td></tr>");
    }
    {
        let history = state.history.lock_unpoisoned();
        for (t, s) in &stats {
            let (ok_rate, fail_rate) = match history.rates(t) {
                Some((ok, failed, span)) => {
                    let title = format!("over the last {}s", span.as_secs());
                    (
                        format!("<span title=\"{title}\">{ok:.1}</span>"),
                        format!("<span title=\"{title}\">{failed:.1}</span>"),
                    )
                }
                None => ("–".to_owned(), "–".to_owned()),
            };
            let plugin = state
                .registry
                .get(t)
                .map_or("<span class=bad>none</span>".to_owned(), |e| format!("<code>{}</code>", esc(&e.hash)));
            let class = if Some(t) == selected.as_ref() { " class=selected" } else { "" };
            let _ = write!(
                h,
                "<tr{class} data-type=\"{t}\"><td><a href=\"/?type={t}\">{t}</a></td><td data-col=due_now>{}</td>\
                 <td data-col=later>{}</td><td data-col=in_flight>{}</td><td data-col=dead class={}>{}</td>\
                 <td>{ok_rate}</td><td>{fail_rate}</td><td data-col=succeeded>{}</td><td data-col=failed>{}</td>\
                 <td data-col=retried>{}</td><td data-col=groups_open>{}</td><td>{plugin}</td><td>{}</td></tr>",
                s.due_now,
                s.scheduled_later,
                s.in_flight,
                if s.dead > 0 { "bad" } else { "ok" },
                s.dead,
                s.succeeded,
                s.failed,
                s.retried,
                // Groups whose callbacks are of this type, still waiting for children.
                if s.groups_open > 0 {
                    format!("<a href=\"/?type={t}#groups\">{}</a>", s.groups_open)
                } else {
                    "0".to_owned()
                },
                pause_form(t, s.paused),
                t = esc(t.as_str()),
            );
        }
    }
    h.push_str("</tbody></table><p class=note>Rates are sampled from the counters in Redis every 5 s, over the last 5 minutes.</p>");
    faults(state, &stats, &mut h);
    h.push_str("</section>");

    if let Some(t) = &selected {
        // One type's broken keys must not take the page down: say so in its place.
        if let Err(e) = chart(state, t, &mut h).await {
            let _ = write!(
                h,
                "<section><p class=bad>Cannot chart {}: {}</p></section>",
                esc(t.as_str()),
                esc(&format!("{e:#}"))
            );
        }
        if let Err(e) = super::workflow::groups::open_groups(state, t, &mut h).await {
            let _ = write!(
                h,
                "<section><p class=bad>Cannot list the groups of {}: {}</p></section>",
                esc(t.as_str()),
                esc(&format!("{e:#}"))
            );
        }
        if let Err(e) = super::workflow::graphs::running_graphs(state, t, &mut h).await {
            let _ = write!(
                h,
                "<section><p class=bad>Cannot list the graphs of {}: {}</p></section>",
                esc(t.as_str()),
                esc(&format!("{e:#}"))
            );
        }
        if let Err(e) = dead_letters(state, t, &mut h).await {
            let _ = write!(
                h,
                "<section><p class=bad>Cannot list the dead letters of {}: {}</p></section>",
                esc(t.as_str()),
                esc(&format!("{e:#}"))
            );
        }
    }
    recent(&mut h);
    schedules(state, &mut h).await;
    plugins(state, &mut h);
    hosts(state, &types, &mut h).await;
    let _ = write!(h, "</main><script>{SCRIPT}</script></body></html>");
    Ok(h)
}

/// A type's pause state and its Pause (for an optional length) or Resume button.
fn pause_form(t: &TaskType, paused: Option<crate::store::Paused>) -> String {
    let te = esc(t.as_str());
    match paused {
        Some(p) => {
            let state = match p {
                crate::store::Paused::UntilResumed => "paused".to_owned(),
                crate::store::Paused::For(ms) => format!("paused, {} s left", ms / 1000),
            };
            format!(
                "<span class=bad data-paused>{state}</span> <form method=post action=/type/resume><input type=hidden name=type value=\"{te}\">\
                 <input type=hidden name=token><button data-action=resume>Resume</button></form>"
            )
        }
        None => format!(
            "<form method=post action=/type/pause><input type=hidden name=type value=\"{te}\"><input type=hidden name=token>\
             <input name=for size=4 placeholder=\"10m\" title=\"pause for this long (empty: until resumed)\">\
             <button data-action=pause>Pause</button></form>"
        ),
    }
}

/// The recurring schedules, with their next occurrence.
async fn schedules(state: &AdminState, h: &mut String) {
    let listed = match crate::recurring::list(&state.store).await {
        Ok(listed) => listed,
        Err(e) => {
            let _ = write!(
                h,
                "<section><h2>Recurring schedules</h2><p class=bad>Cannot read them: {}</p></section>",
                esc(&format!("{e:#}"))
            );
            return;
        }
    };
    if listed.is_empty() {
        return;
    }
    h.push_str(
        "<section><h2>Recurring schedules</h2><table id=schedules><thead><tr><th>type</th><th>name</th><th>rule</th>\
         <th>next</th><th>missed</th><th>from</th></tr></thead><tbody>",
    );
    for s in listed {
        let next = match (s.next_ms, s.armed_due) {
            (Some(ms), true) => esc(&format_ms(ms)),
            (Some(_), false) => "running; the next is armed shortly".to_owned(),
            (None, _) => "–".to_owned(),
        };
        let _ = write!(
            h,
            "<tr data-schedule=\"{}\"><td>{}</td><td>{}</td><td><code>{}</code></td><td>{next}</td><td>{}</td><td>{}</td></tr>",
            esc(&s.name),
            esc(&s.task_type),
            esc(&s.name),
            esc(&s.rule),
            esc(&s.missed),
            esc(&s.source),
        );
    }
    h.push_str("</tbody></table></section>");
}

/// `GET /task?type=T&id=ID` (or `&id_hex=HEX`): where one task is, with the
/// actions that fit its state. Reads only; the actions are POST forms.
pub(crate) async fn task_page(State(state): State<AdminState>, Query(query): Query<TaskQuery>) -> Response {
    let found = query.task_type.parse::<TaskType>().map_err(|e| e.to_string()).and_then(|t| {
        let id = match query.id_hex.as_deref().filter(|x| !x.is_empty()) {
            Some(hex) => hex::decode(hex).map_err(|_| "id_hex is not hex".to_owned())?,
            None => query.id.clone().unwrap_or_default().into_bytes(),
        };
        if id.is_empty() { Err("give a task id".to_owned()) } else { Ok((t, id)) }
    });
    let (t, id) = match found {
        Ok(x) => x,
        Err(why) => return bad_query(&state, &query.task_type, query.id.as_deref().unwrap_or_default(), &why),
    };
    let mut h = String::with_capacity(8 * 1024);
    let shown_id = String::from_utf8_lossy(&id).into_owned();
    header(&state, Some(t.as_str()), &shown_id, &mut h);
    h.push_str("<main id=live>");
    if let Some(msg) = &query.msg {
        let _ = write!(h, "<p class=msg id=msg>{}</p>", esc(msg));
    }
    let status = match state.store.show(&t, &id).await {
        Ok(view) => {
            task_view(&view, &mut h);
            StatusCode::OK
        }
        Err(e) => unreadable(&e, &mut h),
    };
    live(h, status)
}

/// One task: its state, what is known about it, and the buttons that apply.
fn task_view(v: &TaskView, h: &mut String) {
    let te = esc(v.task_type.as_str());
    let id = esc(&String::from_utf8_lossy(&v.id));
    let state = state_name(v.state);
    let _ = write!(
        h,
        "<section id=task data-state={state}><h2>{te} / <code>{id}</code></h2>\
         <p class=\"headline {state}\" id=headline>{}</p><table id=task-details><tbody>",
        esc(&crate::show::headline(v)),
    );
    if v.state != TaskState::Unknown {
        for (label, text) in crate::show::details(v) {
            let _ = write!(h, "<tr><th>{}</th><td class=detail>{}</td></tr>", esc(label), esc(&text));
        }
    }
    if let Some((c, g)) = v.group.as_deref().and_then(|g| g.split_once('/')) {
        let _ = write!(h, "<tr><th>group page</th><td>{}</td></tr>", super::workflow::groups::link(c, g));
    }
    if let Some((c, g)) = v.graph.as_deref().and_then(|g| g.split_once('/')) {
        let _ = write!(h, "<tr><th>graph page</th><td>{}</td></tr>", super::workflow::graphs::link(c, g));
    }
    h.push_str("</tbody></table><div class=actions id=task-actions>");
    let form = |h: &mut String, action: &str, extra: &str, label: &str| {
        let _ = write!(
            h,
            "<form method=post action=/task/{action}><input type=hidden name=type value=\"{te}\">\
             <input type=hidden name=id_hex value=\"{hex}\"><input type=hidden name=token>{extra}\
             <button data-action={action}>{label}</button></form>",
            hex = v.id_hex,
        );
    };
    match v.state {
        TaskState::Scheduled | TaskState::Due => {
            form(h, "run-now", "", "Run now");
            form(
                h,
                "postpone",
                "<input name=by required size=6 placeholder=5m aria-label=\"postpone by\" title=\"a duration: 30s, 5m, 2h\">",
                "Postpone",
            );
            form(h, "cancel", "<label><input type=checkbox name=confirm value=yes required> sure</label>", "Cancel");
        }
        TaskState::Dead => form(h, "requeue", "", "Re-queue"),
        TaskState::Running => form(
            h,
            "cancel",
            "<label><input type=checkbox name=confirm value=yes required> sure</label>",
            "Cancel (stops its handler)",
        ),
        TaskState::Unknown => {}
    }
    h.push_str("</div></section>");
}

/// Types whose keys hold bad data: what Redis shows, and what this host's claims and settles ran into.
fn faults(state: &AdminState, stats: &[(TaskType, crate::store::TypeStats)], h: &mut String) {
    let mut rows: Vec<(String, String)> =
        stats.iter().filter_map(|(t, s)| s.fault.as_ref().map(|f| (t.to_string(), f.clone()))).collect();
    for (t, why) in state.health.faults() {
        if !rows.iter().any(|(name, text)| *name == t.as_str() && why.contains(text.as_str())) {
            rows.push((t.to_string(), why));
        }
    }
    if rows.is_empty() {
        return;
    }
    h.push_str("<div id=faults><h3 class=bad>Faulted types</h3><p class=note>Their tasks stay where they are until the data is fixed; then they resume by themselves.</p><ul>");
    for (t, why) in rows {
        let _ = write!(h, "<li data-type=\"{}\"><b>{}</b>: {}</li>", esc(&t), esc(&t), esc(&why));
    }
    h.push_str("</ul></div>");
}

/// Inline SVG bar chart: tasks of `t` falling due in each minute of the next hour.
async fn chart(state: &AdminState, t: &TaskType, h: &mut String) -> Result<()> {
    let now = crate::clock::now_ms();
    let from = now - now % 60_000;
    let counts = state.store.due_buckets(t, from, 60_000, CHART_MINUTES).await?;
    let total: u64 = counts.iter().sum();
    let max = counts.iter().copied().max().unwrap_or(0).max(1);
    let (w, bar_h, bar_w) = (CHART_MINUTES * 10, 120.0, 10usize);
    let _ = write!(
        h,
        "<section><h2>Due over the next hour: {t} <small>({total} tasks)</small></h2>\
         <svg id=chart viewBox=\"0 0 {w} 150\" width=\"{w}\" height=150 role=img \
         aria-label=\"tasks of {t} falling due per minute over the next hour\">",
        t = esc(t.as_str())
    );
    for (i, &n) in counts.iter().enumerate() {
        let bh = (n as f64 / max as f64) * bar_h;
        let _ = write!(
            h,
            "<rect x={} y={:.1} width={} height={:.1} data-count={n}><title>{}: {n} due</title></rect>",
            i * bar_w + 1,
            bar_h - bh,
            bar_w - 2,
            bh.max(if n > 0 { 1.0 } else { 0.0 }),
            esc(&format_ms(from + i as i64 * 60_000)),
        );
    }
    let _ = write!(
        h,
        "<line x1=0 y1=121 x2={w} y2=121 class=axis></line><text x=0 y=140>now</text>\
         <text x={} y=140>+30 min</text><text x={} y=140 text-anchor=end>+60 min</text>\
         <text x={} y=12 text-anchor=end>max {max}/min</text></svg></section>",
        w / 2 - 20,
        w,
        w,
    );
    Ok(())
}

/// The dead letters of `t`, each with re-queue and purge buttons (POST forms).
async fn dead_letters(state: &AdminState, t: &TaskType, h: &mut String) -> Result<()> {
    let dead = state.store.dead_list(t, DEAD_SHOWN).await?;
    let te = esc(t.as_str());
    let _ = write!(h, "<section><h2>Dead letters: {te} <small>({} shown)</small></h2>", dead.len());
    if dead.is_empty() {
        let _ = write!(h, "<p id=no-dead>No dead tasks of {te}.</p></section>");
        return Ok(());
    }
    h.push_str(
        "<table id=dead><thead><tr><th>id</th><th>died</th><th>attempts</th><th>last error</th>\
         <th></th></tr></thead><tbody>",
    );
    for d in &dead {
        let id = esc(&String::from_utf8_lossy(&d.id));
        let _ = write!(
            h,
            "<tr data-id=\"{id}\"><td><code>{id}</code></td><td>{}</td><td>{}</td><td class=error>{}</td><td class=actions>\
             <form method=post action=/dead/requeue><input type=hidden name=type value=\"{te}\">\
             <input type=hidden name=id_hex value=\"{hex}\"><input type=hidden name=token>\
             <button data-action=requeue data-id=\"{id}\">Re-queue</button></form>\
             <form method=post action=/dead/purge class=purge><input type=hidden name=type value=\"{te}\">\
             <input type=hidden name=id_hex value=\"{hex}\"><input type=hidden name=token>\
             <label><input type=checkbox name=confirm value=yes required> sure</label>\
             <button data-action=purge data-id=\"{id}\">Purge</button></form></td></tr>",
            esc(&format_ms(d.died_ms)),
            d.attempts,
            esc(&d.error),
            hex = d.id_hex,
        );
    }
    let _ = write!(
        h,
        "</tbody></table><div class=bulk>\
         <form method=post action=/dead/requeue><input type=hidden name=type value=\"{te}\"><input type=hidden name=token>\
         <button data-action=requeue-all>Re-queue all dead {te}</button></form>\
         <form method=post action=/dead/purge class=purge><input type=hidden name=type value=\"{te}\"><input type=hidden name=token>\
         <label><input type=checkbox name=confirm value=yes required> sure</label>\
         <button data-action=purge-all>Purge all dead {te}</button></form></div></section>"
    );
    Ok(())
}

/// The last outcomes settled by this host.
fn recent(h: &mut String) {
    let recent = crate::observe::telemetry::recent();
    h.push_str("<section><h2>Recent outcomes on this host</h2>");
    if recent.is_empty() {
        h.push_str("<p>None yet.</p></section>");
        return;
    }
    h.push_str(
        "<table id=recent><thead><tr><th>finished</th><th>type</th><th>id</th><th>outcome</th><th>attempt</th>\
         <th>error</th></tr></thead><tbody>",
    );
    for c in recent.iter().take(20) {
        let id = esc(&c.id);
        let _ = write!(
            h,
            "<tr data-outcome-id=\"{id}\" data-outcome={o}><td>{}</td><td>{}</td><td><code>{id}</code></td>\
             <td class={o}>{o}</td><td>{}</td><td class=error>{}</td></tr>",
            esc(&format_ms(c.finished_ms)),
            esc(&c.task_type),
            c.attempt,
            esc(&c.error),
            o = c.outcome,
        );
    }
    h.push_str("</tbody></table></section>");
}

/// Loaded plugins with their version, types and limits, and files that failed to load.
fn plugins(state: &AdminState, h: &mut String) {
    use std::collections::BTreeMap;
    // File -> (version, its engine, its types with their limits, what its runs cost).
    let mut by_file: BTreeMap<std::path::PathBuf, (String, String, Vec<String>, String)> = BTreeMap::new();
    for t in state.registry.types() {
        if let Some(e) = state.registry.get(&t) {
            let p = &e.policy;
            let limits = format!(
                "{t}: timeout {}, memory {}, concurrency {}, max_attempts {}, max_payload {}{}; {}",
                humantime::format_duration(p.timeout),
                p.memory_limit,
                p.concurrency,
                p.max_attempts,
                p.max_payload,
                if p.events { ", events on" } else { "" },
                e.handler.instances(),
            );
            let component = e.handler.component();
            let cost = match component.run_cost() {
                Some(c) => {
                    format!("{:.0} µs wall time per run, mean of {} runs since it was loaded", c.mean_us, c.runs)
                }
                None => "no run yet".to_owned(),
            };
            let cost = match component.reset_refused() {
                Some(why) => format!("{cost}; its instances cannot be reset ({why})"),
                None => cost,
            };
            let engine = component.interpreter().to_string();
            let slot = by_file.entry(e.file.clone()).or_insert_with(|| (e.hash.clone(), engine, Vec::new(), cost));
            slot.2.push(limits);
        }
    }
    let errors = state.registry.load_errors();
    let _ = write!(
        h,
        "<section><h2>Plugins</h2><p id=memory-reset>Each task starts from its plugin's state just after \
         instantiation (unless its type sets instance_reuse): a kept instance is reset to it, or a new one made; \
         memory is reset: {}.</p>",
        esc(&state.registry.runtime().memory_reset().to_string()),
    );
    h.push_str(
        "<table id=plugins><thead><tr><th>file</th><th>version</th><th>engine</th><th>types and limits</th>\
         <th>cost per run</th><th>last load error</th></tr></thead><tbody>",
    );
    let mut files: Vec<_> = by_file.keys().chain(errors.keys()).cloned().collect();
    files.sort();
    files.dedup();
    for f in files {
        let name = f.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let (hash, engine, types, cost) = by_file
            .get(&f)
            .cloned()
            .unwrap_or_else(|| ("—".into(), "—".into(), vec!["not serving".into()], String::new()));
        let error = errors.get(&f).map(|e| esc(e)).unwrap_or_default();
        let _ = write!(
            h,
            "<tr data-plugin=\"{n}\"><td>{n}</td><td><code>{}</code></td><td class=engine>{}</td><td>{}</td><td class=cost>{}</td>\
             <td class=error>{error}</td></tr>",
            esc(&hash),
            esc(&engine),
            types.iter().map(|t| esc(t)).collect::<Vec<_>>().join("<br>"),
            esc(&cost),
            n = esc(&name),
        );
    }
    h.push_str("</tbody></table></section>");
}

/// This host, and every host registered in `P:hosts` with its state and leases.
async fn hosts(state: &AdminState, types: &[TaskType], h: &mut String) {
    let _ = write!(
        h,
        "<section><h2>Hosts</h2><table id=hosts><thead><tr><th>host</th><th>state</th><th>last seen</th>\
         <th>leases held</th></tr></thead><tbody>\
         <tr data-host=\"{id}\"><td>{id} (this one, admin at {})</td><td>alive</td><td>started {}</td><td>–</td></tr>",
        esc(&state.host.addr.to_string()),
        esc(&format_ms(state.host.started_ms)),
        id = esc(&state.host.id),
    );
    match crate::fleet::presence::list(&state.store, types).await {
        Ok(hosts) => {
            for host in hosts.iter().filter(|x| x.id != state.host.id) {
                let holds: Vec<String> = host.holds.iter().map(|(t, held)| format!("{t}: {}", held.count)).collect();
                let seen = if host.last_seen_ms == 0 {
                    "–".to_owned()
                } else {
                    format!("{:.1}s ago", host.silent_ms as f64 / 1000.0)
                };
                let _ = write!(
                    h,
                    "<tr data-host=\"{id}\"><td>{id}</td><td>{}</td><td>{seen}</td><td>{}</td></tr>",
                    esc(&host.state.to_string()),
                    esc(&holds.join(", ")),
                    id = esc(if host.id.is_empty() { "(no host id)" } else { &host.id }),
                );
            }
        }
        Err(e) => {
            let _ = write!(h, "<tr><td colspan=4 class=error>cannot list hosts: {}</td></tr>", esc(&format!("{e:#}")));
        }
    }
    h.push_str("</tbody></table></section>");
}
