//! The managed Redis: a private `redis-server` child for the quick start, started only when nothing answers.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use tokio::process::{Child, Command};
use tracing::info;

use crate::config::RedisConfig;

/// A `redis-server` this host started; stop it with [`ManagedRedis::stop`].
pub struct ManagedRedis {
    child: Child,
    url: String,
}

/// When `[redis] managed = true` and nothing answers at `url`, starts a
/// `redis-server` bound to loopback with append-only persistence in
/// `data_dir`, so tasks survive a restart. Returns `None` when a Redis
/// already answers or `managed` is off.
pub async fn ensure(config: &RedisConfig, url: &str) -> Result<Option<ManagedRedis>> {
    if !config.managed || answers(url).await {
        return Ok(None);
    }
    let info = redis::IntoConnectionInfo::into_connection_info(url)
        .with_context(|| format!("invalid Redis URL {}", crate::store::redact_url(url)))?;
    let port = match info.addr() {
        redis::ConnectionAddr::Tcp(host, port) if is_loopback(host) => *port,
        _ => bail!(
            "redis.managed = true needs a loopback URL like redis://127.0.0.1:6379, not {}",
            crate::store::redact_url(url)
        ),
    };
    start(&config.data_dir, port, url).await.map(Some)
}

fn is_loopback(host: &str) -> bool {
    matches!(host, "127.0.0.1" | "localhost" | "::1" | "[::1]")
}

async fn answers(url: &str) -> bool {
    let Ok(client) = redis::Client::open(url) else {
        return false;
    };
    let ping = async {
        let mut conn = client.get_multiplexed_async_connection().await.ok()?;
        redis::cmd("PING").query_async::<String>(&mut conn).await.ok()
    };
    matches!(tokio::time::timeout(Duration::from_secs(2), ping).await, Ok(Some(_)))
}

async fn start(data_dir: &Path, port: u16, url: &str) -> Result<ManagedRedis> {
    std::fs::create_dir_all(data_dir)
        .with_context(|| format!("cannot create managed Redis data folder {}", data_dir.display()))?;
    let log = std::fs::File::create(data_dir.join("redis.log"))
        .with_context(|| format!("cannot write {}", data_dir.join("redis.log").display()))?;
    let child = Command::new("redis-server")
        .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
        .args(["--appendonly", "yes", "--appendfsync", "everysec", "--save", ""])
        .arg("--dir")
        .arg(data_dir)
        .args(["--daemonize", "no", "--protected-mode", "yes"])
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => anyhow::anyhow!(
                "nothing answers at {} and redis.managed = true, but redis-server is not installed (apt-get install redis-server)",
                crate::store::redact_url(url)
            ),
            _ => anyhow::Error::new(e).context("cannot start redis-server"),
        })?;
    let mut managed = ManagedRedis { child, url: url.to_owned() };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !answers(url).await {
        if let Ok(Some(status)) = managed.child.try_wait() {
            bail!("managed redis-server exited at start ({status}); see {}", data_dir.join("redis.log").display());
        }
        if Instant::now() > deadline {
            bail!("managed redis-server did not answer within 10s; see {}", data_dir.join("redis.log").display());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    info!(url = %crate::store::redact_url(url), data = %data_dir.display(), "started a managed redis-server (append-only persistence)");
    Ok(managed)
}

impl ManagedRedis {
    /// Asks the server to shut down (flushing the append-only file), then makes sure it is gone.
    pub async fn stop(mut self) {
        if let Ok(client) = redis::Client::open(self.url.as_str())
            && let Ok(mut conn) = client.get_multiplexed_async_connection().await
        {
            // The server closes the connection instead of replying.
            let _ = redis::cmd("SHUTDOWN").query_async::<()>(&mut conn).await;
        }
        if tokio::time::timeout(Duration::from_secs(5), self.child.wait()).await.is_err() {
            let _ = self.child.kill().await;
        }
        info!("managed redis-server stopped");
    }
}
