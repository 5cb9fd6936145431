//! The `burst` scenario: a backlog of due tasks drained as fast as the host can, with what each task cost.

use super::*;

/// What one burst measured.
pub(super) struct Burst {
    pub(super) rate: f64,
    pub(super) seconds: f64,
    pub(super) lost: u64,
    pub(super) doubled: u64,
    /// Script time in Redis (claims, settles and what they call) per acked task.
    pub(super) redis_us_per_task: f64,
    /// CPU of the Redis servers per acked task (scripts, network, event loop).
    pub(super) redis_cpu_us_per_task: f64,
    /// CPU of the busiest master per acked task: one core's worth of it caps throughput.
    pub(super) busiest_master_cpu_us_per_task: f64,
    /// Scripts run per acked task.
    pub(super) scripts_per_task: f64,
    /// CPU of this process (the host under test, plus the bench's own few ms) per acked task.
    pub(super) host_cpu_us_per_task: f64,
    /// Context switches of the host's threads per task.
    pub(super) context_switches_per_task: f64,
}

impl Burst {
    pub(super) fn costs(&self, m: &mut serde_json::Map<String, Value>) {
        m.insert("redis_us_per_task".into(), json!(round3(self.redis_us_per_task)));
        m.insert("redis_cpu_us_per_task".into(), json!(round3(self.redis_cpu_us_per_task)));
        m.insert("busiest_master_cpu_us_per_task".into(), json!(round3(self.busiest_master_cpu_us_per_task)));
        m.insert("scripts_per_task".into(), json!(round3(self.scripts_per_task)));
        m.insert("host_cpu_us_per_task".into(), json!(round3(self.host_cpu_us_per_task)));
        m.insert("context_switches_per_task".into(), json!(round3(self.context_switches_per_task)));
    }
}

/// The lateness (start − due) of every task a run started, sorted, µs.
pub(super) struct Lateness(Vec<i64>);

impl Lateness {
    pub(super) fn of(recorder: &Recorder) -> Lateness {
        let mut us: Vec<i64> = recorder
            .lateness_us
            .iter()
            .zip(&recorder.starts)
            .filter(|(_, s)| s.load(Ordering::Relaxed) > 0)
            .map(|(l, _)| l.load(Ordering::Relaxed))
            .collect();
        us.sort_unstable();
        Lateness(us)
    }

    /// The `p`th percentile in ms (nearest rank), or null when nothing started.
    pub(super) fn ms(&self, p: f64) -> Value {
        if self.0.is_empty() {
            return Value::Null;
        }
        let i = ((p / 100.0) * self.0.len() as f64).ceil() as usize;
        json!(round3(self.0[i.clamp(1, self.0.len()) - 1] as f64 / 1000.0))
    }
}

impl Bench {
    /// One burst of `n` tasks due at one instant, and what it cost.
    pub(super) async fn one_burst(&self, n: u64, recorder: &Arc<Recorder>) -> Result<Burst> {
        // Due after the writes are done, so the drain starts at a known instant.
        let lead_ms = 500 + (n as i64) / 100;
        let due = now_ms() + lead_ms;
        self.write_tasks(0..n, |_| due).await?;
        if now_ms() >= due {
            eprintln!("warning: writing the burst took longer than its {lead_ms} ms lead; the drain started early");
        }
        // From here on the servers and this process do the drain's work (and little else).
        let server_before = redis_ops::server_work(&self.store).await?;
        let (cpu_before, switches_before) = (process_cpu_us(), context_switches());
        self.wait_acked(recorder, n, "burst").await;
        let (cpu_after, switches_after) = (process_cpu_us(), context_switches());
        let server_after = redis_ops::server_work(&self.store).await?;
        let (lost, doubled) = recorder.lost_doubled();
        let seconds = (recorder.last_ack_us.load(Ordering::Relaxed) - due * 1000) as f64 / 1e6;
        let acked = n - lost;
        let per_task = |us: f64| if acked > 0 { us / acked as f64 } else { f64::NAN };
        Ok(Burst {
            rate: if seconds > 0.0 { acked as f64 / seconds } else { f64::NAN },
            seconds,
            lost,
            doubled,
            redis_us_per_task: per_task(server_after.script_us - server_before.script_us),
            redis_cpu_us_per_task: per_task(server_after.cpu_us - server_before.cpu_us),
            busiest_master_cpu_us_per_task: per_task(
                server_after
                    .cpu_us_by_master
                    .iter()
                    .map(|(addr, after)| after - server_before.cpu_us_by_master.get(addr).copied().unwrap_or(0.0))
                    .fold(0.0, f64::max),
            ),
            scripts_per_task: per_task((server_after.script_calls - server_before.script_calls) as f64),
            host_cpu_us_per_task: per_task(cpu_after - cpu_before),
            context_switches_per_task: per_task(switches_after - switches_before),
        })
    }

    pub(super) fn burst_size(&self) -> u64 {
        self.args.tasks.unwrap_or(DEFAULT_TASKS)
    }

    pub(super) async fn burst(&self) -> Result<()> {
        let n = self.burst_size();
        let recorder = Recorder::new(n as usize, usize::from(self.args.hosts));
        let host = self.start_host(&recorder, &[]).await?;
        let burst = self.one_burst(n, &recorder).await?;
        host.stop().await?;
        self.clear().await?;
        let mut m = self.common();
        m.insert("scenario".into(), json!("burst"));
        m.insert("tasks".into(), json!(n));
        m.insert("seconds".into(), json!(round3(burst.seconds)));
        m.insert("tasks_per_s".into(), json!(burst.rate.round()));
        burst.costs(&mut m);
        if self.args.hosts > 1 {
            m.insert("acked_per_host".into(), json!(recorder.per_host()));
        }
        m.insert("lost".into(), json!(burst.lost));
        m.insert("doubled".into(), json!(burst.doubled));
        self.report(&format!("burst: {n} tasks due at one instant"), Value::Object(m));
        Ok(())
    }
}
