//! Reading a type's queues (stats, due-time buckets, the types present) and the dead-letter operations.

use anyhow::{Context, Result, anyhow, bail};
use redis::{Script, Value};
use serde::Serialize;

use crate::conn::CONNECT_TIMEOUT;
use crate::reply::{array, bytes, opt_bytes, opt_int, score};
use crate::task_type::TaskType;
use crate::{BATCH, Store};

/// Queue sizes and counters of a type.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct TypeStats {
    /// Due now or overdue, not yet claimed.
    pub due_now: u64,
    /// Due in the future.
    pub scheduled_later: u64,
    /// Leased (running or about to be reaped).
    pub in_flight: u64,
    /// In the dead-letter set now.
    pub dead: u64,
    /// Counter: acks.
    pub succeeded: u64,
    /// Counter: failed attempts.
    pub failed: u64,
    /// Counter: retries scheduled.
    pub retried: u64,
    /// Counter: tasks ever dead-lettered.
    pub dead_total: u64,
    /// Counter: running tasks stopped by `hourglass cancel`.
    pub cancelled: u64,
    /// How long the oldest task due now has waited, in ms (0 when none is due).
    pub oldest_due_age_ms: u64,
    /// Workflow groups with callbacks of this type that are not done yet.
    pub groups_open: u64,
    /// Counter: those groups completed (their callback scheduled, skipped or kept).
    pub groups_completed: u64,
    /// Counter: of those, completed without their callback (`--when success` and a child failed).
    pub groups_failed: u64,
    /// Workflow graphs of this home type that are not done yet.
    pub graphs_running: u64,
    /// Counter: graphs declared with this home type.
    pub graphs_opened: u64,
    /// Counter: those graphs done (every node ended or skipped).
    pub graphs_completed: u64,
    /// Counter: of those, done with a node that did not succeed (dead, cancelled or skipped).
    pub graphs_failed: u64,
    /// What is wrong with the type's keys (a key of the wrong type, a counter
    /// that is not a number), with the fix; `None` when they are sound.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fault: Option<String>,
    /// Whether the type is paused now.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub paused: Option<Paused>,
}

impl TypeStats {
    /// Adds the stats of another shard of the same type.
    fn add(&mut self, shard: &TaskType, other: TypeStats) {
        for (sum, n) in [
            (&mut self.due_now, other.due_now),
            (&mut self.scheduled_later, other.scheduled_later),
            (&mut self.in_flight, other.in_flight),
            (&mut self.dead, other.dead),
            (&mut self.succeeded, other.succeeded),
            (&mut self.failed, other.failed),
            (&mut self.retried, other.retried),
            (&mut self.dead_total, other.dead_total),
            (&mut self.cancelled, other.cancelled),
            (&mut self.groups_open, other.groups_open),
            (&mut self.groups_completed, other.groups_completed),
            (&mut self.groups_failed, other.groups_failed),
            (&mut self.graphs_running, other.graphs_running),
            (&mut self.graphs_opened, other.graphs_opened),
            (&mut self.graphs_completed, other.graphs_completed),
            (&mut self.graphs_failed, other.graphs_failed),
        ] {
            *sum += n;
        }
        self.oldest_due_age_ms = self.oldest_due_age_ms.max(other.oldest_due_age_ms);
        if self.fault.is_none() {
            self.fault = other.fault.map(|f| format!("shard {shard}: {f}"));
        }
        self.paused = self.paused.or(other.paused);
    }
}

/// A paused type: until resumed, or for this many more ms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Paused {
    /// Until `hourglass resume`.
    UntilResumed,
    /// The pause ends by itself in this many ms.
    For(i64),
}

/// A dead-lettered task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeadTask {
    /// Task id; serialized as (lossy) UTF-8 text, see `id_hex` for the exact bytes.
    #[serde(serialize_with = "serialize_lossy")]
    pub id: Vec<u8>,
    /// The id as hex, exact for binary ids.
    pub id_hex: String,
    /// When it died, ms since the epoch.
    pub died_ms: i64,
    /// The last error.
    pub error: String,
    /// Attempts it had.
    pub attempts: u32,
    /// Size of its payload in bytes (0 when none).
    pub payload_len: u64,
}

