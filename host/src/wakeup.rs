//! Wake-up: learn within milliseconds that a task was scheduled sooner, by keyspace notifications or polling.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Result, bail};
use futures_util::StreamExt;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::config::{KeyPrefix, WakeupMode};
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
pub async fn start(
    client: redis::Client,
    prefix: &KeyPrefix,
    mode: WakeupMode,
    shutdown: CancellationToken,
) -> Result<Wakeups> {
    let wakeups = Wakeups::default();
    if mode == WakeupMode::Poll {
        info!("wake-up mode: polling (runner.wakeup = \"poll\")");
        return Ok(wakeups);
    }
    match enable_notifications(&client).await {
        Ok(how) => info!("wake-up mode: keyspace notifications ({how})"),
        Err(e) if mode == WakeupMode::Notify => {
            bail!("runner.wakeup = \"notify\" but keyspace notifications cannot be used: {e:#}")
        }
        Err(e) => {
            warn!("wake-up mode: polling, because keyspace notifications cannot be used: {e:#}");
            return Ok(wakeups);
        }
    }
    let pattern = format!("__keyspace@*__:{}:{{*}}:due", prefix.as_str());
    let listener = wakeups.clone();
    tokio::spawn(async move {
        let mut backoff = Duration::from_millis(100);
        loop {
            let result = tokio::select! {
                _ = shutdown.cancelled() => return,
                r = listen(&client, &pattern, &listener) => r,
            };
            listener.live.store(false, std::sync::atomic::Ordering::Relaxed);
            // Events may have been missed while disconnected: look again everywhere.
            listener.wake_all();
            if let Err(e) = result {
                tracing::debug!("keyspace notification listener: {e:#}");
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

/// Makes sure the server publishes keyspace events for sorted sets (`K` + `z`).
async fn enable_notifications(client: &redis::Client) -> Result<&'static str> {
    let mut conn = tokio::time::timeout(Duration::from_secs(3), client.get_multiplexed_async_connection())
        .await
        .map_err(|_| anyhow::anyhow!("timed out connecting"))??;
    let (_, flags): (String, String) =
        redis::cmd("CONFIG").arg("GET").arg("notify-keyspace-events").query_async(&mut conn).await?;
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
