//! Workflow graphs in Redis: declare one whole, deliver its nodes' schedules and ends, and show it.
//!
//! A graph lives in its home type's slot (`P:{C}:graph:<G>`, `P:{C}:graph-nodes:<G>`):
//! every node's state and how many parents it still waits for. Declaring
//! (`graph_open.lua`) checks the whole graph before writing any of it, then
//! schedules the roots through C's outbox; a node's end comes back through
//! its own type's outbox as a report, like a group child's, and
//! `graph_reports.lua` schedules the children it releases (again through C's
//! outbox) or skips those whose rule can no longer be met. So every script
//! touches one slot, and every crossing is an outbox entry delivered once.

use anyhow::{Context, Result, anyhow, bail};
use serde::{Deserialize, Serialize};

use crate::group::GroupId;
use crate::task::FollowUp;
use crate::task_type::TaskType;
use crate::{BATCH, Store};

/// How the outbox entry id of a node's schedule ends (graph_open.lua, graph_reports.lua).
pub(super) const NODE: &[u8] = b":node";
/// How the outbox entry id of a graph a run declared ends (settle.lua).
pub(super) const GRAPH: &[u8] = b":graph";

pub use crate::graph::{MAX_EDGES, MAX_NODES, NodeSpec};

/// What declaring a graph wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Declared {
    pub nodes: u64,
    pub edges: u64,
    /// Nodes without parents, scheduled at once.
    pub roots: u64,
}

/// Why a graph was refused (`HGGRAPH`; nothing was written): the text names the culprit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct GraphRefusal(pub String);

impl GraphRefusal {
    /// The refusal that error `e` carries, if it is one.
    pub fn of(e: &anyhow::Error) -> Option<GraphRefusal> {
        if let Some(own) = e.chain().find_map(|c| c.downcast_ref::<GraphRefusal>()) {
            return Some(own.clone());
        }
        let redis = e.chain().find_map(|c| c.downcast_ref::<redis::RedisError>())?;
        (redis.code() == Some("HGGRAPH")).then(|| GraphRefusal(redis.detail().unwrap_or_default().to_owned()))
    }
}

/// What cancelling a graph did ([`Store::graph_cancel`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct GraphCancelEffect {
    /// The graph was done already: nothing changed.
    pub was_done: bool,
    /// Waiting nodes skipped, with the reason "graph cancelled".
    pub skipped: u64,
    /// Scheduled nodes whose tasks were removed before they ran (they end as cancelled).
    pub removed: u64,
    /// Scheduled nodes running now: their hosts were asked to stop them (they end as cancelled, or as they ended first).
    pub stopping: u64,
    /// Scheduled nodes that had ended already: they count as they ended.
    pub ended: u64,
}

/// A node as `hourglass graph show` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeView {
    pub name: String,
    #[serde(rename = "type")]
    pub task_type: String,
    pub id: String,
    pub when: String,
    /// waiting, scheduled, succeeded, dead, cancelled or skipped.
    pub state: String,
    /// Why it was skipped (the parent that ended without success).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub parents: Vec<String>,
    /// Parents it still waits for.
    pub waiting_for: u64,
}

/// A graph as `hourglass graph show` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GraphView {
    pub home_type: String,
    pub id: String,
    /// running or done.
    pub state: String,
    pub edges: u64,
    /// Nodes by state.
    pub counts: std::collections::BTreeMap<String, u64>,
    pub opened_ms: Option<i64>,
    pub completed_ms: Option<i64>,
    /// When it was cancelled (`hourglass graph cancel`), if it was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cancelled_ms: Option<i64>,
    /// Every node, in the order declared.
    pub nodes: Vec<NodeView>,
}

/// A node as the `graph-nodes` hash holds it (graph_open.lua).
#[derive(Deserialize)]
struct StoredNode {
    name: String,
    #[serde(rename = "type")]
    task_type: String,
    id: String,
    when: String,
    state: String,
    #[serde(default)]
    reason: Option<String>,
    // cjson writes an empty list as `{}`.
    #[serde(default, deserialize_with = "indexes")]
    parents: Vec<usize>,
    left: i64,
}

fn indexes<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<usize>, D::Error> {
    Ok(match serde_json::Value::deserialize(d)? {
        serde_json::Value::Array(items) => items.iter().filter_map(|v| v.as_u64()).map(|v| v as usize).collect(),
        _ => Vec::new(),
    })
}