pub(super) fn serialize_lossy<S: serde::Serializer>(id: &[u8], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&String::from_utf8_lossy(id))
}

impl Store {
    /// Queue sizes and counters of type `t` (summed over its shards), and what is wrong with its keys, if anything.
    pub async fn stats(&self, t: &TaskType) -> Result<TypeStats> {
        let mut shards = self.shards_of(t).into_iter();
        let mut stats = self.stats_in(&shards.next().unwrap_or_else(|| t.clone())).await?;
        for shard in shards {
            stats.add(&shard, self.stats_in(&shard).await?);
        }
        Ok(stats)
    }

    async fn stats_in(&self, t: &TaskType) -> Result<TypeStats> {
        let k = self.keys(t);
        let mut conn = self.conn.clone();
        let v: Vec<Value> = self
            .scripts
            .stats
            .key(&k.due)
            .key(&k.leases)
            .key(&k.dead)
            .key(&k.stats)
            .key(&k.payload)
            .key(&k.tokens)
            .key(&k.attempts)
            .key(&k.errors)
            .key(&k.seq)
            .key(&k.outbox)
            .key(&k.events)
            .key(&k.recur)
            .key(&k.throttle)
            .key(&k.paused)
            .key(&k.cancels)
            .key(&k.claims)
            .key(&k.claimed)
            .key(&k.groups)
            .key(&k.member)
            .key(&k.graphs)
            .invoke_async(&mut conn)
            .await
            .with_context(|| format!("cannot read the stats of {t}"))?;
        if v.len() != 19 {
            bail!("unexpected stats reply for {t}");
        }
        let mut v = v.into_iter();
        let n = |v: &mut std::vec::IntoIter<Value>| -> Result<u64> {
            Ok(opt_int(v.next().unwrap_or(Value::Nil))?.unwrap_or(0).max(0) as u64)
        };
        let (due_now, due_total, in_flight, dead) = (n(&mut v)?, n(&mut v)?, n(&mut v)?, n(&mut v)?);
        let (succeeded, failed, retried, dead_total) = (n(&mut v)?, n(&mut v)?, n(&mut v)?, n(&mut v)?);
        let fault = match v.next() {
            Some(Value::Nil | Value::Boolean(false)) | None => None,
            Some(Value::Int(0)) => None,
            Some(other) => opt_bytes(other)?.map(|b| String::from_utf8_lossy(&b).into_owned()),
        };
        let paused = match v.next() {
            Some(Value::Int(0)) => Some(Paused::UntilResumed),
            Some(Value::Int(ms)) if ms > 0 => Some(Paused::For(ms)),
            _ => None,
        };
        let cancelled = n(&mut v)?;
        let oldest_due_age_ms = n(&mut v)?;
        let (groups_open, groups_completed, groups_failed) = (n(&mut v)?, n(&mut v)?, n(&mut v)?);
        let (graphs_running, graphs_opened) = (n(&mut v)?, n(&mut v)?);
        let (graphs_completed, graphs_failed) = (n(&mut v)?, n(&mut v)?);
        Ok(TypeStats {
            due_now,
            scheduled_later: due_total.saturating_sub(due_now),
            in_flight,
            dead,
            succeeded,
            failed,
            retried,
            dead_total,
            oldest_due_age_ms,
            groups_open,
            groups_completed,
            groups_failed,
            graphs_running,
            graphs_opened,
            graphs_completed,
            graphs_failed,
            fault,
            paused,
            cancelled,
        })
    }

    /// How many tasks of `t` fall due in each of `buckets` consecutive windows of
    /// `width_ms` starting at `from_ms` (one ZCOUNT per window, pipelined).
    pub async fn due_buckets(&self, t: &TaskType, from_ms: i64, width_ms: i64, buckets: usize) -> Result<Vec<u64>> {
        let mut total = vec![0u64; buckets];
        for shard in self.shards_of(t) {
            let k = self.keys(&shard);
            let mut pipe = redis::pipe();
            for b in 0..buckets as i64 {
                let lo = from_ms + b * width_ms;
                pipe.cmd("ZCOUNT").arg(&k.due).arg(lo).arg(format!("({}", lo + width_ms));
            }
            let mut conn = self.conn.clone();
            let counts: Vec<u64> =
                pipe.query_async(&mut conn).await.with_context(|| format!("cannot count due {shard} tasks"))?;
            total.iter_mut().zip(counts).for_each(|(sum, n)| *sum += n);
        }
        Ok(total)
    }

