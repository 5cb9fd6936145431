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

/// The graph file's parser: serde visitors that count what they allocate.
mod parse {
    use std::cell::Cell;
    use std::fmt;

    use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
    use serde::{Deserialize, Deserializer};
    use serde_json::value::RawValue;

    use super::{MAX_EDGES, MAX_NODES, NodeSpec};
    use crate::group::{FireWhen, GroupId};
    use crate::task_type::TaskType;

    /// What a parse may allocate, what it holds, and the most it held at once.
    pub(super) struct Meter {
        budget: usize,
        used: Cell<usize>,
        peak: Cell<usize>,
        over: Cell<bool>,
        edges: Cell<usize>,
    }

    /// What an allocation of `bytes` takes from the allocator: its size rounded
    /// up (jemalloc's classes are at most 25% apart; glibc adds a header and
    /// has a 32-byte minimum).
    fn allocated(bytes: usize) -> usize {
        if bytes == 0 { 0 } else { bytes.saturating_add(bytes / 4).saturating_add(32) }
    }

    impl Meter {
        pub(super) fn new(budget: usize) -> Meter {
            Meter { budget, used: Cell::new(0), peak: Cell::new(0), over: Cell::new(false), edges: Cell::new(0) }
        }

        /// Bytes the parse holds now.
        pub(super) fn used(&self) -> usize {
            self.used.get()
        }

        /// The most bytes the parse held at once (what would have been, for one over budget).
        pub(super) fn peak(&self) -> usize {
            self.peak.get()
        }

        pub(super) fn over(&self) -> bool {
            self.over.get()
        }

        /// Counts an allocation of `bytes` before it is made.
        fn charge<E: de::Error>(&self, bytes: usize) -> Result<(), E> {
            let wanted = self.used.get().saturating_add(allocated(bytes));
            self.peak.set(self.peak.get().max(wanted));
            if wanted > self.budget {
                self.over.set(true);
                return Err(E::custom(format_args!("the graph would hold more than {} bytes", self.budget)));
            }
            self.used.set(wanted);
            Ok(())
        }

        /// `text` as a counted `String`.
        fn string<E: de::Error>(&self, text: &str) -> Result<String, E> {
            self.charge(text.len())?;
            Ok(text.to_owned())
        }

        /// Pushes `item`; a vector's new buffer is counted before it is made
        /// (the old one is held too while the items move), the old one released after.
        fn push<T, E: de::Error>(&self, items: &mut Vec<T>, item: T) -> Result<(), E> {
            if items.len() == items.capacity() {
                let old = items.capacity();
                let grown = (old * 2).max(4);
                self.charge(grown.saturating_mul(size_of::<T>()))?;
                items.reserve_exact(grown - items.len());
                self.used.set(self.used.get() - allocated(old * size_of::<T>()));
            }
            items.push(item);
            Ok(())
        }
    }