/// A node's schedule, as its outbox entry holds it: `<len>\n<mark>` then the follow-up.
pub(super) fn decode_node(data: &[u8]) -> Result<(Vec<u8>, FollowUp)> {
    let nl = data.iter().position(|&b| b == b'\n').ok_or_else(|| anyhow!("graph node entry is truncated"))?;
    let len: usize = std::str::from_utf8(&data[..nl])?.parse().context("bad length in graph node entry")?;
    let rest = &data[nl + 1..];
    if rest.len() < len {
        bail!("graph node entry is truncated");
    }
    let (mark, followup) = rest.split_at(len);
    // Create-only: a task already waiting or dead under the node's id is not replaced.
    let f = crate::decode_followup(b":create", followup)?;
    Ok((mark.to_vec(), f))
}

impl Store {
    /// graph_open.lua: declares graph `id` in `home`'s slot, whole or not at all.
    /// A refusal (a cycle, an unknown parent, a name or task used twice, the
    /// id in use, past the limits) is a [`GraphRefusal`] in the error chain.
    pub async fn graph_open(&self, home: &TaskType, id: &GroupId, nodes: &[NodeSpec]) -> Result<Declared> {
        let declared = self.graph_open_once(home, id, nodes, None).await?;
        declared.ok_or_else(|| anyhow!("graph {home}/{id}: declared before"))
    }

    /// [`Store::graph_open`], once per `marker` when given: `None` when the
    /// marker says it ran before.
    async fn graph_open_once(
        &self,
        home: &TaskType,
        id: &GroupId,
        nodes: &[NodeSpec],
        marker: Option<&[u8]>,
    ) -> Result<Option<Declared>> {
        let k = self.keys(home);
        let gk = k.graph(id);
        let spec = serde_json::to_string(nodes)?;
        let mut conn = self.conn.clone();
        let mut inv = self.scripts.graph_open.prepare_invoke();
        inv.key(&gk.graph).key(&gk.nodes).key(&k.graphs).key(&k.outbox).key(&k.seq).key(&k.stats);
        if let Some(m) = marker {
            inv.key(m);
        }
        let reply: Vec<i64> = inv
            .arg(id.as_str())
            .arg(home.as_str())
            .arg(spec)
            .arg(MAX_NODES)
            .arg(MAX_EDGES)
            .invoke_async(&mut conn)
            .await
            .with_context(|| format!("graph {home}/{id}"))?;
        match reply.as_slice() {
            &[nodes, edges, roots] => {
                Ok(Some(Declared { nodes: nodes as u64, edges: edges as u64, roots: roots as u64 }))
            }
            [] => Ok(None),
            _ => bail!("graph {home}/{id}: unexpected reply {reply:?}"),
        }
    }

    /// Declares graph `id` of `home` as a client does, whole or not at all:
    /// refused (a [`GraphRefusal`] in the error chain, nothing written) when
    /// the graph id was used or a node's task is in use ([`Store::graph_ids_in_use`]),
    /// or by graph_open.lua; then schedules the roots at once rather than at
    /// a host's next pass (if that fails, a host serving `home` does it).
    pub async fn graph_submit(&self, home: &TaskType, id: &GroupId, nodes: &[NodeSpec]) -> Result<Declared> {
        let gk = self.keys(home).graph(id);
        let mut conn = self.conn.clone();
        let state: Option<String> = redis::cmd("HGET")
            .arg(&gk.graph)
            .arg("state")
            .query_async(&mut conn)
            .await
            .with_context(|| format!("cannot read graph {home}/{id}"))?;
        if let Some(state) = state {
            let why = format!("graph {home}/{id} exists ({state}): graph ids are used once");
            return Err(anyhow::Error::new(GraphRefusal(why)));
        }
        if let Some((node, why)) = self.graph_ids_in_use(nodes).await?.into_iter().next() {
            return Err(anyhow::Error::new(GraphRefusal(format!("graph {home}/{id}: node {node:?}: {why}"))));
        }
        let declared = self.graph_open(home, id, nodes).await?;
        if let Err(e) = self.flush_graph_nodes(home, &mut Default::default()).await {
            tracing::warn!(task_type = %home, "graph {id}: the roots wait for a host serving {home}: {e:#}");
        }
        Ok(declared)
    }