    /// Every task type that has keys under this prefix (in any of its shards), sorted.
    pub async fn known_types(&self) -> Result<Vec<TaskType>> {
        let mut types: Vec<TaskType> = self.scan_queues("*").await?.iter().map(TaskType::base).collect();
        types.sort();
        types.dedup();
        Ok(types)
    }

    /// Every shard (`T#i`, i > 0) that has keys under this prefix, sorted.
    pub async fn known_shards(&self) -> Result<Vec<TaskType>> {
        self.scan_queues("*#*").await
    }

    /// Every type or shard whose hash tag matches `tags` (a glob) and that has
    /// keys under this prefix, sorted. SCAN sees the keys of one node only, so
    /// in a cluster every master is scanned.
    async fn scan_queues(&self, tags: &str) -> Result<Vec<TaskType>> {
        let pattern = format!("{}:{{{tags}}}:*", glob_escape(&self.prefix));
        let head = format!("{}:{{", self.prefix);
        let mut types = Vec::new();
        if self.target.is_cluster() {
            for node in self.cluster_nodes().await?.into_iter().filter(|n| n.master) {
                let client = self.target.node_client(&node.host, node.port)?;
                let mut conn = tokio::time::timeout(CONNECT_TIMEOUT, client.get_multiplexed_async_connection())
                    .await
                    .map_err(|_| anyhow!("no answer within {}s", CONNECT_TIMEOUT.as_secs()))
                    .and_then(|r| r.map_err(|e| anyhow!("{}", self.target.scrub(&e.to_string()))))
                    .with_context(|| format!("cannot list task types on cluster node {}:{}", node.host, node.port))?;
                scan_types(&mut conn, &pattern, &head, &mut types).await?;
            }
        } else {
            let mut conn = self.conn.clone();
            scan_types(&mut conn, &pattern, &head, &mut types).await?;
        }
        types.sort();
        types.dedup();
        Ok(types)
    }

    /// Whether `t` (a type or one shard) has tasks scheduled or leased, or follow-ups to deliver.
    pub async fn has_work(&self, t: &TaskType) -> Result<bool> {
        let k = self.keys(t);
        let mut pipe = redis::pipe();
        pipe.zcard(&k.due).zcard(&k.claims).hlen(&k.outbox);
        let mut conn = self.conn.clone();
        let counts: Vec<u64> = pipe.query_async(&mut conn).await.with_context(|| format!("cannot count {t} tasks"))?;
        Ok(counts.iter().any(|&n| n > 0))
    }

    /// Up to `limit` dead-lettered tasks of type `t` (over its shards), oldest death first.
    pub async fn dead_list(&self, t: &TaskType, limit: usize) -> Result<Vec<DeadTask>> {
        let mut all = Vec::new();
        for shard in self.shards_of(t) {
            all.extend(self.dead_list_in(&shard, limit).await?);
        }
        all.sort_by_key(|d| d.died_ms);
        all.truncate(limit);
        Ok(all)
    }

