//! The graph file's parser: serde visitors that count what they allocate.

use std::cell::Cell;
use std::fmt;

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

use super::{MAX_EDGES, MAX_NODES, NodeSpec};
use crate::task_type::TaskType;
use crate::workflow::group::{FireWhen, GroupId};

/// What a parse may allocate, what it holds, and the most it held at once.
pub(super) struct Meter {
    budget: usize,
    used: Cell<usize>,
    peak: Cell<usize>,
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
        Meter { budget, used: Cell::new(0), peak: Cell::new(0), edges: Cell::new(0) }
    }

    /// Bytes the parse holds now.
    pub(super) fn used(&self) -> usize {
        self.used.get()
    }

    /// The most bytes the parse held at once (what would have been, for one over budget).
    pub(super) fn peak(&self) -> usize {
        self.peak.get()
    }

    /// Whether an allocation was refused: the peak counts what it would have made.
    pub(super) fn over(&self) -> bool {
        self.peak.get() > self.budget
    }

    /// Counts an allocation of `bytes` before it is made.
    fn charge<E: de::Error>(&self, bytes: usize) -> Result<(), E> {
        let wanted = self.used.get().saturating_add(allocated(bytes));
        self.peak.set(self.peak.get().max(wanted));
        if wanted > self.budget {
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
                return Err(de::Error::custom(format_args!("the graph has more than the limit of {MAX_EDGES} edges")));
            }
            self.0.edges.set(edges);
            self.0.push(&mut parents, parent)?;
        }
        Ok(parents)
    }
}
