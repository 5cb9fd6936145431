//! Recurring schedules in Redis: a type's `recur` hash, the global index of types that have one, and the scripts that arm occurrences.

use anyhow::{Context, Result};
use redis::Value;

use crate::Store;
use crate::reply::array;
use crate::task_type::TaskType;

/// One schedule as Redis holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecurState {
    /// Its name (unique within its type).
    pub name: String,
    /// Its definition, as the host that put it wrote it.
    pub definition: String,
    /// The id of its armed occurrence (`name@<ms>`), if any.
    pub armed: Option<String>,
    /// Whether that occurrence is in `due` now (false: handed out, or cancelled).
    pub armed_due: bool,
    /// The occurrence times known after it, ascending.
    pub then: Vec<i64>,
}

impl RecurState {
    /// The time of the armed occurrence, from its id.
    pub fn armed_ms(&self) -> Option<i64> {
        self.armed.as_deref()?.rsplit_once('@')?.1.parse().ok()
    }
}

/// What [`Store::recur_sync`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncOutcome {
    /// It armed an occurrence (the chain had stopped).
    Armed,
    /// It stored the times after the armed occurrence.
    Kept,
    /// The schedule changed since it was read: nothing written.
    Stale,
}

pub(crate) fn join(times: &[i64]) -> String {
    times.iter().map(i64::to_string).collect::<Vec<_>>().join(",")
}

impl Store {
    /// The key of the set of types that have recurring schedules.
    pub fn recurring_key(&self) -> String {
        format!("{}:recurring", self.prefix)
    }

    /// Types that have (or had) recurring schedules.
    pub async fn recurring_types(&self) -> Result<Vec<TaskType>> {
        let mut conn = self.conn.clone();
        let names: Vec<String> = redis::cmd("SMEMBERS")
            .arg(self.recurring_key())
            .query_async(&mut conn)
            .await
            .context("cannot list recurring schedules")?;
        let mut types: Vec<TaskType> = names.iter().filter_map(|n| n.parse().ok()).collect();
        types.sort();
        Ok(types)
    }

    /// Creates or changes schedule `name` of `t` and arms `times[0]`; false when it was already so.
    pub async fn recur_put(
        &self,
        t: &TaskType,
        name: &str,
        definition: &str,
        missed: &str,
        payload: &[u8],
        times: &[i64],
    ) -> Result<bool> {
        let k = self.keys(t);
        let mut conn = self.conn.clone();
        let changed: i64 = self
            .scripts
            .recur_put
            .key(&k.recur)
            .key(&k.due)
            .key(&k.payload)
            .arg(name)
            .arg(definition)
            .arg(missed)
            .arg(payload)
            .arg(join(times))
            .invoke_async(&mut conn)
            .await
            .with_context(|| format!("cannot put the recurring schedule {t}/{name}"))?;
        // The index lives in another slot than the type's keys: written after, read by hosts that sync.
        let _: i64 = redis::cmd("SADD").arg(self.recurring_key()).arg(t.as_str()).query_async(&mut conn).await?;
        Ok(changed == 1)
    }

    /// Deletes schedule `name` of `t` (its armed occurrence too); false when there was none.
    pub async fn recur_remove(&self, t: &TaskType, name: &str) -> Result<bool> {
        let k = self.keys(t);
        let mut conn = self.conn.clone();
        let removed: i64 = self
            .scripts
            .recur_remove
            .key(&k.recur)
            .key(&k.due)
            .key(&k.payload)
            .arg(name)
            .invoke_async(&mut conn)
            .await
            .with_context(|| format!("cannot remove the recurring schedule {t}/{name}"))?;
        Ok(removed == 1)
    }

    /// Every schedule of `t`, with whether its armed occurrence is due.
    pub async fn recur_list(&self, t: &TaskType) -> Result<Vec<RecurState>> {
        let k = self.keys(t);
        let mut conn = self.conn.clone();
        let flat: Vec<(String, Vec<u8>)> = redis::cmd("HGETALL")
            .arg(&k.recur)
            .query_async(&mut conn)
            .await
            .with_context(|| format!("cannot read {}", k.recur))?;
        let fields: std::collections::HashMap<String, Vec<u8>> = flat.into_iter().collect();
        let text = |key: &str| fields.get(key).map(|v| String::from_utf8_lossy(v).into_owned());
        let mut out = Vec::new();
        for (field, value) in &fields {
            if field.contains(':') {
                continue;
            }
            let armed = text(&format!("{field}:armed")).filter(|a| !a.is_empty());
            let then =
                text(&format!("{field}:then")).unwrap_or_default().split(',').filter_map(|t| t.parse().ok()).collect();
            out.push(RecurState {
                name: field.clone(),
                definition: String::from_utf8_lossy(value).into_owned(),
                armed,
                armed_due: false,
                then,
            });
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        let armed: Vec<&str> = out.iter().map(|s| s.armed.as_deref().unwrap_or("")).collect();
        if !armed.is_empty() {
            let value: Value = redis::cmd("ZMSCORE").arg(&k.due).arg(&armed).query_async(&mut conn).await?;
            for (state, score) in out.iter_mut().zip(array(value)?) {
                state.armed_due = state.armed.is_some() && !matches!(score, Value::Nil);
            }
        }
        Ok(out)
    }
}
