//! Wake-up: learn within milliseconds that a task was scheduled sooner, by keyspace notifications or polling.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Result, bail};
use futures_util::StreamExt;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::config::WakeupMode;
use crate::store::Store;
use crate::task_type::TaskType;

/// Per task type, a [`Notify`] that fires when its due set was written.
#[derive(Clone, Default)]
pub struct Wakeups {
    by_type: Arc<Mutex<HashMap<TaskType, Arc<Notify>>>>,
    /// True while keyspace notifications are flowing; the runner polls otherwise.
    live: Arc<std::sync::atomic::AtomicBool>,
}

impl Wakeups {
    /// The notifier of a type (created on first use).
    pub fn of(&self, task_type: &TaskType) -> Arc<Notify> {
        let mut map = self.by_type.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(task_type.clone()).or_default().clone()
    }

    /// Whether notifications are being received now.
    pub fn live(&self) -> bool {
        self.live.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn wake(&self, task_type: &TaskType) {
        if let Some(n) = self.by_type.lock().unwrap_or_else(|p| p.into_inner()).get(task_type) {
            n.notify_one();
        }
    }

    fn wake_all(&self) {
        for n in self.by_type.lock().unwrap_or_else(|p| p.into_inner()).values() {
            n.notify_one();
        }
    }
}

/// Sets up wake-ups in `mode` and, when notifications are in use, a task
/// that listens for them (reconnecting after faults) until `shutdown`.
///
/// Keyspace notifications are node-local: in a Redis Cluster the listener
/// subscribes on every master, turns notifications on on every node (so a
/// promoted replica has them too), and re-discovers the masters every few
/// seconds and after any fault, so a failover is followed by itself.
pub async fn start(store: &Store, mode: WakeupMode, shutdown: CancellationToken) -> Result<Wakeups> {
    let wakeups = Wakeups::default();
    if mode == WakeupMode::Poll {
        info!("wake-up mode: polling (runner.wakeup = \"poll\")");
        return Ok(wakeups);
    }
    let enabled = async {
        let mut how = "";
        for (_, client, _) in nodes(store).await? {
            how = enable_notifications(&client, mode).await?;
        }
        anyhow::Ok(how)
    };
    match enabled.await {
        Ok(how) if store.target().is_cluster() => info!("wake-up mode: keyspace notifications on every cluster master ({how})"),
        Ok(how) => info!("wake-up mode: keyspace notifications ({how})"),
        Err(e) if mode == WakeupMode::Notify => {
            bail!("runner.wakeup = \"notify\" but keyspace notifications cannot be used: {e:#}")
        }
        Err(e) => {
            warn!("wake-up mode: polling, because keyspace notifications cannot be used: {e:#}");
            return Ok(wakeups);
        }
    }
    let pattern = format!("__keyspace@*__:{}:{{*}}:due", store.prefix());
    let listener = wakeups.clone();
    let store = store.clone();
    tokio::spawn(async move {
        let mut backoff = Duration::from_millis(100);
        loop {
            let result = tokio::select! {
                _ = shutdown.cancelled() => return,
                r = listen_everywhere(&store, mode, &pattern, &listener) => r,
            };
            listener.live.store(false, std::sync::atomic::Ordering::Relaxed);
            // Events may have been missed while disconnected: look again everywhere.
            listener.wake_all();
            match result {
                Err(e) => tracing::debug!("keyspace notification listener: {e:#}"),
                // The cluster's masters changed: listen on the new ones at once.
                Ok(()) => backoff = Duration::from_millis(100),
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(Duration::from_secs(2));
        }
    });
    Ok(wakeups)
}

/// How often the listener looks for a changed set of cluster masters.
const TOPOLOGY_CHECK: Duration = Duration::from_secs(3);

/// `(address, client, is_master)` of every node: the server itself, or every cluster node.
async fn nodes(store: &Store) -> Result<Vec<(String, redis::Client, bool)>> {
    if !store.target().is_cluster() {
        return Ok(vec![(String::new(), store.client().clone(), true)]);
    }
    let mut out = Vec::new();
    for node in store.cluster_nodes().await? {
        let client = store.target().node_client(&node.host, node.port)?;
        out.push((format!("{}:{}", node.host, node.port), client, node.master));
    }
    if !out.iter().any(|n| n.2) {
        bail!("the cluster lists no master");
    }
    Ok(out)
}

/// Subscribes on every master; returns Ok when the set of masters changed
/// (cluster only), Err when a subscription failed or closed.
async fn listen_everywhere(store: &Store, mode: WakeupMode, pattern: &str, wakeups: &Wakeups) -> Result<()> {
    let all = nodes(store).await?;
    if store.target().is_cluster() {
        // Nodes that joined or restarted since the start need notifications turned on too.
        for (addr, client, _) in &all {
            if let Err(e) = enable_notifications(client, mode).await {
                tracing::debug!("cannot enable keyspace notifications on {addr}: {e:#}");
            }
        }
    }
    let masters: Vec<(String, redis::Client)> =
        all.into_iter().filter(|n| n.2).map(|(addr, client, _)| (addr, client)).collect();
    let addrs: Vec<String> = masters.iter().map(|m| m.0.clone()).collect();
    let listeners = masters.iter().map(|(_, client)| Box::pin(listen(client, pattern, wakeups)));
    let any_closed = futures_util::future::select_all(listeners);
    if !store.target().is_cluster() {
        return any_closed.await.0;
    }
    let topology_changed = async {
        loop {
            tokio::time::sleep(TOPOLOGY_CHECK).await;
            if let Ok(now) = nodes(store).await {
                let now: Vec<String> = now.into_iter().filter(|n| n.2).map(|n| n.0).collect();
                if now != addrs {
                    info!(masters = ?now, "cluster masters changed: re-subscribing to keyspace notifications");
                    return;
                }
            }
        }
    };
    tokio::select! {
        (r, _, _) = any_closed => r,
        () = topology_changed => Ok(()),
    }
}

/// Makes sure the server publishes keyspace events for sorted sets (`K` + `z`).
///
/// A user without the CONFIG command (a restricted ACL user) cannot check or
/// turn them on: with `wakeup = "notify"` the operator vouches that the server
/// has `notify-keyspace-events` with `K` and `z`; with `auto` the host polls.
async fn enable_notifications(client: &redis::Client, mode: WakeupMode) -> Result<&'static str> {
    let mut conn = tokio::time::timeout(Duration::from_secs(3), client.get_multiplexed_async_connection())
        .await
        .map_err(|_| anyhow::anyhow!("timed out connecting"))??;
    let flags: (String, String) =
        match redis::cmd("CONFIG").arg("GET").arg("notify-keyspace-events").query_async(&mut conn).await {
            Ok(flags) => flags,
            Err(e) if mode == WakeupMode::Notify && e.to_string().to_ascii_uppercase().contains("NOPERM") => {
                return Ok("this user may not run CONFIG: trusting the server's notify-keyspace-events");
            }
            Err(e) => return Err(e.into()),
        };
    let (_, flags) = flags;
    let has = |c: char| flags.contains(c);
    if has('K') && (has('z') || has('A')) {
        return Ok("already enabled on the server");
    }
    let mut wanted = flags.clone();
    for c in ['K', 'z'] {
        if !wanted.contains(c) {
            wanted.push(c);
        }
    }
    redis::cmd("CONFIG").arg("SET").arg("notify-keyspace-events").arg(&wanted).query_async::<()>(&mut conn).await?;
    Ok("enabled with CONFIG SET notify-keyspace-events")
}

async fn listen(client: &redis::Client, pattern: &str, wakeups: &Wakeups) -> Result<()> {
    let mut pubsub = client.get_async_pubsub().await?;
    pubsub.psubscribe(pattern).await?;
    wakeups.live.store(true, std::sync::atomic::Ordering::Relaxed);
    // Anything scheduled before the subscription took effect is found by this sweep.
    wakeups.wake_all();
    let mut messages = pubsub.on_message();
    while let Some(msg) = messages.next().await {
        if let Some(task_type) = type_of_channel(msg.get_channel_name()) {
            wakeups.wake(&task_type);
        }
    }
    bail!("subscription closed")
}

/// `__keyspace@0__:hourglass:{order.timeout}:due` → `order.timeout`.
fn type_of_channel(channel: &str) -> Option<TaskType> {
    let open = channel.find('{')?;
    let close = channel[open..].find('}')? + open;
    channel[open + 1..close].parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channel_names_give_the_type() {
        let t = type_of_channel("__keyspace@0__:hourglass:{order.timeout}:due").unwrap();
        assert_eq!(t.as_str(), "order.timeout");
        assert!(type_of_channel("__keyspace@0__:hourglass:{Bad}:due").is_none());
        assert!(type_of_channel("__keyspace@0__:nothing").is_none());
    }
}
