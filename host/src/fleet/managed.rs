//! The managed Redis: a private `redis-server` child for the quick start, started only when nothing answers.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use tracing::info;

use crate::config::RedisConfig;
use crate::redis_server::{RedisServer, ServerSpec};

/// A `redis-server` this host started; stop it with [`ManagedRedis::stop`].
pub struct ManagedRedis {
    server: RedisServer,
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
    let Some(port) = crate::store::loopback_port(url)? else {
        bail!(
            "redis.managed = true needs a loopback URL like redis://127.0.0.1:6379, not {}",
            crate::target::redact_url(url)
        );
    };
    start(&config.data_dir, port, url).await.map(Some)
}

async fn answers(url: &str) -> bool {
    crate::store::answers(url, Duration::from_secs(2)).await
}

async fn start(data_dir: &Path, port: u16, url: &str) -> Result<ManagedRedis> {
    std::fs::create_dir_all(data_dir)
        .with_context(|| format!("cannot create managed Redis data folder {}", data_dir.display()))?;
    let spec = ServerSpec {
        dir: data_dir.to_owned(),
        port: Some(port),
        // Append-only, fsynced every second: see "Durability" in the README.
        appendfsync: Some("everysec"),
        args: vec!["--protected-mode".into(), "yes".into()],
        log: Some(data_dir.join("redis.log")),
        ..ServerSpec::default()
    };
    let needed_by =
        format!("nothing answers at {} and redis.managed = true: starting one", crate::target::redact_url(url));
    let server =
        tokio::task::spawn_blocking(move || RedisServer::spawn_ready(spec, &needed_by, Duration::from_secs(10)))
            .await
            .context("cannot start the managed redis-server")?
            .context("managed redis-server")?;
    info!(url = %crate::target::redact_url(url), data = %data_dir.display(), "started a managed redis-server (append-only persistence)");
    Ok(ManagedRedis { server, url: url.to_owned() })
}

impl ManagedRedis {
    /// Asks the server to shut down (flushing the append-only file), then makes sure it is gone.
    pub async fn stop(self) {
        crate::store::shut_down(&self.url).await;
        let mut server = self.server;
        let _ = tokio::task::spawn_blocking(move || {
            if !server.wait_exit(Duration::from_secs(5)) {
                server.kill();
            }
        })
        .await;
        info!("managed redis-server stopped");
    }
}
