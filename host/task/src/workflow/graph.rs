//! Workflow graphs as data: a node, the graph file's JSON, and the checks a graph must pass before it is declared.
//!
//! The CLI reads a graph file with [`parse_nodes`]; a handler's `workflow.graph`
//! call passes the same JSON, checked with [`check`] when it is made, so the
//! handler learns at once of a cycle or an unknown parent. `graph_open.lua`
//! checks everything again in Redis, where the graph is written.

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};

use crate::task_type::TaskType;
use crate::workflow::group::{FireWhen, GroupId};

mod parse;

/// Most nodes in one graph: its declaration is one script call, which Redis runs alone.
pub const MAX_NODES: usize = 10_000;
/// Most edges (parent links) in one graph.
pub const MAX_EDGES: usize = 50_000;

/// A node of a graph to declare.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeSpec {
    /// Its name in the graph (what parents name): 1 to 200 bytes of text.
    pub name: String,
    /// The task it runs: its type ...
    #[serde(rename = "type")]
    pub task_type: TaskType,
    /// ... and its id there (text).
    pub id: String,
    /// The task's payload (text; empty: none).
    pub payload: String,
    /// When it runs: once all its parents ended, or only if all succeeded.
    #[serde(with = "when_word")]
    pub when: FireWhen,
    /// The names of the nodes it waits for.
    pub parents: Vec<String>,
}

mod when_word {
    use crate::workflow::group::FireWhen;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(when: &FireWhen, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(when.as_str())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<FireWhen, D::Error> {
        String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
    }
}

/// The nodes of a graph file's text (`{"nodes": [{"name", "type", "id", "payload", "when", "parents"}]}`),
/// each node's type and rule checked; a node's id defaults to `<graph>/<name>`.
pub fn parse_nodes(text: &str, graph: &GroupId) -> anyhow::Result<Vec<NodeSpec>> {
    match parse_nodes_within(text, graph, usize::MAX) {
        Ok((nodes, _)) => Ok(nodes),
        Err(GraphParseError::Invalid(e)) => Err(e),
        Err(GraphParseError::OverBudget { wanted }) => anyhow::bail!("a graph file would hold {wanted} bytes"),
    }
}

/// Why [`parse_nodes_within`] returned no nodes.
#[derive(Debug)]
pub enum GraphParseError {
    /// The text is not a graph file, or names a bad type or rule, or has more than
    /// [`MAX_NODES`] nodes or [`MAX_EDGES`] edges (the parse stops there).
    Invalid(anyhow::Error),
    /// What it builds would hold more than the budget: `wanted` bytes, counted
    /// up to the allocation that did not fit (which was not made).
    OverBudget { wanted: usize },
}

/// What a parse held, counted as [`parse_nodes_within`] counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParseCost {
    /// Bytes the nodes it returned hold.
    pub held: usize,
    /// The most it held at once, at most its budget.
    pub peak: usize,
}

/// [`parse_nodes`] within `budget` bytes: each allocation it makes (strings,
/// the growth of its vectors, with the allocator's rounding) is counted
/// before it is made, and the parse stops at the first that would not fit,
/// or past the node and edge limits. So a handler's `workflow.graph` call
/// holds no more than its run's budget leaves, whatever the text's shape
/// (2-byte parents, empty nodes, deep payloads). Returns the nodes and what
/// they cost. The text itself, and serde_json's scratch buffer for an
/// escaped string (at most the text's length), are the caller's.
pub fn parse_nodes_within(
    text: &str,
    graph: &GroupId,
    budget: usize,
) -> Result<(Vec<NodeSpec>, ParseCost), GraphParseError> {
    use serde::de::DeserializeSeed as _;
    let meter = parse::Meter::new(budget);
    let mut de = serde_json::Deserializer::from_str(text);
    let parsed =
        parse::FileSeed { meter: &meter, graph }.deserialize(&mut de).and_then(|nodes| de.end().map(|()| nodes));
    match parsed {
        Ok(nodes) => Ok((nodes, ParseCost { held: meter.used(), peak: meter.peak() })),
        Err(_) if meter.over() => Err(GraphParseError::OverBudget { wanted: meter.peak() }),
        Err(e) => Err(GraphParseError::Invalid(anyhow::Error::new(e).context("not a graph file"))),
    }
}

