//! Wake-up: learn within milliseconds that a task was scheduled sooner, by keyspace notifications or polling.

use hourglass_task::sync::LockExt;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Result, bail};
use futures_util::StreamExt;
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::config::WakeupMode;
use crate::store::Subscription;
use crate::store::{Server, Store};
use crate::task::CancelRequest;
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
        let mut map = self.by_type.lock_unpoisoned();
        map.entry(task_type.clone()).or_default().clone()
    }

    /// Whether notifications are being received now.
    pub fn live(&self) -> bool {
        self.live.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn wake(&self, task_type: &TaskType) {
        if let Some(n) = self.by_type.lock_unpoisoned().get(task_type) {
            n.notify_one();
        }
    }

    fn wake_all(&self) {
        for n in self.by_type.lock_unpoisoned().values() {
            n.notify_one();
        }
    }
}

/// Sets up wake-ups in `mode` and a task that listens (reconnecting after
/// faults) until `shutdown`: for keyspace notifications when they are in
/// use, and in every mode for cancels of running tasks (`hourglass cancel`
/// publishes them), which it passes to `cancels`.
///
/// Keyspace notifications are node-local, and a restarted server forgets a
/// `CONFIG SET`: so on every (re)connect the listener turns them on again
/// (when the mode allows `CONFIG`) before it subscribes, on the server or on
/// every node of a cluster, where it subscribes on every master and
/// re-discovers the masters every few seconds, so a failover is followed by itself.
pub async fn start(
    store: &Store,
    mode: WakeupMode,
    cancels: mpsc::UnboundedSender<CancelRequest>,
    shutdown: CancellationToken,
) -> Result<Wakeups> {
    let wakeups = Wakeups::default();
    let listen = Listen { cancel_channel: store.cancel_channel(), cancels, pattern: None, mode };
    if mode == WakeupMode::Poll {
        info!("wake-up mode: polling (runner.wakeup = \"poll\")");
        spawn_listener(store.clone(), listen, wakeups.clone(), shutdown);
        return Ok(wakeups);
    }
    let enabled = async {
        let mut how = "";
        for node in store.servers().await? {
            how = enable_notifications(&node, mode).await?;
        }
        anyhow::Ok(how)
    };
    match enabled.await {
        Ok(how) if store.target().is_cluster() => {
            info!("wake-up mode: keyspace notifications on every cluster master ({how})")
        }
        Ok(how) => info!("wake-up mode: keyspace notifications ({how})"),
        Err(e) if mode == WakeupMode::Notify => {
            bail!("runner.wakeup = \"notify\" but keyspace notifications cannot be used: {e:#}")
        }
        Err(e) => {
            warn!("wake-up mode: polling, because keyspace notifications cannot be used: {e:#}");
            spawn_listener(store.clone(), listen, wakeups.clone(), shutdown);
            return Ok(wakeups);
        }
    }
    let listen = Listen { pattern: Some(format!("__keyspace@*__:{}:{{*}}:due", store.prefix())), ..listen };
    spawn_listener(store.clone(), listen, wakeups.clone(), shutdown);
    Ok(wakeups)
}

/// What the listener subscribes to, and where cancels go.
struct Listen {
    /// The keyspace pattern of the due sets; `None` when polling.
    pattern: Option<String>,
    cancel_channel: String,
    cancels: mpsc::UnboundedSender<CancelRequest>,
    mode: WakeupMode,
}

