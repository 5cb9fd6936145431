//! The `backlog-scale` scenario: millions of scheduled tasks waiting, and what they cost the tasks falling due beside them.
//!
//! One server, one type. In turn: a stream of tasks falling due on an empty
//! queue (lateness), the claim cost of a small set; then N tasks loaded
//! over a day-long window (load time, Redis bytes per task, the claim cost,
//! then bytes again with a payload each); the same stream beside them; the
//! claim cost again (the claims now read a payload hash of N entries); and
//! one instant at which a million tasks fall due at once (drain throughput,
//! Redis and host memory at its peak). The backlog must come out untouched.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use serde_json::{Value, json};

use hourglass::clock::now_ms;
use hourglass::store::ClaimLimits;

use super::{Bench, Burst, Lateness, PIPELINE_COMMANDS, ZADD_CHUNK, mib, proc_status_kib, round3, task_id};
use crate::recorder::Recorder;
use crate::redis_ops;

/// Backlog ids start here, far above any stream or drain id (both count from 0).
const BACKLOG_IDS: u64 = 1 << 44;
/// Claim-cost ids start here.
const CLAIM_IDS: u64 = 1 << 43;
/// Tasks claimed (without a host) to measure the claim script's cost per task.
const CLAIM_TASKS: u64 = 20_000;
/// The backlog falls due over one day, starting an hour from now: never during the run.
const BACKLOG_START: Duration = Duration::from_secs(3600);
const BACKLOG_WINDOW: Duration = Duration::from_secs(24 * 3600);

/// What one stream of tasks falling due measured.
struct Stream {
    lateness: Lateness,
    lost: u64,
    doubled: u64,
}

impl Bench {
    pub(super) async fn backlog_scale(&self) -> Result<()> {
        if self.store.target().is_cluster() {
            bail!("backlog-scale measures one Redis server's memory: run it against a single server, not a cluster");
        }
        if self.task_types.len() != 1 || self.args.shards != 1 {
            bail!("backlog-scale measures one type's backlog in one set: leave out --types and --shards");
        }
        let backlog = self.args.backlog.unwrap_or(10_000_000);
        let rate = self.args.rate.unwrap_or(1_000);
        let duration = self.args.duration.unwrap_or(Duration::from_secs(20));
        let drain = self.args.tasks.unwrap_or(1_000_000);
        let payload_bytes = self.args.payload_bytes.unwrap_or(100);
        if rate == 0 {
            bail!("--rate must be more than 0");
        }
        let t = &self.task_types[0];
        let k = self.store.keys(t);

        let empty = self.stream(rate, duration).await?;
        let claim_empty = self.claim_cost().await?;

        // The backlog: ids far above the others', due times spread evenly over the window.
        let before = redis_ops::used_memory(&self.store).await?;
        self.progress_line(&format!("backlog-scale: loading {backlog} tasks"));
        let start = now_ms() + BACKLOG_START.as_millis() as i64;
        let step = BACKLOG_WINDOW.as_millis() as f64 / backlog.max(1) as f64;
        let loading = Instant::now();
        let ids = BACKLOG_IDS..BACKLOG_IDS + backlog;
        self.write_ids_to(&k.due, ids.clone(), |i| start + ((i - BACKLOG_IDS) as f64 * step) as i64).await?;
        let load_seconds = loading.elapsed().as_secs_f64();
        let loaded = redis_ops::used_memory(&self.store).await?;
        let bytes_per_task = (loaded - before) as f64 / backlog.max(1) as f64;
        // Claims beside the big due set alone, then (below) with its payloads in the hash claims read.
        let claim_backlog = self.claim_cost().await?;
        let with_payload = if payload_bytes > 0 {
            self.progress_line(&format!("backlog-scale: a {payload_bytes}-byte payload for each"));
            let payload = vec![b'x'; payload_bytes];
            let entries = ids.map(|i| (task_id(i), payload.clone()));
            redis_ops::add_payloads(&self.store, &k.payload, entries, ZADD_CHUNK, PIPELINE_COMMANDS).await?;
            let full = redis_ops::used_memory(&self.store).await?;
            json!(((full - before) as f64 / backlog.max(1) as f64).round())
        } else {
            Value::Null
        };
        self.progress_done();

        let beside = self.stream(rate, duration).await?;
        let claim_payloads = if payload_bytes > 0 { json!(round3(self.claim_cost().await?)) } else { Value::Null };
        let drained = self.drain(drain).await?;
        let left = redis_ops::zcard(&self.store, &k.due).await?;
        self.clear().await?;

        let p99_ratio = match (empty.lateness.ms(99.0).as_f64(), beside.lateness.ms(99.0).as_f64()) {
            (Some(e), Some(b)) if e > 0.0 => json!(round3(b / e)),
            _ => Value::Null,
        };
        let mut m = self.common();
        m.insert("scenario".into(), json!("backlog-scale"));
        m.insert("backlog".into(), json!(backlog));
        m.insert("backlog_untouched".into(), json!(left == backlog));
        m.insert("load_seconds".into(), json!(round3(load_seconds)));
        m.insert("load_tasks_per_s".into(), json!((backlog as f64 / load_seconds).round()));
        m.insert("redis_bytes_per_task".into(), json!(bytes_per_task.round()));
        m.insert("payload_bytes".into(), json!(payload_bytes));
        m.insert("redis_bytes_per_task_with_payload".into(), with_payload);
        m.insert("stream_rate".into(), json!(rate));
        m.insert("stream_seconds".into(), json!(duration.as_secs_f64()));
        for (name, stream) in [("empty", &empty), ("backlog", &beside)] {
            m.insert(format!("{name}_lateness_p50_ms"), stream.lateness.ms(50.0));
            m.insert(format!("{name}_lateness_p99_ms"), stream.lateness.ms(99.0));
            m.insert(format!("{name}_lateness_p999_ms"), stream.lateness.ms(99.9));
        }
        m.insert("lateness_p99_ratio".into(), p99_ratio);
        m.insert("empty_claim_redis_us_per_task".into(), json!(round3(claim_empty)));
        m.insert("backlog_claim_redis_us_per_task".into(), json!(round3(claim_backlog)));
        m.insert("claim_cost_ratio".into(), json!(round3(claim_backlog / claim_empty)));
        m.insert("backlog_payloads_claim_redis_us_per_task".into(), claim_payloads.clone());
        m.insert(
            "claim_cost_ratio_with_payloads".into(),
            claim_payloads.as_f64().map_or(Value::Null, |c| json!(round3(c / claim_empty))),
        );
        m.insert("drain_tasks".into(), json!(drain));
        m.insert("drain_tasks_per_s".into(), json!(drained.burst.rate.round()));
        m.insert("drain_redis_peak_mib".into(), mib(Some(drained.redis_peak_bytes.max(0) as u64 / 1024)));
        m.insert("drain_redis_added_peak_mib".into(), mib(Some(drained.redis_added_bytes.max(0) as u64 / 1024)));
        m.insert("drain_host_rss_peak_mib".into(), mib(drained.host_rss_peak_kib));
        m.insert("lost".into(), json!(empty.lost + beside.lost + drained.burst.lost));
        m.insert("doubled".into(), json!(empty.doubled + beside.doubled + drained.burst.doubled));
        self.report(&format!("backlog-scale: {backlog} tasks waiting"), Value::Object(m));
        Ok(())
    }

