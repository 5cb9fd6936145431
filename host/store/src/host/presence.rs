//! Host presence in Redis: each host's heartbeat in `P:hosts`, and who holds which leases of a type.

use anyhow::{Context, Result, anyhow, bail};
use redis::Value;

use crate::Store;
use crate::task_type::TaskType;

/// Every registered host's last beat, as `hosts/presence.lua` lists them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Presence {
    /// Redis `TIME` when listed, ms.
    pub now_ms: i64,
    /// Host id → `<last_seen_ms> <state> <info json>`.
    pub beats: Vec<(String, String)>,
}

/// The leases of one type one host holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HolderCount {
    /// Its id ("" for leases taken without one).
    pub host: String,
    /// How many.
    pub count: u64,
    /// The first few ids.
    pub ids: Vec<Vec<u8>>,
}

impl Store {
    /// The key of the hosts hash.
    pub fn hosts_key(&self) -> String {
        format!("{}:hosts", self.prefix)
    }

    /// Records a host's beat (`state`: up or stopped) and forgets hosts silent for `forget_after_ms`.
    pub async fn beat(&self, host_id: &str, state: &str, facts: &str, forget_after_ms: u64) -> Result<()> {
        let mut conn = self.conn.clone();
        let _: i64 = self
            .scripts
            .presence
            .key(self.hosts_key())
            .arg("beat")
            .arg(host_id)
            .arg(state)
            .arg(facts)
            .arg(forget_after_ms)
            .invoke_async(&mut conn)
            .await?;
        Ok(())
    }

    /// Every host's last beat.
    pub async fn presence(&self) -> Result<Presence> {
        let mut conn = self.conn.clone();
        let value: Value = self
            .scripts
            .presence
            .key(self.hosts_key())
            .arg("list")
            .invoke_async(&mut conn)
            .await
            .context("cannot list hosts")?;
        let Value::Array(top) = value else { bail!("unexpected hosts reply") };
        let mut top = top.into_iter();
        let now_ms: i64 = redis::from_redis_value(top.next().ok_or_else(|| anyhow!("short hosts reply"))?)?;
        let flat: Vec<Vec<u8>> = redis::from_redis_value(top.next().ok_or_else(|| anyhow!("short hosts reply"))?)?;
        let beats = flat
            .chunks_exact(2)
            .map(|pair| {
                (String::from_utf8_lossy(&pair[0]).into_owned(), String::from_utf8_lossy(&pair[1]).into_owned())
            })
            .collect();
        Ok(Presence { now_ms, beats })
    }

    /// How many leases of `t` each host holds, with up to `most` ids each.
    pub async fn holders(&self, t: &TaskType, most: usize) -> Result<Vec<HolderCount>> {
        let k = self.keys(t);
        let mut conn = self.conn.clone();
        let value: Value = self
            .scripts
            .holders
            .key(&k.tokens)
            .key(&k.claimed)
            .arg(most)
            .invoke_async(&mut conn)
            .await
            .with_context(|| format!("cannot list the holders of {t} leases"))?;
        HolderCount::decode(value)
    }
}

impl HolderCount {
    /// The reply of the `holders` script (see [`holders_source`](crate::holders_source)), per host.
    pub fn decode(value: Value) -> Result<Vec<HolderCount>> {
        let Value::Array(items) = value else { return Ok(Vec::new()) };
        let mut out = Vec::new();
        let mut it = items.into_iter();
        while let (Some(host), Some(count), Some(ids)) = (it.next(), it.next(), it.next()) {
            out.push(HolderCount {
                host: redis::from_redis_value(host)?,
                count: redis::from_redis_value(count)?,
                ids: redis::from_redis_value(ids)?,
            });
        }
        Ok(out)
    }
}
