//! What parsing a graph's JSON holds, measured by a counting allocator: never more than its budget.
//!
//! A handler's `workflow.graph` call hands the host JSON of its choosing, so
//! the shapes here are the ones that make a naive parse hold many times the
//! text's size: thousands of 2-byte parents, empty nodes, escaped strings,
//! deep and wide payloads. Each is parsed without a budget (what it holds
//! must stay under what the parser counted) and with half of that (the parse
//! must stop, having held no more than the budget).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use hourglass_task::graph::{GraphParseError, MAX_EDGES, MAX_NODES, check, check_cost, parse_nodes_within};
use hourglass_task::group::GroupId;

/// Counts this thread's live bytes and their peak; other threads pass through.
struct Counting;

thread_local! {
    static LIVE: Cell<usize> = const { Cell::new(0) };
    static PEAK: Cell<usize> = const { Cell::new(0) };
}

// A global allocator has no safe interface; this one only counts and forwards to the system's.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = LIVE.try_with(|live| {
            let now = live.get() + layout.size();
            live.set(now);
            let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
        });
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let _ = LIVE.try_with(|live| live.set(live.get().saturating_sub(layout.size())));
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

/// Runs `f`, returning its result and the most bytes it held at once beyond what was live before.
fn peak_of<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let base = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(base));
    let out = f();
    (out, PEAK.with(Cell::get) - base)
}

/// What a parse may hold beyond what it counts: serde_json's scratch buffer
/// for an escaped string (at most the text's length, the caller's to count)
/// and an error's message.
fn uncounted(text: &str) -> usize {
    text.len() + 4096
}

fn shapes() -> Vec<(&'static str, String)> {
    let node = |name: &str, parents: &[String]| {
        serde_json::json!({"name": name, "type": "work", "parents": parents}).to_string()
    };
    let file = |nodes: Vec<String>| format!(r#"{{"nodes": [{}]}}"#, nodes.join(","));
    let mut shapes = Vec::new();
    // One node with the most parents a graph may have, each named by 2 bytes.
    shapes.push((
        "2-byte parents",
        format!(
            r#"{{"nodes": [{{"name": "a", "type": "work", "parents": [{}]}}]}}"#,
            vec![r#""""#; MAX_EDGES].join(",")
        ),
    ));
    // The most nodes a graph may have, each as small as a node can be.
    shapes.push(("empty nodes", file(vec![r#"{"name":"","type":"w"}"#.to_owned(); MAX_NODES])));
    // Names, ids and payloads written with escapes, which serde_json unescapes into a scratch buffer.
    let escaped: Vec<String> = (0..2000)
        .map(|i| {
            format!(
                r#"{{"name": "\u006e{i}", "type": "work", "id": "\u0069{i}", "payload": "\"{}\""}}"#,
                "\\n".repeat(50)
            )
        })
        .collect();
    shapes.push(("escaped strings", file(escaped)));
    // Payloads that a `serde_json::Value` would build node by node: deep, and wide.
    let deep = format!("{}{}", "[".repeat(120), "]".repeat(120));
    let wide = format!("[{}]", vec!["{\"k\":0}"; 20_000].join(","));
    shapes.push((
        "deep and wide payloads",
        file(vec![
            format!(r#"{{"name": "d", "type": "work", "payload": {deep}}}"#),
            format!(r#"{{"name": "w", "type": "work", "payload": {wide}}}"#),
        ]),
    ));
    // A graph as a client would declare it: 10,000 nodes, 20,000 edges, default ids.
    let realistic: Vec<String> = (0..10_000)
        .map(|i: usize| {
            let parents: Vec<String> =
                [i.checked_sub(1), i.checked_sub(2)].into_iter().flatten().map(|p| format!("n{p}")).collect();
            node(&format!("n{i}"), &parents)
        })
        .collect();
    shapes.push(("10,000 nodes, 20,000 edges", file(realistic)));
    // The densest valid graph: every limit reached, one node below thousands of others.
    let mut edges = 0;
    let mut dense: Vec<String> = (0..MAX_NODES - 1)
        .map(|i| {
            let parents: Vec<String> = (i.saturating_sub(4)..i).map(|p| format!("n{p}")).collect();
            edges += parents.len();
            node(&format!("n{i}"), &parents)
        })
        .collect();
    let last: Vec<String> = (0..(MAX_EDGES - edges).min(MAX_NODES - 1)).map(|p| format!("n{p}")).collect();
    dense.push(node("last", &last));
    shapes.push(("10,000 nodes, 50,000 edges", file(dense)));
    shapes
}

#[test]
fn a_graph_parse_holds_no_more_than_it_counts_and_stops_at_its_budget() {
    let graph: GroupId = "g".parse().unwrap();
    for (shape, text) in shapes() {
        let (parsed, held) = peak_of(|| parse_nodes_within(&text, &graph, usize::MAX));
        let (nodes, cost) = parsed.unwrap_or_else(|e| panic!("{shape}: {e:?}"));
        assert!(!nodes.is_empty(), "{shape}");
        assert!(
            held <= cost.peak + uncounted(&text),
            "{shape}: held {held} bytes at once, counted {cost:?} (text {} bytes)",
            text.len()
        );
        let (_, kept) = peak_of(|| drop(nodes.clone()));
        assert!(kept <= cost.held, "{shape}: the nodes hold {kept} bytes, counted {cost:?}");
        // The shape check's working memory, charged to a handler's run before it runs.
        let (checked, checking) = peak_of(|| check(&graph, &nodes));
        assert_eq!(checked.is_ok(), !shape.ends_with("parents") && shape != "empty nodes", "{shape}: {checked:?}");
        assert!(
            checking <= check_cost(&nodes),
            "{shape}: checking held {checking} bytes, counted {}",
            check_cost(&nodes)
        );
        eprintln!(
            "{shape}: text {} B, counted {cost:?}, held at most {held} B, the nodes {kept} B; checking {checking} B of {} counted",
            text.len(),
            check_cost(&nodes)
        );
        drop(nodes);

        let budget = cost.peak / 2;
        let (parsed, held) = peak_of(|| parse_nodes_within(&text, &graph, budget));
        match parsed {
            Err(GraphParseError::OverBudget { wanted }) => assert!(wanted > budget, "{shape}: {wanted}"),
            other => panic!("{shape}: with half the budget: {other:?}"),
        }
        assert!(held <= budget + uncounted(&text), "{shape}: held {held} bytes with a budget of {budget}");
    }
}

#[test]
fn a_graph_past_the_limits_stops_being_parsed_there() {
    let graph: GroupId = "g".parse().unwrap();
    let nodes = format!(r#"{{"nodes": [{}]}}"#, vec![r#"{"name":"","type":"w"}"#; MAX_NODES + 1].join(","));
    let edges = format!(
        r#"{{"nodes": [{{"name": "a", "type": "work", "parents": [{}]}}]}}"#,
        vec![r#""""#; MAX_EDGES + 1].join(",")
    );
    for (text, says) in [(nodes, "more than the limit of 10000 nodes"), (edges, "more than the limit of 50000 edges")] {
        match parse_nodes_within(&text, &graph, usize::MAX) {
            Err(GraphParseError::Invalid(e)) => assert!(format!("{e:#}").contains(says), "{e:#}"),
            other => panic!("{says}: {other:?}"),
        }
    }
}