    /// Declares the graph a run asked for (outbox entry `entry_id`, its JSON
    /// [`crate::task::GraphWork`]), exactly once: an entry delivered before is
    /// found by its marker in the home type's slot, which graph_open.lua sets
    /// with the graph. A refusal (the graph id or a node's task in use) is
    /// the run's mistake: recorded in `flushed`, and the entry dropped.
    /// Returns the home type when the graph was declared now.
    pub(super) async fn deliver_graph_work(
        &self,
        entry_id: &[u8],
        data: &[u8],
        flushed: &mut crate::OutboxFlush,
    ) -> Result<Option<TaskType>, super::groups::GroupDelivery> {
        use super::groups::GroupDelivery;
        let work: crate::task::GraphWork =
            serde_json::from_slice(data).map_err(|e| GroupDelivery::Bad(anyhow!("graph entry is not a graph: {e}")))?;
        let (home, id) = (&work.home, &work.id);
        let marker = self.keys(home).delivered(entry_id);
        let classified = |e: anyhow::Error| match crate::classify(&e) {
            crate::Trouble::Outage => GroupDelivery::Outage(e),
            _ => GroupDelivery::Waits(home.clone(), e),
        };
        let delivered =
            self.marker_set(&marker).await.map_err(|e| classified(e.context(format!("graph {home}/{id}"))))?;
        if delivered {
            return Ok(None);
        }
        let in_use = self.graph_ids_in_use(&work.nodes).await.map_err(classified)?;
        let why = match in_use.into_iter().next() {
            Some((node, why)) => format!("node {node:?}: {why}"),
            None => match self.graph_open_once(home, id, &work.nodes, Some(marker.as_slice())).await {
                Ok(Some(_)) => {
                    flushed.graphs_declared.push((home.clone(), id.clone()));
                    return Ok(Some(home.clone()));
                }
                Ok(None) => return Ok(None),
                Err(e) => GraphRefusal::of(&e).ok_or_else(|| classified(e))?.0,
            },
        };
        // Another host delivering the same entry may have declared it (and scheduled its roots) meanwhile.
        let delivered =
            self.marker_set(&marker).await.map_err(|e| classified(e.context(format!("graph {home}/{id}"))))?;
        if !delivered {
            flushed.graphs_refused.push((home.clone(), id.clone(), why));
        }
        Ok(None)
    }

    /// Whether outbox marker `marker` is set: its entry was delivered before.
    async fn marker_set(&self, marker: &[u8]) -> Result<bool> {
        let mut conn = self.conn.clone();
        Ok(redis::cmd("EXISTS").arg(marker).query_async(&mut conn).await?)
    }

    /// Nodes whose task is already in use: waiting, dead-lettered, or a group's
    /// or graph's (a node is create-only, so such a node would not run). Read
    /// before declaring, to refuse the graph whole; an id taken between this
    /// and the node's turn makes the node end as cancelled.
    pub async fn graph_ids_in_use(&self, nodes: &[NodeSpec]) -> Result<Vec<(String, String)>> {
        let mut in_use = Vec::new();
        let shard = |n: &NodeSpec| self.shard_for(&n.task_type, n.id.as_bytes());
        let mut sorted: Vec<&NodeSpec> = nodes.iter().collect();
        sorted.sort_by(|a, b| shard(a).as_str().cmp(shard(b).as_str()));
        for run in sorted.chunk_by(|a, b| shard(a) == shard(b)) {
            for batch in run.chunks(BATCH) {
                let t = shard(batch[0]);
                let k = self.keys(&t);
                let mut pipe = redis::pipe();
                for n in batch {
                    pipe.zscore(&k.due, &n.id).zscore(&k.dead, &n.id).hexists(&k.member, &n.id);
                }
                let mut conn = self.conn.clone();
                let answers: Vec<redis::Value> =
                    pipe.query_async(&mut conn).await.with_context(|| format!("cannot look up {t} tasks"))?;
                for (n, a) in batch.iter().zip(answers.chunks(3)) {
                    let set = |v: &redis::Value| !matches!(v, redis::Value::Nil | redis::Value::Int(0));
                    let why = match a {
                        [due, _, _] if set(due) => "waiting",
                        [_, dead, _] if set(dead) => "dead-lettered",
                        [_, _, member] if set(member) => "a workflow group's or graph's already",
                        _ => continue,
                    };
                    in_use.push((n.name.clone(), format!("task {}/{} is {why}", n.task_type, n.id)));
                }
            }
        }
        Ok(in_use)
    }