    /// `rate` tasks/s falling due over `duration` (ids from 0), on a fresh host; the due set keeps whatever else it holds.
    async fn stream(&self, rate: u64, duration: Duration) -> Result<Stream> {
        let n = (rate as f64 * duration.as_secs_f64()).round() as u64;
        let recorder = Recorder::new(n as usize, usize::from(self.args.hosts));
        let host = self.start_host(&recorder, &[]).await?;
        self.steady_writer(rate, duration, "backlog-scale: stream").await?;
        self.progress_done();
        self.wait_acked(&recorder, n, "backlog-scale: stream").await;
        host.stop().await?;
        let (lost, doubled) = recorder.lost_doubled();
        Ok(Stream { lateness: Lateness::of(&recorder), lost, doubled })
    }

    /// Redis script time per task of claims alone (no host running): `CLAIM_TASKS`
    /// tasks due now, claimed `batch_size` at a time until none is left, then
    /// dropped with their leases. The due set keeps whatever else it holds.
    async fn claim_cost(&self) -> Result<f64> {
        let t = &self.task_types[0];
        let k = self.store.keys(t);
        let due = now_ms() - 1;
        self.write_ids_to(&k.due, CLAIM_IDS..CLAIM_IDS + CLAIM_TASKS, |_| due).await?;
        let limits = ClaimLimits { max_tasks: self.batch_size(), ..ClaimLimits::default() };
        let before = redis_ops::server_work(&self.store).await?;
        let mut claimed = 0u64;
        while claimed < CLAIM_TASKS {
            let claim = self.store.claim(t, &limits).await?;
            if claim.tasks.is_empty() {
                bail!("claim-cost: {claimed} of {CLAIM_TASKS} tasks claimed, then none: the due set lost some");
            }
            claimed += claim.tasks.len() as u64;
        }
        let after = redis_ops::server_work(&self.store).await?;
        // The claimed tasks live only in the claim records: deleting them drops them.
        redis_ops::unlink(&self.store, &[k.claims.clone(), k.claimed.clone(), k.attempts.clone()]).await?;
        Ok((after.script_us - before.script_us) / claimed as f64)
    }

    /// `n` tasks due at one instant beside the backlog, with Redis memory and host RSS sampled through the drain.
    async fn drain(&self, n: u64) -> Result<Drained> {
        let recorder = Recorder::new(n as usize, usize::from(self.args.hosts));
        let host = self.start_host(&recorder, &[]).await?;
        let base = redis_ops::used_memory(&self.store).await?;
        let peak = Arc::new(AtomicI64::new(base));
        let rss_peak = Arc::new(AtomicU64::new(0));
        let sampler = {
            let (store, peak, rss_peak) = (self.store.clone(), peak.clone(), rss_peak.clone());
            tokio::spawn(async move {
                loop {
                    if let Ok(used) = redis_ops::used_memory_now(&store).await {
                        peak.fetch_max(used, Ordering::Relaxed);
                    }
                    rss_peak.fetch_max(proc_status_kib("VmRSS:").unwrap_or(0), Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            })
        };
        let burst = self.one_burst(n, &recorder).await;
        sampler.abort();
        host.stop().await?;
        let burst = burst?;
        let redis_peak_bytes = peak.load(Ordering::Relaxed);
        let rss = rss_peak.load(Ordering::Relaxed);
        Ok(Drained {
            burst,
            redis_peak_bytes,
            redis_added_bytes: redis_peak_bytes - base,
            host_rss_peak_kib: (rss > 0).then_some(rss),
        })
    }
}

/// What the drain measured.
struct Drained {
    burst: Burst,
    /// Most Redis `used_memory` seen during the drain (backlog included).
    redis_peak_bytes: i64,
    /// Its peak above what Redis held before the drain's tasks were written.
    redis_added_bytes: i64,
    /// Most resident memory of this process (the host under test) seen during the drain.
    host_rss_peak_kib: Option<u64>,
}
