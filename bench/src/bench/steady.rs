//! The `steady` and `backlog` scenarios: tasks written at a fixed rate, and due tasks among many waiting ones.

use super::*;

impl Bench {
    pub(super) async fn steady(&self) -> Result<()> {
        let rates = match self.args.rate {
            Some(r) => vec![r],
            None => vec![1_000, 20_000],
        };
        let duration = self.args.duration.unwrap_or(Duration::from_secs(20));
        for rate in rates {
            self.one_steady(rate, duration).await?;
        }
        Ok(())
    }

    /// Writes `rate` tasks/s due evenly over `duration`, staying about a second
    /// ahead of the due times (as an app scheduling near-term work would).
    /// Returns the due time of task 0 (ms) and how many tasks it wrote.
    pub(super) async fn steady_writer(&self, rate: u64, duration: Duration, label: &str) -> Result<(i64, u64)> {
        self.steady_writer_sampled(rate, duration, label, || {}).await
    }

    /// [`Self::steady_writer`], calling `at_quarter` once, when a quarter of the tasks are due.
    pub(super) async fn steady_writer_sampled(
        &self,
        rate: u64,
        duration: Duration,
        label: &str,
        mut at_quarter: impl FnMut(),
    ) -> Result<(i64, u64)> {
        let n = (rate as f64 * duration.as_secs_f64()).round() as u64;
        let t0_us = (now_ms() + 1000) * 1000;
        let due = move |i: u64| (t0_us + (i as i128 * 1_000_000 / rate as i128) as i64) / 1000;
        let mut written = 0;
        let mut quarter_seen = false;
        while written < n {
            if !quarter_seen && now_ms() >= due(n / 4) {
                quarter_seen = true;
                at_quarter();
            }
            let horizon = now_ms() + 1000;
            let mut end = written;
            while end < n && due(end) <= horizon {
                end += 1;
            }
            if end > written {
                self.write_tasks(written..end, due).await?;
                written = end;
            }
            let elapsed = (now_ms() - t0_us / 1000).max(0) as f64 / 1000.0;
            self.progress_line(&format!("{label}: {elapsed:.0}/{:.0} s", duration.as_secs_f64()));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok((t0_us / 1000, n))
    }

    pub(super) async fn one_steady(&self, rate: u64, duration: Duration) -> Result<()> {
        if rate == 0 {
            bail!("--rate must be more than 0");
        }
        let n = (rate as f64 * duration.as_secs_f64()).round() as u64;
        let recorder = Recorder::new(n as usize, usize::from(self.args.hosts));
        let host = self.start_host(&recorder, &[]).await?;
        // RSS once the run is under way, and at its end: what a long run adds.
        let mut rss_quarter = None;
        self.steady_writer_sampled(rate, duration, "steady", || rss_quarter = proc_status_kib("VmRSS:")).await?;
        self.progress_done();
        self.wait_acked(&recorder, n, "steady").await;
        let rss_end = proc_status_kib("VmRSS:");
        host.stop().await?;
        self.clear().await?;
        let (lost, doubled) = recorder.lost_doubled();
        let pct = Lateness::of(&recorder);
        let pct = |p: f64| pct.ms(p);
        let mut m = self.common();
        m.insert("scenario".into(), json!("steady"));
        m.insert("rate".into(), json!(rate));
        m.insert("duration_s".into(), json!(duration.as_secs_f64()));
        m.insert("tasks".into(), json!(n));
        m.insert("lateness_p50_ms".into(), pct(50.0));
        m.insert("lateness_p99_ms".into(), pct(99.0));
        m.insert("lateness_p999_ms".into(), pct(99.9));
        m.insert("lateness_max_ms".into(), pct(100.0));
        // Flat when nothing the host keeps grows with the tasks it has run.
        let growth = rss_quarter.zip(rss_end).map(|(q, e)| e.saturating_sub(q));
        m.insert("rss_growth_mib".into(), mib(growth));
        m.insert("lost".into(), json!(lost));
        m.insert("doubled".into(), json!(doubled));
        self.report(&format!("steady: {rate} tasks/s for {:.0} s", duration.as_secs_f64()), Value::Object(m));
        Ok(())
    }

    pub(super) async fn backlog(&self) -> Result<()> {
        let n = self.burst_size();
        let backlog = self.args.backlog.unwrap_or(10_000_000);

        let recorder = Recorder::new(n as usize, usize::from(self.args.hosts));
        let host = self.start_host(&recorder, &[]).await?;
        let Burst { rate: empty_rate, lost: lost_a, doubled: doubled_a, .. } = self.one_burst(n, &recorder).await?;
        host.stop().await?;
        self.clear().await?;

        // Far-future tasks: ids after the burst's, due in ten years.
        self.progress_line(&format!("backlog: writing {backlog} far-future tasks"));
        let far = now_ms() + 10 * 365 * 24 * 3600 * 1000;
        self.write_tasks(n..n + backlog, |i| far + i as i64).await?;
        self.progress_done();

        let recorder = Recorder::new(n as usize, usize::from(self.args.hosts));
        let host = self.start_host(&recorder, &[]).await?;
        let Burst { rate: full_rate, lost: lost_b, doubled: doubled_b, .. } = self.one_burst(n, &recorder).await?;
        host.stop().await?;
        let mut left = 0u64;
        for s in self.task_types.iter().flat_map(|t| self.store.shards_of(t)) {
            left += redis_ops::zcard(&self.store, &self.store.keys(&s).due).await?;
        }
        self.clear().await?;

        let mut m = self.common();
        m.insert("scenario".into(), json!("backlog"));
        m.insert("tasks".into(), json!(n));
        m.insert("backlog".into(), json!(backlog));
        m.insert("backlog_untouched".into(), json!(left == backlog));
        m.insert("empty_tasks_per_s".into(), json!(empty_rate.round()));
        m.insert("backlog_tasks_per_s".into(), json!(full_rate.round()));
        m.insert("ratio".into(), json!(round3(full_rate / empty_rate)));
        m.insert("lost".into(), json!(lost_a + lost_b));
        m.insert("doubled".into(), json!(doubled_a + doubled_b));
        self.report(&format!("backlog: burst of {n} beside {backlog} far-future tasks"), Value::Object(m));
        Ok(())
    }
}