    /// Cancels graph `id` of `home`: graph_cancel.lua skips every waiting
    /// node in one step (so none is scheduled afterwards), then the nodes
    /// on their way in the outbox are delivered, and each scheduled node's
    /// task is cancelled like any task (removed if waiting, stopped by its
    /// host if running). Their ends come back as usual, and the graph is
    /// done with the last. `None`: no such graph.
    pub async fn graph_cancel(&self, home: &TaskType, id: &GroupId) -> Result<Option<GraphCancelEffect>> {
        let k = self.keys(home);
        let gk = k.graph(id);
        let mut conn = self.conn.clone();
        let reply: Result<Vec<redis::Value>> = self
            .scripts
            .graph_cancel
            .key(&gk.graph)
            .key(&gk.nodes)
            .key(&k.graphs)
            .key(&k.stats)
            .arg(id.as_str())
            .arg(home.as_str())
            .invoke_async(&mut conn)
            .await
            .with_context(|| format!("graph {home}/{id}"));
        let reply = match reply {
            Err(e) if GraphRefusal::of(&e).is_some() => return Ok(None),
            r => r?,
        };
        let mut values = reply.into_iter();
        let skipped: i64 = redis::from_redis_value(values.next().unwrap_or(redis::Value::Nil))
            .with_context(|| format!("graph {home}/{id}: unexpected reply to a cancel"))?;
        if skipped < 0 {
            return Ok(Some(GraphCancelEffect { was_done: true, ..Default::default() }));
        }
        let mut done = GraphCancelEffect { skipped: skipped as u64, ..Default::default() };
        let rest: Vec<String> = values.map(redis::from_redis_value).collect::<Result<_, _>>()?;
        // Nodes scheduled but still in the outbox become tasks first, so cancelling finds them.
        self.flush_graph_nodes(home, &mut Default::default()).await?;
        for pair in rest.chunks_exact(2) {
            let t: TaskType = pair[0].parse().with_context(|| format!("graph {home}/{id}: a node's type"))?;
            match self.cancel(&t, pair[1].as_bytes()).await? {
                crate::CancelEffect::Scheduled => done.removed += 1,
                crate::CancelEffect::Running { .. } => done.stopping += 1,
                crate::CancelEffect::Unknown => done.ended += 1,
            }
        }
        Ok(Some(done))
    }

    /// The graphs of home type `home` not done yet, oldest first (at most `limit`): id and when opened (ms).
    pub async fn graphs_running(&self, home: &TaskType, limit: usize) -> Result<Vec<(String, i64)>> {
        let mut conn = self.conn.clone();
        let rows: Vec<(String, f64)> = redis::cmd("ZRANGE")
            .arg(&self.keys(home).graphs)
            .arg(0)
            .arg(limit.saturating_sub(1) as i64)
            .arg("WITHSCORES")
            .query_async(&mut conn)
            .await
            .with_context(|| format!("cannot list the {home} graphs"))?;
        Ok(rows.into_iter().map(|(g, at)| (g, at as i64)).collect())
    }

