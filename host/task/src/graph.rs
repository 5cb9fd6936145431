//! Workflow graphs as data: a node, the graph file's JSON, and the checks a graph must pass before it is declared.
//!
//! The CLI reads a graph file with [`parse_nodes`]; a handler's `workflow.graph`
//! call passes the same JSON, checked with [`check`] when it is made, so the
//! handler learns at once of a cycle or an unknown parent. `graph_open.lua`
//! checks everything again in Redis, where the graph is written.

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};

use crate::group::{FireWhen, GroupId};
use crate::task_type::TaskType;

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
    use crate::group::FireWhen;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(when: &FireWhen, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(when.as_str())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<FireWhen, D::Error> {
        String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
    }
}

/// A graph file: `{"nodes": [...]}`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GraphFile {
    /// The nodes, in any order.
    nodes: Vec<NodeFile>,
}

/// A node of a graph file.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeFile {
    /// Its name in the graph, which its children's `parents` use.
    name: String,
    /// The task type it runs as.
    #[serde(rename = "type")]
    task_type: String,
    /// The task id [default: `<graph id>/<name>`].
    id: Option<String>,
    /// The payload: a string as it is, any other JSON value as its JSON text [default: none].
    payload: Option<serde_json::Value>,
    /// `all` (default): run once every parent ended, however; `success`: only if all succeeded, else skipped.
    when: Option<String>,
    /// The names of the nodes it waits for [default: none, it runs at once].
    #[serde(default)]
    parents: Vec<String>,
}

/// The nodes of a graph file's text (`{"nodes": [{"name", "type", "id", "payload", "when", "parents"}]}`),
/// each node's type and rule checked; a node's id defaults to `<graph>/<name>`.
pub fn parse_nodes(text: &str, graph: &GroupId) -> anyhow::Result<Vec<NodeSpec>> {
    use anyhow::Context as _;
    let parsed: GraphFile = serde_json::from_str(text).context("not a graph file")?;
    parsed
        .nodes
        .into_iter()
        .map(|n| {
            let task_type: TaskType = n.task_type.parse().with_context(|| format!("node {:?}", n.name))?;
            let when = match n.when.as_deref() {
                None => FireWhen::AllEnded,
                Some(w) => w.parse::<FireWhen>().with_context(|| format!("node {:?}", n.name))?,
            };
            let payload = match n.payload {
                None => String::new(),
                Some(serde_json::Value::String(s)) => s,
                Some(other) => other.to_string(),
            };
            let id = n.id.unwrap_or_else(|| format!("{graph}/{}", n.name));
            Ok(NodeSpec { name: n.name, task_type, id, payload, when, parents: n.parents })
        })
        .collect()
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
            r#"{"nodes": [{"name": "a", "type": "work", "payload": {"n": 1}},
                          {"name": "b", "type": "work", "id": "b-1", "when": "success", "parents": ["a"]}]}"#,
            &gid(),
        )
        .unwrap();
        assert_eq!((nodes[0].id.as_str(), nodes[0].payload.as_str()), ("g/a", r#"{"n":1}"#));
        assert_eq!((nodes[1].when, nodes[1].parents.clone()), (FireWhen::AllSucceeded, vec!["a".to_owned()]));
        for (bad, says) in [
            (r#"{"nodes": [{"name": "a", "type": "work", "colour": 1}]}"#, "unknown field `colour`"),
            (r#"{"nodes": [{"name": "a", "type": "No"}]}"#, "node \"a\""),
            (r#"{"nodes": [{"name": "a", "type": "work", "when": "later"}]}"#, "node \"a\""),
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
