//! The `footprint` and `reload` scenarios: the host's memory and start-up, and how long a plugin swap takes.

use super::*;

impl Bench {
    /// Every key of type `t`.
    pub(super) fn all_keys(&self, t: &TaskType) -> Vec<String> {
        self.store.keys(t).fixed().map(str::to_owned).to_vec()
    }

    pub(super) async fn footprint(&self) -> Result<()> {
        if self.store.target().is_cluster() {
            bail!("footprint measures one Redis server's memory: run it against a single server, not a cluster");
        }
        let n = self.burst_size();
        let redis_tasks = self.args.footprint_tasks.unwrap_or(1_000_000);
        // Every example plugin next to noop.wasm, as `make run` would load them.
        let extra: Vec<PathBuf> = self
            .plugin
            .parent()
            .and_then(|d| std::fs::read_dir(d).ok())
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "wasm") && p != &self.plugin)
            .collect();

        let recorder = Recorder::new(n as usize, usize::from(self.args.hosts));
        let _ = std::fs::write("/proc/self/clear_refs", "5");
        let host = self.start_host(&recorder, &extra).await?;
        let rss_loaded_peak = proc_status_kib("VmHWM:");
        // jemalloc returns freed pages after its 10 s decay: a cold start's compile needs that long to be given back.
        tokio::time::sleep(Duration::from_secs(if self.args.cold { 20 } else { 1 })).await;
        let rss_idle = proc_status_kib("VmRSS:");
        // Reset the high-water mark (compiling the plugins at start is not the burst's peak).
        let _ = std::fs::write("/proc/self/clear_refs", "5");
        let Burst { lost, doubled, .. } = self.one_burst(n, &recorder).await?;
        let rss_peak = proc_status_kib("VmHWM:");
        host.stop().await?;
        self.clear().await?;

        let used = |info: String| -> Option<i64> {
            info.lines().find_map(|l| l.strip_prefix("used_memory:")).and_then(|v| v.trim().parse().ok())
        };
        let before = used(self.store.info("memory").await?);
        self.progress_line(&format!("footprint: writing {redis_tasks} tasks"));
        let key = format!("{PREFIX}:{{footprint}}:due");
        let far = now_ms() + 10 * 365 * 24 * 3600 * 1000;
        self.write_ids_to(&key, 0..redis_tasks, |i| far + i as i64).await?;
        self.progress_done();
        let after = used(self.store.info("memory").await?);
        let count = redis_ops::zcard(&self.store, &key).await?;
        redis_ops::unlink(&self.store, std::slice::from_ref(&key)).await?;
        let per_task = match (before, after) {
            (Some(b), Some(a)) if count > 0 => json!(((a - b) as f64 / count as f64).round()),
            _ => Value::Null,
        };

        let mut m = self.common();
        m.insert("scenario".into(), json!("footprint"));
        m.insert("redis_tasks".into(), json!(count));
        m.insert("redis_bytes_per_task".into(), per_task);
        m.insert("plugins_loaded".into(), json!(extra.len() + 1));
        m.insert("cache".into(), json!(if self.args.cold { "cold" } else { "warm" }));
        m.insert("rss_start_peak_mib".into(), mib(rss_loaded_peak));
        m.insert("rss_idle_mib".into(), mib(rss_idle));
        m.insert("burst_tasks".into(), json!(n));
        m.insert("rss_peak_mib".into(), mib(rss_peak));
        m.insert("lost".into(), json!(lost));
        m.insert("doubled".into(), json!(doubled));
        self.report("footprint: Redis bytes per task, host RSS", Value::Object(m));
        Ok(())
    }

    pub(super) async fn reload(&self) -> Result<()> {
        let rate = self.args.rate.unwrap_or(1_000);
        let duration = self.args.duration.unwrap_or(Duration::from_secs(6));
        let n = (rate as f64 * duration.as_secs_f64()).round() as u64;
        let recorder = Recorder::new(n as usize, usize::from(self.args.hosts));
        let host = self.start_host(&recorder, &[]).await?;

        // The same plugin with a custom section appended: new bytes, new version.
        let mut bytes = std::fs::read(&self.plugin)?;
        append_custom_section(&mut bytes, "hourglass-bench", &rand::random::<u64>().to_le_bytes());
        let new_hash = hourglass::runtime::short_hash(&bytes);
        recorder.watch_hash.store(Some(Arc::new(new_hash.clone())));
        let staged = host.plugins.join(format!(".{TYPE}.wasm.tmp"));
        std::fs::write(&staged, &bytes)?;

        let renamed_us = Arc::new(AtomicI64::new(0));
        let swap = {
            let (staged, target, renamed_us) =
                (staged.clone(), host.plugins.join(format!("{TYPE}.wasm")), renamed_us.clone());
            let wait = duration / 3 + Duration::from_secs(1);
            tokio::spawn(async move {
                tokio::time::sleep(wait).await;
                renamed_us.store(now_us(), Ordering::Relaxed);
                std::fs::rename(&staged, &target)
            })
        };
        self.steady_writer(rate, duration, "reload").await?;
        self.progress_done();
        swap.await?.context("cannot rename the new plugin into place")?;
        self.wait_acked(&recorder, n, "reload").await;
        host.stop().await?;
        self.clear().await?;
        let (lost, doubled) = recorder.lost_doubled();
        let first = recorder.first_on_watched_us.load(Ordering::Relaxed);
        let reload_ms = (first > 0).then(|| round3((first - renamed_us.load(Ordering::Relaxed)) as f64 / 1000.0));

        let mut m = self.common();
        m.insert("scenario".into(), json!("reload"));
        m.insert("rate".into(), json!(rate));
        m.insert("tasks".into(), json!(n));
        m.insert("new_version".into(), json!(new_hash));
        m.insert("reload_ms".into(), json!(reload_ms));
        m.insert("lost".into(), json!(lost));
        m.insert("doubled".into(), json!(doubled));
        self.report(&format!("reload: plugin replaced under {rate} tasks/s"), Value::Object(m));
        Ok(())
    }
}

/// Appends a custom section (id 0) to a Wasm module or component: same code, different bytes.
pub(super) fn append_custom_section(bytes: &mut Vec<u8>, name: &str, data: &[u8]) {
    pub(super) fn leb(mut v: usize, out: &mut Vec<u8>) {
        loop {
            let byte = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(byte);
                break;
            }
            out.push(byte | 0x80);
        }
    }
    let mut body = Vec::new();
    leb(name.len(), &mut body);
    body.extend_from_slice(name.as_bytes());
    body.extend_from_slice(data);
    bytes.push(0);
    leb(body.len(), bytes);
    bytes.extend_from_slice(&body);
}
