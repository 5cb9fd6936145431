//! The benchmark's own Redis commands: its load (pipelined ZADDs), clean-up, and what the servers did (scripts, CPU).

use anyhow::{Context, Result};
use hourglass::store::Store;

/// What the servers have done so far, summed over every master: for the benchmark's per-task costs.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct ServerWork {
    /// CPU of each master by address, µs: how evenly the work spreads over a cluster.
    pub(crate) cpu_us_by_master: std::collections::BTreeMap<String, f64>,
    /// Time spent in scripts (`EVALSHA`, with the commands they call), from `INFO commandstats`, µs.
    pub(crate) script_us: f64,
    /// Scripts run.
    pub(crate) script_calls: u64,
    /// CPU the servers used (`used_cpu_user` + `used_cpu_sys` of `INFO cpu`), µs.
    pub(crate) cpu_us: f64,
}

/// Sums `INFO commandstats` + `INFO cpu` text into `work`.
fn add_server_work(work: &mut ServerWork, info: &str) {
    for line in info.lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix("cmdstat_evalsha:").or_else(|| line.strip_prefix("cmdstat_eval:")) {
            for field in rest.split(',') {
                match field.split_once('=') {
                    Some(("calls", v)) => work.script_calls += v.parse::<u64>().unwrap_or(0),
                    Some(("usec", v)) => work.script_us += v.parse::<f64>().unwrap_or(0.0),
                    _ => {}
                }
            }
        } else if let Some(v) = line.strip_prefix("used_cpu_user:").or_else(|| line.strip_prefix("used_cpu_sys:")) {
            work.cpu_us += v.parse::<f64>().unwrap_or(0.0) * 1e6;
        }
    }
}

