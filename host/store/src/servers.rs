//! Talking to servers rather than task keys: the servers themselves, keyspace-notification settings, subscriptions and server info.

use anyhow::{Context, Result, anyhow, bail};

use super::Store;

/// One server a host talks to directly: the server itself, or one node of a cluster.
#[derive(Debug, Clone)]
pub struct Server {
    /// `host:port` ("" for a single server).
    pub addr: String,
    /// A client of this node alone.
    pub client: redis::Client,
    /// Serves slots (always true for a single server).
    pub master: bool,
}

impl Store {
    /// The servers to talk to directly: this one, or every node of the cluster.
    pub async fn servers(&self) -> Result<Vec<Server>> {
        if let crate::conn::ConnKind::Single(master) = &self.conn.0 {
            return Ok(vec![Server { addr: String::new(), client: master.client(), master: true }]);
        }
        let mut out = Vec::new();
        for node in self.cluster_nodes().await? {
            let client = self.target.node_client(&node.host, node.port)?;
            out.push(Server { addr: format!("{}:{}", node.host, node.port), client, master: node.master });
        }
        if !out.iter().any(|n| n.master) {
            bail!("the cluster lists no master");
        }
        Ok(out)
    }
}

impl Store {
    /// A section of `INFO` (of one node, on a cluster), e.g. `memory`.
    pub async fn info(&self, section: &str) -> Result<String> {
        let mut conn = self.conn.clone();
        redis::cmd("INFO")
            .arg(section)
            .query_async(&mut conn)
            .await
            .with_context(|| format!("cannot read INFO {section}"))
    }
}

impl Server {
    /// A connection of its own to this node.
    pub async fn connection(&self) -> Result<redis::aio::MultiplexedConnection> {
        tokio::time::timeout(std::time::Duration::from_secs(3), self.client.get_multiplexed_async_connection())
            .await
            .map_err(|_| anyhow!("timed out connecting"))?
            .map_err(Into::into)
    }

    /// `CONFIG GET notify-keyspace-events`: the node's flags.
    pub async fn keyspace_events(&self) -> Result<String> {
        let mut conn = self.connection().await?;
        let (_, flags): (String, String) =
            redis::cmd("CONFIG").arg("GET").arg("notify-keyspace-events").query_async(&mut conn).await?;
        Ok(flags)
    }

    /// `CONFIG SET notify-keyspace-events <flags>`.
    pub async fn set_keyspace_events(&self, flags: &str) -> Result<()> {
        let mut conn = self.connection().await?;
        redis::cmd("CONFIG").arg("SET").arg("notify-keyspace-events").arg(flags).query_async::<()>(&mut conn).await?;
        Ok(())
    }

    /// A pub/sub connection subscribed to `patterns` and `channels`.
    pub async fn subscribe(&self, patterns: &[&str], channels: &[&str]) -> Result<Subscription> {
        let mut pubsub = self.client.get_async_pubsub().await?;
        for pattern in patterns {
            pubsub.psubscribe(*pattern).await?;
        }
        for channel in channels {
            pubsub.subscribe(*channel).await?;
        }
        Ok(Subscription(pubsub))
    }
}

/// A subscription to one node's channels (keyspace notifications, cancels).
pub struct Subscription(redis::aio::PubSub);

/// One message a [`Subscription`] received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// The channel it came on (for a pattern subscription, the channel that matched).
    pub channel: String,
    pub payload: Vec<u8>,
}

impl Subscription {
    /// Its messages as they come; the stream ends when the connection closes.
    pub fn into_messages(self) -> impl futures_util::Stream<Item = Message> + Send {
        use futures_util::StreamExt;
        self.0
            .into_on_message()
            .map(|m| Message { channel: m.get_channel_name().to_owned(), payload: m.get_payload_bytes().to_vec() })
    }
}

/// Whether something answers `PING` at `url` within `timeout` (before any store exists).
pub async fn answers(url: &str, timeout: std::time::Duration) -> bool {
    let Ok(client) = redis::Client::open(url) else {
        return false;
    };
    let ping = async {
        let mut conn = client.get_multiplexed_async_connection().await.ok()?;
        redis::cmd("PING").query_async::<String>(&mut conn).await.ok()
    };
    matches!(tokio::time::timeout(timeout, ping).await, Ok(Some(_)))
}

/// Asks the server at `url` to shut down (it flushes its append-only file first).
pub async fn shut_down(url: &str) {
    if let Ok(client) = redis::Client::open(url)
        && let Ok(mut conn) = client.get_multiplexed_async_connection().await
    {
        // The server closes the connection instead of replying.
        let _ = redis::cmd("SHUTDOWN").query_async::<()>(&mut conn).await;
    }
}
