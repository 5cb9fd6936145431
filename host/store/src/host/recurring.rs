//! A host's part of recurring schedules: keeping each one's next times known, and re-arming a chain that stopped.

use anyhow::{Context, Result};
use redis::Value;

use crate::Store;
use crate::app::recurring::{SyncOutcome, join};
use crate::reply::bytes;
use crate::task_type::TaskType;

impl Store {
    /// Stores the times after `seen` (the armed id the host read) and re-arms
    /// the schedule if its chain stopped; see `recur_sync.lua`.
    pub async fn recur_sync(
        &self,
        t: &TaskType,
        name: &str,
        definition: &str,
        seen: Option<&str>,
        times: &[i64],
    ) -> Result<SyncOutcome> {
        let k = self.keys(t);
        let mut conn = self.conn.clone();
        let value: Value = self
            .scripts
            .recur_sync
            .key(&k.recur)
            .key(&k.due)
            .key(&k.payload)
            .arg(name)
            .arg(definition)
            .arg(seen.unwrap_or(""))
            .arg(join(times))
            .invoke_async(&mut conn)
            .await
            .with_context(|| format!("cannot sync the recurring schedule {t}/{name}"))?;
        Ok(match bytes(value)?.as_slice() {
            b"armed" => SyncOutcome::Armed,
            b"kept" => SyncOutcome::Kept,
            _ => SyncOutcome::Stale,
        })
    }
}