/// Whether every node of the cluster says `cluster_state:ok` (a single server always is).
pub(crate) async fn cluster_ready(store: &Store) -> Result<bool> {
    if !store.target().is_cluster() {
        return Ok(true);
    }
    for node in store.servers().await? {
        let mut conn = node.connection().await?;
        let info: String = redis::cmd("CLUSTER").arg("INFO").query_async(&mut conn).await?;
        if !info.contains("cluster_state:ok") {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The cluster slot of `key` (`CLUSTER KEYSLOT`).
pub(crate) async fn keyslot(store: &Store, key: &str) -> Result<u16> {
    let mut conn = store.connection();
    Ok(redis::cmd("CLUSTER").arg("KEYSLOT").arg(key).query_async(&mut conn).await?)
}

/// Script time and CPU of every master so far (the benchmark takes differences).
pub(crate) async fn server_work(store: &Store) -> Result<ServerWork> {
    let mut work = ServerWork::default();
    for node in store.servers().await?.into_iter().filter(|n| n.master) {
        let mut conn = node.connection().await?;
        let cpu_before = work.cpu_us;
        for section in ["commandstats", "cpu"] {
            let info: String = redis::cmd("INFO")
                .arg(section)
                .query_async(&mut conn)
                .await
                .with_context(|| format!("cannot read INFO {section}"))?;
            add_server_work(&mut work, &info);
        }
        work.cpu_us_by_master.insert(node.addr.clone(), work.cpu_us - cpu_before);
    }
    Ok(work)
}

/// Deletes `keys` (`UNLINK`; they must share a slot on a cluster).
pub(crate) async fn unlink(store: &Store, keys: &[String]) -> Result<()> {
    let mut conn = store.connection();
    let _: i64 = redis::cmd("UNLINK").arg(keys).query_async(&mut conn).await?;
    Ok(())
}

/// Deletes every key matching `pattern` (`SCAN` + `UNLINK`; one server only).
pub(crate) async fn unlink_matching(store: &Store, pattern: &str) -> Result<()> {
    let mut conn = store.connection();
    let mut cursor = 0u64;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await?;
        if !keys.is_empty() {
            let _: i64 = redis::cmd("UNLINK").arg(&keys).query_async(&mut conn).await?;
        }
        if next == 0 {
            return Ok(());
        }
        cursor = next;
    }
}

/// Members in the sorted set `key` (`ZCARD`).
pub(crate) async fn zcard(store: &Store, key: &str) -> Result<u64> {
    let mut conn = store.connection();
    Ok(redis::cmd("ZCARD").arg(key).query_async(&mut conn).await?)
}

/// Writes due entries as an application would (multi-member `ZADD`s of
/// `chunk` members, pipelined `pipeline` at a time): the benchmark's load.
pub(crate) async fn add_due(
    store: &Store,
    key: &str,
    entries: impl Iterator<Item = (i64, String)>,
    chunk: usize,
    pipeline: usize,
) -> Result<()> {
    write_chunked(store, entries, chunk, pipeline, |pipe, members| {
        pipe.zadd_multiple(key, members).ignore();
    })
    .await
}

/// Writes payloads (multi-field `HSET`s of `chunk` fields, pipelined `pipeline` at a time).
pub(crate) async fn add_payloads(
    store: &Store,
    key: &str,
    entries: impl Iterator<Item = (String, Vec<u8>)>,
    chunk: usize,
    pipeline: usize,
) -> Result<()> {
    write_chunked(store, entries, chunk, pipeline, |pipe, fields| {
        pipe.hset_multiple(key, fields).ignore();
    })
    .await
}

/// Sends `entries` as commands of `chunk` entries each (made by `command`), `pipeline` commands per round trip.
async fn write_chunked<T>(
    store: &Store,
    mut entries: impl Iterator<Item = T>,
    chunk: usize,
    pipeline: usize,
    command: impl Fn(&mut redis::Pipeline, &[T]),
) -> Result<()> {
    let mut conn = store.connection();
    loop {
        let mut pipe = redis::pipe();
        let mut commands = 0;
        while commands < pipeline {
            let members: Vec<T> = entries.by_ref().take(chunk).collect();
            if members.is_empty() {
                break;
            }
            command(&mut pipe, &members);
            commands += 1;
        }
        if commands == 0 {
            return Ok(());
        }
        let () = pipe.query_async(&mut conn).await.context("cannot write tasks")?;
    }
}

/// `used_memory` of the one server, bytes, once what `UNLINK` handed to the
/// background has been freed (`lazyfree_pending_objects` 0, or 30 s): the
/// benchmark clears big sets right before it measures.
pub(crate) async fn used_memory(store: &Store) -> Result<i64> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let info = store.info("memory").await?;
        if info_field(&info, "lazyfree_pending_objects:") == Some(0) || std::time::Instant::now() > deadline {
            return info_field(&info, "used_memory:").context("INFO memory has no used_memory");
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// `used_memory` of the one server now, bytes (what is being freed included).
pub(crate) async fn used_memory_now(store: &Store) -> Result<i64> {
    info_field(&store.info("memory").await?, "used_memory:").context("INFO memory has no used_memory")
}

/// The number after `name` (`used_memory:`) in `INFO` text.
fn info_field(info: &str, name: &str) -> Option<i64> {
    info.lines().find_map(|l| l.strip_prefix(name)).and_then(|v| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_work_sums_scripts_and_cpu() {
        let info = "# Commandstats\r\ncmdstat_evalsha:calls=10,usec=2500,usec_per_call=250.00,rejected_calls=0\r\n\
                    cmdstat_zadd:calls=4,usec=9,usec_per_call=2.25\r\n# CPU\r\nused_cpu_sys:1.500000\r\n\
                    used_cpu_user:0.250000\r\nused_cpu_sys_children:9.0\r\n";
        let mut work = ServerWork::default();
        add_server_work(&mut work, info);
        assert_eq!(work.script_calls, 10);
        assert_eq!(work.script_us, 2500.0);
        assert_eq!(work.cpu_us, 1_750_000.0);
    }
}
