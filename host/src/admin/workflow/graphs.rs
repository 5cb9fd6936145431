//! The dashboard's workflow graphs: the running graphs of a home type, and the page of one graph at `/graph`, drawn by layer with its nodes coloured by state.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::str::FromStr as _;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde::Deserialize;

use super::groups::{percent, task_link};
use crate::admin::AdminState;
use crate::admin::page::{bad_query, esc, header, live, unreadable};
use crate::clock::format_ms;
use crate::group::GroupId;
use crate::store::{GraphProgress, GraphView};
use crate::task_type::TaskType;

/// Most running graphs listed for a home type.
const RUNNING_SHOWN: usize = 50;
/// Of those, how many show their progress (each bar reads the graph).
const PROGRESS_SHOWN: usize = 10;
/// Graphs are drawn up to this many nodes; a larger one is listed only.
const DRAWN_NODES: usize = 300;
/// Nodes listed in the table below the drawing.
const LISTED_NODES: usize = 1000;
/// The node states, in the order the bar shows them.
const STATES: [&str; 6] = ["succeeded", "dead", "cancelled", "skipped", "scheduled", "waiting"];

/// `GET /graph?type=C&graph=G`.
#[derive(Debug, Deserialize)]
pub(crate) struct GraphQuery {
    #[serde(rename = "type", default)]
    task_type: String,
    #[serde(default)]
    graph: String,
}

/// The link to a graph's page.
pub(crate) fn link(home: &str, graph: &str) -> String {
    format!("<a href=\"/graph?type={}&amp;graph={}\">{}</a>", percent(home), percent(graph), esc(graph))
}

/// The graphs of home type `t` not done yet, oldest first.
pub(crate) async fn running_graphs(state: &AdminState, t: &TaskType, h: &mut String) -> anyhow::Result<()> {
    let running = state.store.graphs_running(t, RUNNING_SHOWN).await?;
    if running.is_empty() {
        return Ok(());
    }
    let _ = write!(
        h,
        "<section><h2>Running workflow graphs of {}</h2><table id=graphs><thead><tr><th>graph</th>\
         <th>opened</th><th>progress</th></tr></thead><tbody>",
        esc(t.as_str())
    );
    for (i, (g, opened)) in running.iter().enumerate() {
        let _ = write!(
            h,
            "<tr data-graph=\"{}\"><td>{}</td><td>{}</td><td>",
            esc(g),
            link(t.as_str(), g),
            format_ms(*opened)
        );
        if let Ok(id) = GroupId::from_str(g)
            && i < PROGRESS_SHOWN
            && let Some(v) = state.store.graph_show(t, &id).await?
        {
            bar(&v, state.store.graph_progress(&v).await.ok().as_ref(), h);
        }
        h.push_str("</td></tr>");
    }
    let _ = write!(
        h,
        "</tbody></table><p class=note>The {RUNNING_SHOWN} oldest are listed, the {PROGRESS_SHOWN} oldest with their progress.</p></section>"
    );
    Ok(())
}

/// A bar of a graph's nodes by state; of the scheduled, the share their handlers reported done.
fn bar(v: &GraphView, done: Option<&GraphProgress>, h: &mut String) {
    let count = |s: &str| v.counts.get(s).copied().unwrap_or(0);
    let total = STATES.iter().map(|s| count(s)).sum::<u64>().max(1);
    let ended: u64 = STATES[..4].iter().map(|s| count(s)).sum();
    // The scheduled nodes' reports, in nodes: the graph's percent less its ended nodes.
    let reported = done.map_or(0.0, |d| {
        (d.percent * v.nodes.len() as f64 / 100.0 - ended as f64).clamp(0.0, count("scheduled") as f64)
    });
    let _ = write!(h, "<div class=progress data-nodes={} title=\"", v.nodes.len());
    for (i, s) in STATES.iter().enumerate() {
        let _ = write!(h, "{}{} {s}", if i > 0 { ", " } else { "" }, count(s));
    }
    if let Some(d) = done {
        let _ = write!(h, "; {:.0}% done", d.percent);
    }
    h.push_str("\">");
    let share = |n: f64| n * 100.0 / total as f64;
    for s in STATES {
        if s == "scheduled" && reported > 0.0 {
            let _ = write!(
                h,
                "<span class=reported data-reported=\"{reported:.2}\" style=\"width:{:.2}%\"></span>",
                share(reported)
            );
        }
        let n = if s == "scheduled" { count(s) as f64 - reported } else { count(s) as f64 };
        if n > 0.0 {
            let _ = write!(h, "<span class={s} data-{s}={n} style=\"width:{:.2}%\"></span>", share(n));
        }
    }
    h.push_str("</div>");
}