    async fn dead_list_in(&self, t: &TaskType, limit: usize) -> Result<Vec<DeadTask>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let k = self.keys(t);
        let mut conn = self.conn.clone();
        let value: Value = self
            .scripts
            .dead_list
            .key(&k.dead)
            .key(&k.errors)
            .key(&k.attempts)
            .key(&k.payload)
            .arg(limit)
            .invoke_async(&mut conn)
            .await
            .with_context(|| format!("cannot list dead {t} tasks"))?;
        let flat = array(value)?;
        if flat.len() % 5 != 0 {
            bail!("unexpected dead list reply for {t}");
        }
        let mut out = Vec::with_capacity(flat.len() / 5);
        let mut it = flat.into_iter();
        while let (Some(id), Some(died), Some(error), Some(attempts), Some(len)) =
            (it.next(), it.next(), it.next(), it.next(), it.next())
        {
            let id = bytes(id)?;
            out.push(DeadTask {
                id_hex: hex::encode(&id),
                id,
                died_ms: score(died)?.unwrap_or(0),
                error: opt_bytes(error)?.map(|e| String::from_utf8_lossy(&e).into_owned()).unwrap_or_default(),
                attempts: opt_int(attempts)?.unwrap_or(0).clamp(0, u32::MAX as i64) as u32,
                payload_len: opt_int(len)?.unwrap_or(0).max(0) as u64,
            });
        }
        Ok(out)
    }

    /// Requeues dead tasks (all when `ids` is None; of every shard), due now with attempts reset; returns how many.
    pub async fn dead_requeue(&self, t: &TaskType, ids: Option<&[Vec<u8>]>) -> Result<u64> {
        let mut total = 0;
        for shard in self.shards_of(t) {
            let k = self.keys(&shard);
            let keys = [&k.dead, &k.attempts, &k.errors, &k.due];
            total += self
                .dead_op(&self.scripts.dead_requeue, &keys, ids)
                .await
                .with_context(|| format!("cannot requeue dead {shard} tasks"))?;
        }
        Ok(total)
    }

    /// Deletes dead tasks for good (all when `ids` is None; of every shard); returns how many.
    pub async fn dead_purge(&self, t: &TaskType, ids: Option<&[Vec<u8>]>) -> Result<u64> {
        let mut total = 0;
        for shard in self.shards_of(t) {
            let k = self.keys(&shard);
            let keys = [&k.dead, &k.attempts, &k.errors, &k.due, &k.payload];
            total += self
                .dead_op(&self.scripts.dead_purge, &keys, ids)
                .await
                .with_context(|| format!("cannot purge dead {shard} tasks"))?;
        }
        Ok(total)
    }

    async fn dead_op(&self, script: &Script, keys: &[&String], ids: Option<&[Vec<u8>]>) -> Result<u64> {
        let mut conn = self.conn.clone();
        let mut total = 0;
        match ids {
            Some(ids) => {
                for chunk in ids.chunks(BATCH) {
                    let mut inv = script.prepare_invoke();
                    for key in keys {
                        inv.key(*key);
                    }
                    inv.arg("ids");
                    for id in chunk {
                        inv.arg(id);
                    }
                    let n: u64 = inv.invoke_async(&mut conn).await?;
                    total += n;
                }
            }
            None => loop {
                // Bounded per call so one huge dead set never blocks Redis for long.
                let mut inv = script.prepare_invoke();
                for key in keys {
                    inv.key(*key);
                }
                let n: u64 = inv.arg("all").arg(BATCH).invoke_async(&mut conn).await?;
                total += n;
                if n < BATCH as u64 {
                    break;
                }
            },
        }
        Ok(total)
    }
}

/// SCANs one node for keys matching `pattern` and collects the task types in their hash tags.
async fn scan_types(
    conn: &mut impl redis::aio::ConnectionLike,
    pattern: &str,
    head: &str,
    types: &mut Vec<TaskType>,
) -> Result<()> {
    let mut cursor: u64 = 0;
    loop {
        let (next, keys): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(BATCH)
            .query_async(conn)
            .await
            .context("cannot list task types (SCAN)")?;
        for key in keys {
            let Some(rest) = key.strip_prefix(head.as_bytes()) else {
                continue;
            };
            let Some(end) = rest.iter().position(|&b| b == b'}') else {
                continue;
            };
            if rest.get(end + 1) != Some(&b':') {
                continue;
            }
            if let Ok(name) = std::str::from_utf8(&rest[..end])
                && let Ok(t) = TaskType::parse_queue(name)
            {
                types.push(t);
            }
        }
        cursor = next;
        if cursor == 0 {
            return Ok(());
        }
    }
}

fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_characters_are_escaped() {
        assert_eq!(glob_escape("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
    }
}
