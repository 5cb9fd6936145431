//! The host a scenario measures: started in-process (one, or `--hosts` of them) on a fresh plugins folder, and stopped.

use super::*;

/// The running in-process hosts (one unless `--hosts`), sharing one plugins folder.
pub(super) struct Host {
    pub(super) shutdown: CancellationToken,
    pub(super) handles: Vec<tokio::task::JoinHandle<Result<()>>>,
    pub(super) plugins: PathBuf,
}

impl Host {
    pub(super) async fn stop(self) -> Result<()> {
        self.shutdown.cancel();
        for handle in self.handles {
            handle.await.context("host task panicked")??;
        }
        Ok(())
    }

    /// The error of a host that stopped on its own.
    pub(super) async fn failed(&mut self) -> Option<anyhow::Error> {
        let i = self.handles.iter().position(|h| h.is_finished())?;
        Some(match self.handles.swap_remove(i).await {
            Ok(Ok(())) => anyhow::anyhow!("a host stopped at start"),
            Ok(Err(e)) => e,
            Err(e) => anyhow::Error::new(e).context("host task panicked"),
        })
    }
}

impl Bench {
    /// Starts the host with `noop` (and `extra` plugin files) in a fresh plugins folder.
    pub(super) async fn start_host(&self, recorder: &Arc<Recorder>, extra: &[PathBuf]) -> Result<Host> {
        self.start_host_with(recorder, extra, &[]).await
    }

    /// [`Self::start_host`], with `types` configured besides the bench's own.
    pub(super) async fn start_host_with(
        &self,
        recorder: &Arc<Recorder>,
        extra: &[PathBuf],
        types: &[(TaskType, TypeConfig)],
    ) -> Result<Host> {
        let plugins = self.work.path.join(format!("plugins-{:x}", rand::random::<u32>()));
        std::fs::create_dir_all(&plugins)?;
        std::fs::copy(&self.plugin, plugins.join(format!("{TYPE}.wasm")))
            .with_context(|| format!("cannot copy {}", self.plugin.display()))?;
        for file in extra {
            if let Some(name) = file.file_name() {
                std::fs::copy(file, plugins.join(name))?;
            }
        }
        let mut config = self.base_config.clone();
        config.admin.enabled = false;
        config.redis.url = self.url.clone();
        config.redis.prefix = PREFIX.parse().map_err(anyhow::Error::msg)?;
        config.runner.plugins_dir = plugins.clone();
        config.runner.cache_dir = if self.args.cold {
            self.work.path.join(format!("cache-{:x}", rand::random::<u32>()))
        } else {
            std::env::temp_dir().join("hourglass-bench-cache")
        };
        config.runner.grace_period = Duration::from_secs(5);
        config.runner.concurrency = self.concurrency();
        config.runner.batch_size = self.batch_size();
        config.runner.worker_threads = Some(self.worker_threads());
        // The config's own `[types.T]` of a benchmarked type (grants such as
        // `may_schedule`, for a plugin that schedules) under the bench's keys.
        let type_config = |t: &TaskType| TypeConfig {
            concurrency: Some(self.type_concurrency()),
            instance_reuse: self.args.reuse,
            instance_reset: Some(!self.args.no_reset),
            plugin: Some(PathBuf::from(format!("{TYPE}.wasm"))),
            shards: Some(self.args.shards),
            ..self.base_config.types.get(t).cloned().unwrap_or_default()
        };
        config.types = self.task_types.iter().map(|t| (t.clone(), type_config(t))).collect();
        config.types.extend(types.iter().cloned());
        let shutdown = CancellationToken::new();
        let mut host = Host { shutdown: shutdown.clone(), handles: Vec::new(), plugins };
        // The hosts' task events (trace level, `hourglass::task`) go to this run's recorder.
        crate::recorder::listen(recorder);
        for k in 0..usize::from(self.args.hosts) {
            // Its own connection, as a separate process would have.
            let store = Store::connect(&self.url, &config.redis.prefix).await?;
            let mut config = config.clone();
            config.runner.host_id = Some(format!("{}{k}", crate::recorder::HOST_ID));
            host.handles.push(tokio::spawn(host::run(config, None, store, shutdown.clone())));
        }
        // Ready when every host has run warm-up tasks: plugins loaded, claim loops running.
        // A cold start compiles every plugin first, each allowed `compile_timeout` of CPU:
        // on two cores shared with other work that takes minutes, not seconds.
        let ready_within = if self.args.cold { Duration::from_secs(600) } else { Duration::from_secs(120) };
        let deadline = Instant::now() + ready_within;
        let mut written = 0u64;
        for round in 0.. {
            if recorder.host_warm.iter().all(|w| w.load(Ordering::Relaxed) > 0) {
                break;
            }
            if recorder.warm_acks.load(Ordering::Relaxed) >= written {
                let due = now_ms();
                for t in &self.task_types {
                    let warm: Vec<(i64, String)> = (0..50).map(|i| (due, format!("warm-{round}-{i}"))).collect();
                    written += warm.len() as u64;
                    let keys = self.store.keys(t);
                    if let Some(payload) = &self.args.payload {
                        let bodies = warm.iter().map(|(_, id)| (id.clone(), payload.as_bytes().to_vec()));
                        redis_ops::add_payloads(&self.store, &keys.payload, bodies, ZADD_CHUNK, 1).await?;
                    }
                    redis_ops::add_due(&self.store, &keys.due, warm.into_iter(), ZADD_CHUNK, 1).await?;
                }
            }
            if let Some(e) = host.failed().await {
                host.shutdown.cancel();
                return Err(e);
            }
            if Instant::now() > deadline {
                host.shutdown.cancel();
                bail!("the in-process hosts did not all run warm-up tasks within {}s", ready_within.as_secs());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // Let the last warm-up round drain so it does not overlap the measurement.
        while recorder.warm_acks.load(Ordering::Relaxed) < written && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(host)
    }
}