/// Each node's layer: 0 for a root, else one more than its deepest parent.
fn layers(v: &GraphView) -> Vec<usize> {
    let index: HashMap<&str, usize> = v.nodes.iter().enumerate().map(|(i, n)| (n.name.as_str(), i)).collect();
    let mut layer = vec![0usize; v.nodes.len()];
    // Parents may be declared after their children: relax until nothing moves (a graph has no cycle,
    // so this ends within as many rounds as its depth).
    for _ in 0..v.nodes.len() {
        let mut moved = false;
        for (i, n) in v.nodes.iter().enumerate() {
            let deepest = n.parents.iter().filter_map(|p| index.get(p.as_str())).map(|&p| layer[p] + 1).max();
            if let Some(l) = deepest
                && l > layer[i]
            {
                layer[i] = l;
                moved = true;
            }
        }
        if !moved {
            break;
        }
    }
    layer
}

/// The graph drawn as SVG: a column per layer, an edge from each parent to its child, each node a
/// box coloured by its state and linked to its task's page.
fn drawing(v: &GraphView, h: &mut String) {
    const COLUMN: usize = 190;
    const ROW: usize = 44;
    const W: usize = 150;
    const H: usize = 30;
    let layer = layers(v);
    let mut rows_used: Vec<usize> = Vec::new();
    let mut at: Vec<(usize, usize)> = Vec::with_capacity(v.nodes.len());
    for &l in &layer {
        if rows_used.len() <= l {
            rows_used.resize(l + 1, 0);
        }
        at.push((10 + l * COLUMN, 10 + rows_used[l] * ROW));
        rows_used[l] += 1;
    }
    let width = 20 + rows_used.len() * COLUMN;
    let height = 20 + rows_used.iter().max().copied().unwrap_or(1) * ROW;
    let index: HashMap<&str, usize> = v.nodes.iter().enumerate().map(|(i, n)| (n.name.as_str(), i)).collect();
    let _ = write!(
        h,
        "<div class=graph-drawing><svg id=drawing xmlns=\"http://www.w3.org/2000/svg\" width={width} height={height} \
         viewBox=\"0 0 {width} {height}\" role=img aria-label=\"the graph's nodes by layer\">"
    );
    for (i, n) in v.nodes.iter().enumerate() {
        for p in n.parents.iter().filter_map(|p| index.get(p.as_str())) {
            let ((x1, y1), (x2, y2)) = (at[*p], at[i]);
            let (x1, y1, y2) = (x1 + W, y1 + H / 2, y2 + H / 2);
            let mid = (x1 + x2) / 2;
            let _ = write!(
                h,
                "<path class=edge data-from=\"{}\" data-to=\"{}\" d=\"M{x1} {y1} C{mid} {y1} {mid} {y2} {x2} {y2}\"/>",
                esc(&v.nodes[*p].name),
                esc(&n.name)
            );
        }
    }
    for (n, (x, y)) in v.nodes.iter().zip(&at) {
        let label: String = n.name.chars().take(20).collect();
        let why = n.reason.as_ref().map(|r| format!(" ({r})")).unwrap_or_default();
        let _ = write!(
            h,
            "<a href=\"/task?type={}&amp;id={}\"><g class=\"node {state}\" data-node=\"{name}\" data-state={state}>\
             <title>{name}: {t}/{id}, {state}{why}</title><rect x=\"{x}\" y=\"{y}\" width=\"{W}\" height=\"{H}\" rx=\"5\"/>\
             <text x=\"{tx}\" y=\"{ty}\">{label}</text></g></a>",
            percent(&n.task_type),
            percent(&n.id),
            state = esc(&n.state),
            name = esc(&n.name),
            t = esc(&n.task_type),
            id = esc(&n.id),
            why = esc(&why),
            tx = x + 8,
            ty = y + H / 2 + 5,
            label = esc(&label),
        );
    }
    h.push_str("</svg></div>");
}