    /// Graph `id` of `home` as it stands, or `None` if there is none (never
    /// declared, or done more than 7 days ago).
    pub async fn graph_show(&self, home: &TaskType, id: &GroupId) -> Result<Option<GraphView>> {
        let gk = self.keys(home).graph(id);
        let mut conn = self.conn.clone();
        let fields: std::collections::HashMap<String, String> = redis::cmd("HGETALL")
            .arg(&gk.graph)
            .query_async(&mut conn)
            .await
            .with_context(|| format!("cannot read graph {home}/{id}"))?;
        if fields.is_empty() {
            return Ok(None);
        }
        let mut stored: Vec<(usize, StoredNode)> = Vec::new();
        let mut cursor: u64 = 0;
        loop {
            let (next, page): (u64, Vec<(String, String)>) = redis::cmd("HSCAN")
                .arg(&gk.nodes)
                .arg(cursor)
                .arg("COUNT")
                .arg(BATCH)
                .query_async(&mut conn)
                .await
                .with_context(|| format!("cannot read the nodes of graph {home}/{id}"))?;
            for (index, json) in page {
                let at: usize = index.parse().with_context(|| format!("{}: bad node index {index:?}", gk.nodes))?;
                let node: StoredNode = serde_json::from_str(&json)
                    .with_context(|| format!("{}: node {index} is not a graph node", gk.nodes))?;
                stored.push((at, node));
            }
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
        stored.sort_by_key(|(at, _)| *at);
        let names: std::collections::HashMap<usize, String> =
            stored.iter().map(|(at, n)| (*at, n.name.clone())).collect();
        let number = |f: &str| fields.get(f).and_then(|v| v.parse::<i64>().ok());
        let counts = ["waiting", "scheduled", "succeeded", "dead", "cancelled", "skipped"]
            .iter()
            .map(|c| (c.to_string(), number(c).unwrap_or(0).max(0) as u64))
            .collect();
        let nodes = stored
            .into_iter()
            .map(|(_, n)| NodeView {
                parents: n.parents.iter().filter_map(|p| names.get(p).cloned()).collect(),
                waiting_for: if n.state == "waiting" { n.left.max(0) as u64 } else { 0 },
                name: n.name,
                task_type: n.task_type,
                id: n.id,
                when: n.when,
                state: n.state,
                reason: n.reason,
            })
            .collect();
        Ok(Some(GraphView {
            home_type: home.to_string(),
            id: id.to_string(),
            state: fields.get("state").cloned().unwrap_or_default(),
            edges: number("edges").unwrap_or(0).max(0) as u64,
            counts,
            opened_ms: number("opened_ms"),
            completed_ms: number("completed_ms"),
            cancelled_ms: number("cancelled_ms"),
            nodes,
        }))
    }

    /// Delivers nodes' schedules (entries of `home`'s outbox: id, value) into
    /// their types, each once (its entry's marker), marked as its graph's
    /// node: one group_child.lua per shard and [`NODES_PER_CALL`], then one
    /// HDEL of the delivered entries. An id already waiting, dead, or another
    /// group's child is not scheduled: group_child.lua reports the node
    /// cancelled, and the graph goes on without it. Entries whose type's keys
    /// are broken wait in the outbox.
    pub(super) async fn deliver_graph_nodes(
        &self,
        home: &TaskType,
        entries: Vec<(Vec<u8>, Vec<u8>)>,
        flushed: &mut crate::OutboxFlush,
    ) -> Result<()> {
        let mut done: Vec<Vec<u8>> = Vec::new();
        let mut nodes = Vec::new();
        for (entry_id, data) in entries {
            match decode_node(&data) {
                Ok((mark, f)) => nodes.push((self.shard_for(&f.task_type, &f.id), entry_id, mark, f)),
                Err(e) => {
                    // It can never be delivered: logged and dropped, to keep the outbox moving.
                    tracing::error!(task_type = %home, "dropping a bad outbox entry: {e:#}");
                    done.push(entry_id);
                }
            }
        }
        nodes.sort_by(|a, b| a.0.as_str().cmp(b.0.as_str()));
        let mut conn = self.conn.clone();
        for batch in nodes.chunk_by(|a, b| a.0 == b.0).flat_map(|run| run.chunks(NODES_PER_CALL)) {
            let t = &batch[0].0;
            // Each once (its entry's marker), create-only (decode_node).
            let inv = self
                .group_child_call(t, batch.iter().map(|(_, entry_id, mark, f)| (Some(&entry_id[..]), f, mark.clone())));
            let scheduled: Result<Vec<i64>> = inv
                .invoke_async(&mut conn)
                .await
                .with_context(|| format!("cannot schedule {} graph nodes of {t}", batch.len()));
            match scheduled {
                Ok(_) => done.extend(batch.iter().map(|(_, entry_id, _, _)| entry_id.clone())),
                Err(e) if crate::classify(&e) == crate::Trouble::Outage => return Err(e),
                Err(e) => flushed.failed.push((batch[0].3.task_type.clone(), e)),
            }
        }
        for ids in done.chunks(BATCH) {
            let _: i64 = redis::cmd("HDEL")
                .arg(&self.keys(home).outbox)
                .arg(ids)
                .query_async(&mut conn)
                .await
                .with_context(|| format!("cannot clear the {home} outbox"))?;
            flushed.moved += ids.len();
        }
        Ok(())
    }
}

/// Nodes scheduled per script call (all in one shard of one type): group_child.lua, as
/// [`CHILDREN_PER_CALL`](super::groups::CHILDREN_PER_CALL) bounds it.
const NODES_PER_CALL: usize = super::groups::CHILDREN_PER_CALL;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_entry_decodes_its_mark_and_schedule() {
        let mark = "\u{1f}flow\ng-1\n3";
        let entry = format!("{}\n{mark}ship\n1700\n4\no-17{{\"a\":1}}", mark.len());
        let (m, f) = decode_node(entry.as_bytes()).unwrap();
        assert_eq!(m, mark.as_bytes());
        assert_eq!(
            (f.task_type.as_str(), f.id.as_slice(), f.payload.as_slice()),
            ("ship", &b"o-17"[..], &b"{\"a\":1}"[..])
        );
        assert_eq!(f.due_ms, 1700);
        assert!(!f.replace, "a node never replaces a waiting task");
        assert!(decode_node(b"99\nshort").is_err());
    }
}