/// Listens until `shutdown`, reconnecting with backoff after every fault.
fn spawn_listener(store: Store, listen: Listen, listener: Wakeups, shutdown: CancellationToken) {
    tokio::spawn(async move {
        let mut backoff = Duration::from_millis(100);
        let mut reconnect = false;
        loop {
            let result = tokio::select! {
                _ = shutdown.cancelled() => return,
                r = listen_everywhere(&store, &listen, &listener, reconnect) => r,
            };
            listener.live.store(false, std::sync::atomic::Ordering::Relaxed);
            // Events may have been missed while disconnected: look again everywhere.
            listener.wake_all();
            reconnect = true;
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
}

/// How often the listener looks for a changed set of cluster masters.
const TOPOLOGY_CHECK: Duration = Duration::from_secs(3);

/// Turns notifications on (again) and subscribes on every master; returns Ok
/// when the set of masters changed (cluster only), Err when a subscription
/// failed or closed. `reconnect`: a subscription was lost before, so the
/// server may have restarted and forgotten its notification setting.
async fn listen_everywhere(store: &Store, listen: &Listen, wakeups: &Wakeups, reconnect: bool) -> Result<()> {
    // Looked at before the nodes are: a master change from here on is seen.
    let mut master_changes = store.master_changes();
    let all = store.servers().await?;
    let mut how = "";
    let mut enabled = true;
    if listen.pattern.is_some() && (reconnect || store.target().is_cluster()) {
        // Nodes that joined, restarted or were promoted since the start need notifications turned on too.
        for node in &all {
            match enable_notifications(node, listen.mode).await {
                Ok(h) => how = h,
                Err(e) => {
                    // One server that will not have them is polled; a cluster's
                    // other nodes still publish, and a node down now is tried at the next look.
                    enabled &= store.target().is_cluster();
                    tracing::debug!("cannot enable keyspace notifications on {}: {e:#}", node.addr)
                }
            }
        }
    }
    let masters: Vec<&Server> = all.iter().filter(|n| n.master).collect();
    let addrs: Vec<String> = masters.iter().map(|m| m.addr.clone()).collect();
    let patterns: Vec<&str> = listen.pattern.as_deref().into_iter().collect();
    let mut subscriptions = Vec::with_capacity(masters.len());
    for node in &masters {
        // A PUBLISH reaches every node of a cluster: the cancels come once per master, harmlessly.
        subscriptions.push(node.subscribe(&patterns, &[&listen.cancel_channel]).await?);
    }
    if listen.pattern.is_some() && enabled {
        wakeups.live.store(true, std::sync::atomic::Ordering::Relaxed);
        if reconnect {
            info!("keyspace notifications re-subscribed after a reconnect ({how})");
        }
    } else if listen.pattern.is_some() && !store.target().is_cluster() {
        // A server promoted or restarted without them, that this user may not change: poll it.
        warn!("keyspace notifications cannot be turned on at this Redis master: polling until they can");
    }
    // Anything scheduled before the subscriptions took effect, or while
    // disconnected, is found by this sweep (in polling mode too).
    wakeups.wake_all();
    let listeners = subscriptions.into_iter().map(|pubsub| Box::pin(receive(pubsub, wakeups, listen)));
    let any_closed = futures_util::future::select_all(listeners);
    if !store.target().is_cluster() {
        // The master changed (a failover): subscribe again, on the new one.
        return tokio::select! {
            (r, _, _) = any_closed => r,
            _ = master_changes.changed() => {
                info!("Redis master changed: subscribing again on the new master");
                Ok(())
            }
        };
    }
    let topology_changed = async {
        loop {
            tokio::time::sleep(TOPOLOGY_CHECK).await;
            if let Ok(now) = store.servers().await {
                let now: Vec<String> = now.into_iter().filter(|n| n.master).map(|n| n.addr).collect();
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

/// Makes sure the node publishes keyspace events for sorted sets (`K` + `z`).
///
/// A user without the CONFIG command (a restricted ACL user) cannot check or
/// turn them on: with `wakeup = "notify"` the operator vouches that the server
/// has `notify-keyspace-events` with `K` and `z`; with `auto` the host polls.
async fn enable_notifications(node: &Server, mode: WakeupMode) -> Result<&'static str> {
    let flags = match node.keyspace_events().await {
        Ok(flags) => flags,
        Err(e) if mode == WakeupMode::Notify && format!("{e:#}").to_ascii_uppercase().contains("NOPERM") => {
            return Ok("this user may not run CONFIG: trusting the server's notify-keyspace-events");
        }
        Err(e) => return Err(e),
    };
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
    node.set_keyspace_events(&wanted).await?;
    Ok("enabled with CONFIG SET notify-keyspace-events")
}

/// Wakes claim loops on keyspace events and passes cancels on, until the subscription closes.
async fn receive(subscription: Subscription, wakeups: &Wakeups, listen: &Listen) -> Result<()> {
    let mut messages = std::pin::pin!(subscription.into_messages());
    while let Some(msg) = messages.next().await {
        let channel = msg.channel.as_str();
        if channel == listen.cancel_channel {
            match CancelRequest::parse(&msg.payload) {
                Some(request) => {
                    let _ = listen.cancels.send(request);
                }
                None => warn!("ignored a malformed cancel message on {channel}"),
            }
        } else if let Some(task_type) = type_of_channel(channel) {
            wakeups.wake(&task_type);
        }
    }
    bail!("subscription closed")
}

/// `__keyspace@0__:hourglass:{order.timeout}:due` → `order.timeout` (`{order.timeout#2}` → that shard).
fn type_of_channel(channel: &str) -> Option<TaskType> {
    let open = channel.find('{')?;
    let close = channel[open..].find('}')? + open;
    TaskType::parse_queue(&channel[open + 1..close]).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channel_names_give_the_type() {
        let t = type_of_channel("__keyspace@0__:hourglass:{order.timeout}:due").unwrap();
        assert_eq!(t.as_str(), "order.timeout");
        assert!(type_of_channel("__keyspace@0__:hourglass:{Bad}:due").is_none());
        assert_eq!(type_of_channel("__keyspace@0__:hourglass:{order.timeout#2}:due").unwrap(), t.shard(2));
        assert!(type_of_channel("__keyspace@0__:nothing").is_none());
    }
}
