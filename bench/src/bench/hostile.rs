//! The `hostile` scenario: ordinary tasks beside plugins that attack the host, whose tasks must all still run.

use super::*;

impl Bench {
    /// Two bursts on the same host: alone, then while a `hostile` type holds all
    /// of its own slots with runs blocked in a host call (cut at a 1 s deadline
    /// and retried at once, so it churns through the burst). Containment means
    /// the hostile type costs the others little: the ratio is the figure.
    pub(super) async fn hostile(&self) -> Result<()> {
        let n = self.burst_size();
        let chaos = find_file(self.args.hostile_plugin.as_deref(), "plugins/testing/chaos.wasm")?;
        let dir = self.work.path.join(format!("hostile-{:x}", rand::random::<u32>()));
        std::fs::create_dir_all(&dir)?;
        let file = dir.join(format!("{HOSTILE}.wasm"));
        std::fs::copy(&chaos, &file).with_context(|| format!("cannot copy {}", chaos.display()))?;
        let hostile: TaskType = HOSTILE.parse().map_err(anyhow::Error::msg)?;
        // What the global limit leaves beside the bench's own type (with the
        // shipped defaults, 512 - 256): a hostile type given all the global
        // slots would starve every other type by configuration, not by escape.
        let slots = match self.concurrency().saturating_sub(self.type_concurrency()) {
            0 => (self.concurrency() / 2).max(1),
            left => left,
        };
        let hostile_config = TypeConfig {
            concurrency: Some(slots),
            timeout: Some(HOSTILE_TIMEOUT),
            max_attempts: Some(1_000_000),
            backoff_base: Some(Duration::from_millis(1)),
            backoff_cap: Some(Duration::from_millis(1)),
            events: Some(false),
            ..TypeConfig::default()
        };
        let types = [(hostile.clone(), hostile_config)];
        redis_ops::unlink(&self.store, &self.all_keys(&hostile)).await?;

        let recorder = Recorder::new(n as usize, usize::from(self.args.hosts));
        let host = self.start_host_with(&recorder, std::slice::from_ref(&file), &types).await?;
        let Burst { rate: alone, lost: lost_a, doubled: doubled_a, .. } = self.one_burst(n, &recorder).await?;
        host.stop().await?;
        self.clear().await?;

        // Twice its slots, so a run cut at its deadline is replaced at once.
        let now = now_ms();
        for i in 0..2 * slots {
            let id = format!("h-{i}");
            self.store.schedule(&hostile, id.as_bytes(), now, Some(b"sleep:3600000"), ScheduleMode::Upsert).await?;
        }
        let recorder = Recorder::new(n as usize, usize::from(self.args.hosts));
        let host = self.start_host_with(&recorder, std::slice::from_ref(&file), &types).await?;
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.store.stats(&hostile).await?.in_flight < slots as u64 {
            if Instant::now() > deadline {
                bail!("the hostile type never filled its {slots} slots");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let before = self.store.stats(&hostile).await?;
        let Burst { rate: beside, lost: lost_b, doubled: doubled_b, .. } = self.one_burst(n, &recorder).await?;
        let after = self.store.stats(&hostile).await?;
        host.stop().await?;
        self.clear().await?;
        redis_ops::unlink(&self.store, &self.all_keys(&hostile)).await?;

        let mut m = self.common();
        m.insert("scenario".into(), json!("hostile"));
        m.insert("tasks".into(), json!(n));
        m.insert("hostile_slots".into(), json!(slots));
        m.insert("hostile_timeout_s".into(), json!(HOSTILE_TIMEOUT.as_secs_f64()));
        m.insert("hostile_runs_cut".into(), json!(after.retried.saturating_sub(before.retried)));
        m.insert("alone_tasks_per_s".into(), json!(alone.round()));
        m.insert("beside_hostile_tasks_per_s".into(), json!(beside.round()));
        m.insert("ratio".into(), json!(round3(beside / alone)));
        m.insert("lost".into(), json!(lost_a + lost_b));
        m.insert("doubled".into(), json!(doubled_a + doubled_b));
        self.report(
            &format!("hostile: burst of {n} beside a type whose every run blocks until its deadline"),
            Value::Object(m),
        );
        Ok(())
    }
}