/// The most bytes [`check`] holds while it checks `nodes` (its indexes, in
/// hash tables at most half empty, and its lists of parents and children),
/// with the allocator's rounding: what a handler's run is charged for it.
pub fn check_cost(nodes: &[NodeSpec]) -> usize {
    let n = nodes.len();
    let edges: usize = nodes.iter().map(|node| node.parents.len()).sum();
    let widest = nodes.iter().map(|node| node.parents.len()).max().unwrap_or(0);
    // Per node: two hash-table slots (name; type and id) with their control
    // bytes, two list headers, two counters; per edge: an index in each of
    // two lists, the children's grown by doubling; the widest node's set of seen parents.
    let bytes = n
        .saturating_mul(2 * (24 + 48 + 2) + 2 * 24 + 2 * 8)
        .saturating_add(edges.saturating_mul(8 + 16))
        .saturating_add(widest.saturating_mul(2 * (8 + 1)));
    bytes.saturating_add(bytes / 4).saturating_add(n.saturating_mul(64))
}

/// What `graph_open.lua` would refuse of `nodes` for their shape alone (it
/// also refuses a graph id or a task already in use, which only Redis knows):
/// no nodes, too many nodes or edges, a bad or repeated name, two nodes with
/// one task, an unknown, repeated or self parent, a cycle (an edge of it named).
pub fn check(graph: &GroupId, nodes: &[NodeSpec]) -> Result<(), String> {
    let graph = graph.as_str();
    if nodes.is_empty() {
        return Err(format!("graph {graph:?} has no nodes"));
    }
    if nodes.len() > MAX_NODES {
        return Err(format!("graph {graph:?} has {} nodes, more than the limit of {MAX_NODES}", nodes.len()));
    }
    let edges: usize = nodes.iter().map(|n| n.parents.len()).sum();
    if edges > MAX_EDGES {
        return Err(format!("graph {graph:?} has {edges} edges, more than the limit of {MAX_EDGES}"));
    }
    let mut index: HashMap<&str, usize> = HashMap::with_capacity(nodes.len());
    let mut tasks: HashMap<(&str, &str), &str> = HashMap::with_capacity(nodes.len());
    for (i, n) in nodes.iter().enumerate() {
        if n.name.is_empty() || n.name.len() > 200 || n.name.chars().any(char::is_control) {
            return Err(format!("graph {graph:?}: node name {:?} is not 1-200 bytes of text", n.name));
        }
        if index.insert(&n.name, i).is_some() {
            return Err(format!("graph {graph:?}: two nodes are named {:?}", n.name));
        }
        if n.id.is_empty() {
            return Err(format!("graph {graph:?}: node {:?} needs an id", n.name));
        }
        if let Some(other) = tasks.insert((n.task_type.as_str(), &n.id), &n.name) {
            return Err(format!(
                "graph {graph:?}: nodes {other:?} and {:?} are both task {}/{}",
                n.name, n.task_type, n.id
            ));
        }
    }
    let mut parents: Vec<Vec<usize>> = Vec::with_capacity(nodes.len());
    for (i, n) in nodes.iter().enumerate() {
        let mut seen = HashSet::new();
        let mut of = Vec::with_capacity(n.parents.len());
        for p in &n.parents {
            let &at = index.get(p.as_str()).ok_or_else(|| {
                format!("graph {graph:?}: edge {p:?} -> {:?}: {p:?} is not a node of the graph", n.name)
            })?;
            if at == i {
                return Err(format!("graph {graph:?}: edge {p:?} -> {:?}: a node cannot be its own parent", n.name));
            }
            if !seen.insert(at) {
                return Err(format!("graph {graph:?}: edge {p:?} -> {:?} is given twice", n.name));
            }
            of.push(at);
        }
        parents.push(of);
    }
    // Kahn's order; what it cannot reach lies on or below a cycle: walk back through unreached parents.
    let mut children: Vec<Vec<usize>> = vec![Vec::new(); nodes.len()];
    for (i, of) in parents.iter().enumerate() {
        for &p in of {
            children[p].push(i);
        }
    }
    let mut waiting: Vec<usize> = parents.iter().map(Vec::len).collect();
    let mut queue: Vec<usize> = (0..nodes.len()).filter(|&i| waiting[i] == 0).collect();
    let mut head = 0;
    while head < queue.len() {
        let i = queue[head];
        head += 1;
        for &c in &children[i] {
            waiting[c] -= 1;
            if waiting[c] == 0 {
                queue.push(c);
            }
        }
    }
    if queue.len() < nodes.len() {
        let mut at = (0..nodes.len()).find(|&i| waiting[i] > 0).unwrap_or(0);
        let mut on_path = HashSet::new();
        while on_path.insert(at) {
            at = parents[at].iter().copied().find(|&p| waiting[p] > 0).unwrap_or(at);
        }
        let parent = parents[at].iter().copied().find(|&p| waiting[p] > 0).unwrap_or(at);
        return Err(format!(
            "graph {graph:?} has a cycle through edge {:?} -> {:?}",
            nodes[parent].name, nodes[at].name
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gid() -> GroupId {
        "g".parse().unwrap()
    }

    #[test]
    fn a_graph_file_parses_with_its_defaults_and_a_bad_one_names_the_culprit() {
        let nodes = parse_nodes(
            r#"{"nodes": [{"name": "a", "type": "work", "payload": {"n": 1,
                          "a": " x \" y "}},
                          {"name": "b", "type": "work", "id": "b-1", "when": "success", "parents": ["a"]}]}"#,
            &gid(),
        )
        .unwrap();
        // A payload other than a string is its JSON text, compact, its keys as written.
        assert_eq!((nodes[0].id.as_str(), nodes[0].payload.as_str()), ("g/a", r#"{"n":1,"a":" x \" y "}"#));
        assert_eq!((nodes[1].when, nodes[1].parents.clone()), (FireWhen::AllSucceeded, vec!["a".to_owned()]));
        let escaped =
            parse_nodes(r#"{"nodes": [{"name": "\u0061", "type": "work", "payload": "x\ny", "when": null}]}"#, &gid());
        let escaped = escaped.unwrap_or_else(|e| panic!("{e:#}"));
        let ended = parse_nodes(r#"{"nodes": [{"name": "a", "type": "work", "payload": [ "x\\", "y z" ] }]}"#, &gid());
        assert_eq!(ended.unwrap()[0].payload, r#"["x\\","y z"]"#, "a string ending in a backslash ends there");
        assert_eq!((escaped[0].name.as_str(), escaped[0].payload.as_str()), ("a", "x\ny"));
        for (bad, says) in [
            (r#"{"nodes": [{"name": "a", "type": "work", "colour": 1}]}"#, "unknown field `colour`"),
            (r#"{"nodes": [{"name": "a", "type": "No"}]}"#, "node \"a\""),
            (r#"{"nodes": [{"name": "a", "type": "work", "when": "later"}]}"#, "node \"a\""),
            (r#"{"nodes": [{"name": "a", "name": "b", "type": "work"}]}"#, "duplicate field `name`"),
            (r#"{"nodes": [{"type": "work"}]}"#, "missing field `name`"),
            (r#"{"nodes": [{"name": "a", "type": "work", "parents": "b"}]}"#, "a list of node names"),
            (r#"{"nodes": []} x"#, "trailing characters"),
            (r#"{"edges": []}"#, "unknown field `edges`"),
            (r#"{}"#, "missing field `nodes`"),
        ] {
            let e = format!("{:#}", parse_nodes(bad, &gid()).unwrap_err());
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn the_shape_checks_refuse_what_graph_open_lua_would() {
        let node = |name: &str, parents: &[&str]| NodeSpec {
            name: name.into(),
            task_type: "work".parse().unwrap(),
            id: format!("g/{name}"),
            payload: String::new(),
            when: FireWhen::AllEnded,
            parents: parents.iter().map(|p| p.to_string()).collect(),
        };
        assert_eq!(check(&gid(), &[node("a", &[]), node("b", &["a"]), node("c", &["a", "b"])]), Ok(()));
        for (nodes, says) in [
            (vec![], "has no nodes"),
            (vec![node("a", &["c"]), node("b", &["a"]), node("c", &["b"]), node("d", &[])], "has a cycle through edge"),
            (vec![node("a", &["x"])], "\"x\" is not a node of the graph"),
            (vec![node("a", &["a"])], "its own parent"),
            (vec![node("a", &[]), node("b", &["a", "a"])], "is given twice"),
            (vec![node("a", &[]), node("a", &[])], "two nodes are named \"a\""),
            (vec![node("a", &[]), NodeSpec { id: "g/a".into(), ..node("b", &[]) }], "are both task work/g/a"),
        ] {
            let e = check(&gid(), &nodes).unwrap_err();
            assert!(e.contains(says), "{e}");
        }
    }
}
