//! What a host reads and makes for the runs it serves: the trace parents clients attached, and a type's events stream.

use anyhow::{Context, Result};

use crate::Store;
use crate::task_type::TaskType;

impl Store {
    /// The W3C traceparents clients attached to `ids` of `t` in `P:{T}:trace`
    /// (`None` where there is none), in one HMGET; read only while tracing is on.
    pub async fn trace_parents(&self, t: &TaskType, ids: &[Vec<u8>]) -> Result<Vec<Option<String>>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let k = self.keys(t);
        let mut conn = self.conn.clone();
        let found: Vec<Option<Vec<u8>>> = redis::cmd("HMGET")
            .arg(&k.trace)
            .arg(ids)
            .query_async(&mut conn)
            .await
            .with_context(|| format!("cannot read {}", k.trace))?;
        Ok(found.into_iter().map(|p| p.and_then(|p| String::from_utf8(p).ok())).collect())
    }

    /// Creates the (empty) events stream of type or shard `t` when it is missing, so clients
    /// that wait for a task's end can tell a type without events from one with none yet.
    /// A host calls it for each type with `events = true` as it starts serving it.
    pub async fn open_events(&self, t: &TaskType) -> Result<bool> {
        let k = self.keys(t);
        let mut conn = self.conn.clone();
        let created: i64 = self
            .scripts
            .events_open
            .key(&k.events)
            .invoke_async(&mut conn)
            .await
            .with_context(|| format!("cannot create the events stream of {t}"))?;
        Ok(created == 1)
    }
}