/// One graph: the way back, its state and progress, the drawing, and its nodes.
fn graph_view(v: &GraphView, done: Option<&GraphProgress>, h: &mut String) {
    let _ = write!(
        h,
        "<p class=back><a id=back href=\"/?type={back}\">&larr; dashboard ({t})</a></p>\
         <section id=graph data-state={state}><h2>graph {t} / <code>{id}</code></h2><p class=\"headline\">{state}</p>",
        back = percent(&v.home_type),
        state = esc(&v.state),
        t = esc(&v.home_type),
        id = esc(&v.id),
    );
    bar(v, done, h);
    let counts: Vec<String> =
        STATES.iter().map(|s| format!("{} {s}", v.counts.get(*s).copied().unwrap_or(0))).collect();
    let _ = write!(h, "<p class=note id=counts>{} · {} edges</p>", counts.join(" · "), v.edges);
    if let Some(d) = done {
        let _ = write!(
            h,
            "<p class=note id=done>{:.0}% done: each ended or skipped node counts in full, each scheduled one as far \
             as its handler reported ({} of the {} scheduled nodes read have reported)</p>",
            d.percent, d.reporting, d.scheduled_read
        );
    }
    h.push_str("<table><tbody>");
    for (what, at) in [("opened", v.opened_ms), ("cancelled", v.cancelled_ms), ("completed", v.completed_ms)] {
        if let Some(at) = at {
            let _ = write!(h, "<tr><th>{what}</th><td>{}</td></tr>", format_ms(at));
        }
    }
    h.push_str("</tbody></table>");
    if v.nodes.len() <= DRAWN_NODES {
        drawing(v, h);
    } else {
        let _ = write!(h, "<p class=note>{} nodes: graphs of up to {DRAWN_NODES} are drawn.</p>", v.nodes.len());
    }
    h.push_str(
        "<table id=nodes><thead><tr><th>state</th><th>node</th><th>task</th><th>when</th><th>after</th>\
         <th>why</th></tr></thead><tbody>",
    );
    for n in v.nodes.iter().take(LISTED_NODES) {
        let waiting = if n.waiting_for > 0 { format!(" (waits for {})", n.waiting_for) } else { String::new() };
        let _ = write!(
            h,
            "<tr class=node data-node=\"{name}\" data-state={state}><td class={state}>{state}</td><td>{name}</td>\
             <td>{task}</td><td>{when}</td><td>{parents}{waiting}</td><td>{why}</td></tr>",
            name = esc(&n.name),
            state = esc(&n.state),
            task = task_link(&format!("{}/{}", n.task_type, n.id)),
            when = esc(&n.when),
            parents = esc(&n.parents.join(", ")),
            why = esc(n.reason.as_deref().unwrap_or("")),
        );
    }
    h.push_str("</tbody></table>");
    if v.nodes.len() > LISTED_NODES {
        let _ = write!(h, "<p class=note>The first {LISTED_NODES} of {} nodes are listed.</p>", v.nodes.len());
    }
    h.push_str("</section>");
}

/// `GET /graph?type=C&graph=G`: one graph's state, progress, drawing and nodes.
pub(crate) async fn page(State(state): State<AdminState>, Query(query): Query<GraphQuery>) -> Response {
    let parsed = query.task_type.parse::<TaskType>().map_err(|e| e.to_string()).and_then(|home| {
        let id: GroupId = query.graph.parse().map_err(|_| format!("invalid graph id {:?}", query.graph))?;
        Ok((home, id))
    });
    let (home, id) = match parsed {
        Ok(g) => g,
        Err(why) => return bad_query(&state, &query.task_type, "", &why),
    };
    let mut h = String::with_capacity(16 * 1024);
    header(&state, Some(home.as_str()), "", &mut h);
    h.push_str("<main id=live>");
    let status = match state.store.graph_show(&home, &id).await {
        Ok(Some(v)) => {
            let done = state.store.graph_progress(&v).await.ok();
            graph_view(&v, done.as_ref(), &mut h);
            StatusCode::OK
        }
        Ok(None) => {
            let _ = write!(
                h,
                "<p class=bad>No graph {}/{} (never declared, or done more than 7 days ago).</p>",
                esc(home.as_str()),
                esc(id.as_str())
            );
            StatusCode::NOT_FOUND
        }
        Err(e) => unreadable(&e, &mut h),
    };
    live(h, status)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::NodeView;

    fn node(name: &str, parents: &[&str]) -> NodeView {
        NodeView {
            name: name.into(),
            task_type: "work".into(),
            id: name.into(),
            when: "all".into(),
            state: "waiting".into(),
            reason: None,
            parents: parents.iter().map(|p| p.to_string()).collect(),
            waiting_for: parents.len() as u64,
        }
    }

    #[test]
    fn a_node_sits_one_layer_below_its_deepest_parent_whatever_the_order_declared() {
        let v = GraphView {
            home_type: "flow".into(),
            id: "g".into(),
            state: "running".into(),
            edges: 5,
            counts: Default::default(),
            opened_ms: None,
            completed_ms: None,
            cancelled_ms: None,
            // d is declared before its parents; c waits for a root and for b.
            nodes: vec![node("d", &["c", "a"]), node("a", &[]), node("b", &["a"]), node("c", &["a", "b"])],
        };
        assert_eq!(layers(&v), [3, 0, 1, 2]);
        let mut h = String::new();
        drawing(&v, &mut h);
        assert_eq!(h.matches("<path class=edge").count(), 5);
        assert!(h.contains("data-from=\"b\" data-to=\"c\""), "{h}");
        assert!(h.contains("<g class=\"node waiting\" data-node=\"d\""), "{h}");
    }
}