    /// `{"nodes": [...]}`.
    pub(super) struct FileSeed<'m> {
        pub(super) meter: &'m Meter,
        pub(super) graph: &'m GroupId,
    }

    #[derive(Deserialize)]
    #[serde(field_identifier, rename_all = "lowercase")]
    enum FileField {
        Nodes,
    }

    impl<'de> DeserializeSeed<'de> for FileSeed<'_> {
        type Value = Vec<NodeSpec>;
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Vec<NodeSpec>, D::Error> {
            d.deserialize_map(self)
        }
    }

    impl<'de> Visitor<'de> for FileSeed<'_> {
        type Value = Vec<NodeSpec>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str(r#"a graph file, {"nodes": [...]}"#)
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Vec<NodeSpec>, A::Error> {
            let mut nodes = None;
            while let Some(FileField::Nodes) = map.next_key()? {
                if nodes.is_some() {
                    return Err(de::Error::duplicate_field("nodes"));
                }
                nodes = Some(map.next_value_seed(NodesSeed { meter: self.meter, graph: self.graph })?);
            }
            nodes.ok_or_else(|| de::Error::missing_field("nodes"))
        }
    }

    struct NodesSeed<'m> {
        meter: &'m Meter,
        graph: &'m GroupId,
    }

    impl<'de> DeserializeSeed<'de> for NodesSeed<'_> {
        type Value = Vec<NodeSpec>;
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Vec<NodeSpec>, D::Error> {
            d.deserialize_seq(self)
        }
    }

    impl<'de> Visitor<'de> for NodesSeed<'_> {
        type Value = Vec<NodeSpec>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a list of nodes")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<NodeSpec>, A::Error> {
            let mut nodes = Vec::new();
            while let Some(node) = seq.next_element_seed(NodeSeed { meter: self.meter, graph: self.graph })? {
                if nodes.len() == MAX_NODES {
                    return Err(de::Error::custom(format_args!(
                        "graph {:?} has more than the limit of {MAX_NODES} nodes",
                        self.graph.as_str()
                    )));
                }
                self.meter.push(&mut nodes, node)?;
            }
            Ok(nodes)
        }
    }

    #[derive(Deserialize)]
    #[serde(field_identifier, rename_all = "lowercase")]
    enum NodeField {
        Name,
        Type,
        Id,
        Payload,
        When,
        Parents,
    }

    struct NodeSeed<'m> {
        meter: &'m Meter,
        graph: &'m GroupId,
    }

    impl<'de> DeserializeSeed<'de> for NodeSeed<'_> {
        type Value = NodeSpec;
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<NodeSpec, D::Error> {
            d.deserialize_map(self)
        }
    }

    impl<'de> Visitor<'de> for NodeSeed<'_> {
        type Value = NodeSpec;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str(r#"a node, {"name", "type", "id", "payload", "when", "parents"}"#)
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<NodeSpec, A::Error> {
            let meter = self.meter;
            let (mut name, mut task_type, mut id, mut payload, mut when, mut parents) =
                (None, None, None, None, None, None);
            fn once<T, E: de::Error>(slot: &mut Option<T>, field: &'static str, value: T) -> Result<(), E> {
                match slot.replace(value) {
                    Some(_) => Err(E::duplicate_field(field)),
                    None => Ok(()),
                }
            }
            while let Some(field) = map.next_key()? {
                match field {
                    NodeField::Name => once(&mut name, "name", map.next_value_seed(Text(meter))?)?,
                    NodeField::Type => once(&mut task_type, "type", map.next_value_seed(Text(meter))?)?,
                    NodeField::Id => once(&mut id, "id", map.next_value_seed(MaybeText(meter))?)?,
                    NodeField::Payload => {
                        let raw: &'de RawValue = map.next_value()?;
                        once(&mut payload, "payload", payload_text(meter, raw)?)?
                    }
                    NodeField::When => once(&mut when, "when", map.next_value_seed(MaybeText(meter))?)?,
                    NodeField::Parents => once(&mut parents, "parents", map.next_value_seed(Parents(meter))?)?,
                }
            }
            let name: String = name.ok_or_else(|| de::Error::missing_field("name"))?;
            let task_type: String = task_type.ok_or_else(|| de::Error::missing_field("type"))?;
            let task_type =
                TaskType::try_from(task_type).map_err(|e| de::Error::custom(format_args!("node {name:?}: {e}")))?;
            let when = match when.flatten() {
                None => FireWhen::AllEnded,
                Some(w) => w.parse::<FireWhen>().map_err(|e| de::Error::custom(format_args!("node {name:?}: {e}")))?,
            };
            let id = match id.flatten() {
                Some(id) => id,
                None => meter.string(&format!("{}/{name}", self.graph))?,
            };
            Ok(NodeSpec {
                name,
                task_type,
                id,
                payload: payload.unwrap_or_default(),
                when,
                parents: parents.unwrap_or_default(),
            })
        }
    }

    /// A node's payload: a string as it is, any other JSON value as its compact text.
    fn payload_text<E: de::Error>(meter: &Meter, raw: &RawValue) -> Result<String, E> {
        let raw = raw.get();
        if raw == "null" {
            return Ok(String::new());
        }
        if !raw.starts_with('"') {
            meter.charge(raw.len())?;
            return Ok(compact(raw));
        }
        let mut de = serde_json::Deserializer::from_str(raw);
        // An escaped string is built in the deserializer's scratch buffer first.
        if raw.contains('\\') {
            meter.charge(raw.len())?;
        }
        Text(meter).deserialize(&mut de).map_err(E::custom)
    }

    /// Valid JSON text without the whitespace between its tokens: a payload
    /// as the other clients send it, its keys in the order written.
    fn compact(json: &str) -> String {
        let mut out = String::with_capacity(json.len());
        let (mut in_string, mut escaped) = (false, false);
        for c in json.chars() {
            if in_string {
                (in_string, escaped) = (escaped || c != '"', !escaped && c == '\\');
            } else if c == '"' {
                in_string = true;
            } else if matches!(c, ' ' | '\n' | '\r' | '\t') {
                continue;
            }
            out.push(c);
        }
        out
    }

    /// A string, counted.
    struct Text<'m>(&'m Meter);

    impl<'de> DeserializeSeed<'de> for Text<'_> {
        type Value = String;
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<String, D::Error> {
            d.deserialize_str(self)
        }
    }

    impl Visitor<'_> for Text<'_> {
        type Value = String;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a string")
        }
        fn visit_str<E: de::Error>(self, text: &str) -> Result<String, E> {
            self.0.string(text)
        }
    }

    /// A string or null (its default), counted.
    struct MaybeText<'m>(&'m Meter);

    impl<'de> DeserializeSeed<'de> for MaybeText<'_> {
        type Value = Option<String>;
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Option<String>, D::Error> {
            d.deserialize_option(self)
        }
    }

    impl<'de> Visitor<'de> for MaybeText<'_> {
        type Value = Option<String>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a string or null")
        }
        fn visit_none<E: de::Error>(self) -> Result<Option<String>, E> {
            Ok(None)
        }
        fn visit_unit<E: de::Error>(self) -> Result<Option<String>, E> {
            Ok(None)
        }
        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Option<String>, D::Error> {
            Text(self.0).deserialize(d).map(Some)
        }
    }

    /// A node's parents, counted against [`MAX_EDGES`] over the whole graph.
    struct Parents<'m>(&'m Meter);

    impl<'de> DeserializeSeed<'de> for Parents<'_> {
        type Value = Vec<String>;
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Vec<String>, D::Error> {
            d.deserialize_seq(self)
        }
    }

    impl<'de> Visitor<'de> for Parents<'_> {
        type Value = Vec<String>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a list of node names")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<String>, A::Error> {
            let mut parents = Vec::new();
            while let Some(parent) = seq.next_element_seed(Text(self.0))? {
                let edges = self.0.edges.get() + 1;
                if edges > MAX_EDGES {
                    return Err(de::Error::custom(format_args!(
                        "the graph has more than the limit of {MAX_EDGES} edges"
                    )));
                }
                self.0.edges.set(edges);
                self.0.push(&mut parents, parent)?;
            }
            Ok(parents)
        }
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
