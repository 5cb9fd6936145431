//! The scenarios: run the host in-process on the `noop` plugin against a Redis, write tasks as a client would, and measure throughput, lateness, footprint and reload time.
//!
//! Every scenario is a method of one `Bench`, which holds the set-up and
//! teardown they share; each scenario's methods are in a file of its own, and
//! `hosts.rs` starts and stops the hosts they measure.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use hourglass::clock::now_ms;
use hourglass::config::{Config, KeyPrefix, TypeConfig};
use hourglass::host;
use hourglass::redis_server::{RedisServer, ServerSpec};
use hourglass::store::{ClusterNode, ScheduleMode, Store};
use hourglass::task_type::{TaskType, key_slot, shard_of};

use crate::recorder::{HOSTILE, Recorder, now_us};
use crate::redis_ops;

mod backlog_scale;
mod burst;
mod footprint;
mod groups;
mod hostile;
mod hosts;
mod ingest;
mod instance;
mod setup;
mod steady;

use burst::{Burst, Lateness};
use setup::{
    SpawnedCluster, SpawnedRedis, TempDir, bench_types, context_switches, load_average, mib, placement,
    proc_status_kib, process_cpu_us,
};

/// Tasks of a burst, and runs of `instance`, unless `--tasks` says.
const DEFAULT_TASKS: u64 = 200_000;
/// Key prefix of everything the benchmark writes, so it never touches real tasks.
const PREFIX: &str = "hourglass-bench";
/// The task type the benchmark runs (served by the `noop` plugin).
const TYPE: &str = "noop";
/// `hostile`'s deadline: its runs are cut and retried every second during the burst.
const HOSTILE_TIMEOUT: Duration = Duration::from_secs(1);
/// Members per ZADD command and commands per pipeline when writing tasks.
const ZADD_CHUNK: usize = 1000;
const PIPELINE_COMMANDS: usize = 20;
/// A run with no progress for this long is over; what did not finish counts as lost.
const STALL: Duration = Duration::from_secs(30);

/// `hourglass bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// What to measure.
    pub scenario: Scenario,
    /// Start a private redis-server (no persistence, unix socket in a temp dir) and remove it afterwards.
    #[arg(long)]
    pub spawn_redis: bool,
    /// Tasks of a burst [default: 200000; `backlog-scale`'s drain: 1000000].
    #[arg(long, value_name = "N")]
    pub tasks: Option<u64>,
    /// Tasks per second of `steady`, `reload` and `backlog-scale`'s stream [default: 1000, and 20000 as a second `steady` run].
    #[arg(long, value_name = "R")]
    pub rate: Option<u64>,
    /// Length of `steady`, `reload` and `backlog-scale`'s stream: seconds or `20s` [default: 20 s, `reload` 6 s].
    #[arg(long, value_name = "S", value_parser = parse_seconds)]
    pub duration: Option<Duration>,
    /// Far-future tasks in the due set during `backlog` and `backlog-scale` [default: 10000000].
    #[arg(long, value_name = "N")]
    pub backlog: Option<u64>,
    /// Bytes of the payload `backlog-scale` gives each waiting task, measured apart (0: none) [default: 100].
    #[arg(long, value_name = "N")]
    pub payload_bytes: Option<usize>,
    /// ZADDs of `footprint`'s Redis measurement [default: 1000000].
    #[arg(long, value_name = "N")]
    pub footprint_tasks: Option<u64>,
    /// `footprint` on a first start: compile every plugin into an empty cache, report the compile's
    /// peak RSS, and measure idle RSS 20 s after loading (when the allocator has returned what compiling freed).
    #[arg(long)]
    pub cold: bool,
    /// The `noop` component [default: plugins/noop.wasm near the binary or the current folder].
    #[arg(long, value_name = "PATH")]
    pub plugin: Option<PathBuf>,
    /// Runs at once in `instance`: lanes sharing the handler, each one run at a time on the handler
    /// threads (`--worker-threads`): how a run's cost grows when runs share the cores [default: 1].
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub parallel: u16,
    /// Each task's payload: each run's in `instance`, and written with every task of `burst` (and the
    /// other scenarios that write tasks) beside its due time (your plugin's input, e.g. '{"order_id": 1}') [default: none].
    #[arg(long, value_name = "TEXT")]
    pub payload: Option<String>,
    /// `hostile`'s component, whose `sleep:<ms>` payload blocks in a host call [default: plugins/testing/chaos.wasm].
    #[arg(long, value_name = "PATH")]
    pub hostile_plugin: Option<PathBuf>,
    /// Let one instance serve up to N consecutive tasks (`instance_reuse`) [default: a fresh state per task].
    #[arg(long, value_name = "N")]
    pub reuse: Option<u32>,
    /// Instantiate for every task (`instance_reset = false`) instead of resetting a kept instance [default: reset].
    #[arg(long)]
    pub no_reset: bool,
    /// Global and per-type concurrency of the host [default: the config's `[runner]` and `[defaults]` concurrency].
    #[arg(long, value_name = "N")]
    pub concurrency: Option<usize>,
    /// Most tasks per claim [default: the config's `[runner] batch_size`].
    #[arg(long, value_name = "N")]
    pub batch_size: Option<usize>,
    /// Hosts sharing the work, each with its own engine, Redis connection and host id (in this process);
    /// in `instance`, engines sharing the lanes and the handler threads (each reserves its pool's address
    /// space: many need a smaller `--concurrency`).
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub hosts: u16,
    /// Task types the tasks are spread over, all served by `noop`; on a cluster their keys are spread over the masters.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub types: u16,
    /// Shards of each bench type (`[types.T] shards`); their tags land on different masters of an
    /// evenly split cluster by themselves (the report's `placement` says where each landed).
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub shards: u16,
    /// Start a private 3-master Redis Cluster (loopback ports, no persistence) and remove it afterwards.
    #[arg(long, conflicts_with = "spawn_redis")]
    pub spawn_cluster: bool,
    /// Threads that run handlers in each host (`[runner] worker_threads`) [default: the config's, else
    /// the machine's cores up to 8].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=256))]
    pub worker_threads: Option<u16>,
    /// Threads of the runtime the hosts' own work (claims, settles, Redis) runs on [default: the config's
    /// `[runner] host_threads`, else the machine's cores up to 4].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=256))]
    pub host_threads: Option<u16>,
    /// Print one JSON object per scenario run instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// The benchmark scenarios.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Scenario {
    /// N tasks due at one instant: drain throughput.
    Burst,
    /// R tasks/s over S seconds: lateness percentiles.
    Steady,
    /// A burst while millions of far-future tasks sit in the same set, as a ratio to the empty burst.
    Backlog,
    /// Redis bytes per task, host RSS at start, idle and at the peak of a burst (`--cold`: on a first start).
    Footprint,
    /// Time from renaming a new plugin into place to the first task it serves, under load.
    Reload,
    /// A burst beside a hostile type whose every run blocks in a host call until its deadline, as a ratio to the burst alone.
    Hostile,
    /// A burst whose every task is a workflow group's child, beside the plain burst: cost per child in Redis time and bytes.
    Groups,
    /// N tasks waiting (10 M unless --backlog): Redis bytes per task, load time, the lateness of a stream
    /// falling due beside them and the claim cost, each against an empty queue, and a drain of 1 M due at one
    /// instant. Not part of `all`: the default run takes minutes and about 3 GB of Redis memory.
    BacklogScale,
    /// One plugin's runs one at a time, no Redis: a new instance each, a kept one reset after each (the default)
    /// and `--reuse` (64 unless given): the host CPU a new instance and a reset cost.
    Instance,
    /// What scheduling costs Redis per task (`INFO cpu`) and tasks/s, side by side: raw ZADD+HSET, `Store::schedule_many`,
    /// `hourglass schedule-many`, the Python and Node clients against their raw pipelines, BullMQ's `addBulk`, follow-ups,
    /// group children and graph nodes (100,000 tasks unless --tasks, 3 rounds). One server only; not part of `all`:
    /// it runs the clients' interpreters.
    Ingest,
    /// Every scenario in turn (but `backlog-scale` and `ingest`).
    All,
}

fn parse_seconds(s: &str) -> Result<Duration, String> {
    if let Ok(secs) = s.parse::<f64>() {
        return if secs > 0.0 { Ok(Duration::from_secs_f64(secs)) } else { Err("must be more than 0".into()) };
    }
    humantime::parse_duration(s).map_err(|e| format!("not seconds or a duration (like 20 or 20s): {e}"))
}

/// Threads of the runtime the in-process hosts run on: `--host-threads`, else the config's.
pub fn host_threads(args: &BenchArgs, config: &Config) -> usize {
    args.host_threads.map_or_else(|| config.runner.host_threads(), usize::from)
}

/// Each host's handler threads: `--worker-threads`, else the config's, else the default.
fn worker_threads(args: &BenchArgs, config: &Config) -> usize {
    args.worker_threads.map_or_else(|| config.runner.worker_threads(), usize::from)
}

/// The host's global concurrency: `--concurrency`, else the config's.
fn concurrency(args: &BenchArgs, config: &Config) -> usize {
    args.concurrency.unwrap_or(config.runner.concurrency)
}

/// Runs `hourglass bench`; `redis_url` is `--redis` or the config's.
///
/// The host runs with `config`'s `[runner]` and `[defaults]` (so a bench
/// measures your settings), on the bench's own plugin folder, types and key
/// prefix, without the admin server.
pub async fn run(args: BenchArgs, config: Config, redis_url: String) -> Result<()> {
    let plugin = find_plugin(args.plugin.as_deref())?;
    if matches!(args.scenario, Scenario::Instance | Scenario::All) {
        instance::instance(&args, &config, &plugin).await?;
        if args.scenario == Scenario::Instance {
            // Needs no Redis.
            return Ok(());
        }
    }
    let spawned = if args.spawn_redis { Some(SpawnedRedis::start().await?) } else { None };
    let cluster = if args.spawn_cluster { Some(SpawnedCluster::start().await?) } else { None };
    let url = spawned
        .as_ref()
        .map(SpawnedRedis::url)
        .or_else(|| cluster.as_ref().map(SpawnedCluster::url))
        .unwrap_or(redis_url);
    let bench = Bench::new(args, config, url, plugin).await?;
    let result = bench.run_all().await;
    bench.cleanup().await;
    drop(spawned);
    drop(cluster);
    result
}

/// `plugins/noop.wasm` next to the binary's workspace or the current folder, or `--plugin`.
fn find_plugin(given: Option<&Path>) -> Result<PathBuf> {
    find_file(given, "plugins/noop.wasm")
}

/// `given` if it exists, else `relative` in the current folder or up to four above the binary.
fn find_file(given: Option<&Path>, relative: &str) -> Result<PathBuf> {
    if let Some(p) = given {
        if p.is_file() {
            return Ok(p.to_owned());
        }
        bail!("plugin {} does not exist (build it with bash plugins/build.sh)", p.display());
    }
    let mut candidates = vec![PathBuf::from(relative)];
    if let Ok(exe) = std::env::current_exe() {
        // target/{release,debug}/hourglass → the workspace root is three levels up.
        for dir in exe.ancestors().skip(1).take(4) {
            candidates.push(dir.join(relative));
        }
    }
    candidates.into_iter().find(|p| p.is_file()).with_context(|| {
        format!("{relative} not found near the binary or in the current folder: build it with bash plugins/build.sh, or give its path")
    })
}

/// The id of task `i`: 16 bytes, as the issue's footprint asks.
fn task_id(i: u64) -> String {
    format!("{i:016x}")
}

struct Bench {
    args: BenchArgs,
    /// What the host runs with, before the bench's own overrides.
    base_config: Config,
    url: String,
    plugin: PathBuf,
    store: Store,
    /// The types tasks are spread over: task `i` is of type `i % len`.
    task_types: Vec<TaskType>,
    /// Where each type's shards landed (see [`placement`]), for the report.
    placement: Value,
    work: TempDir,
    progress: bool,
}

impl Bench {
    async fn new(args: BenchArgs, base_config: Config, url: String, plugin: PathBuf) -> Result<Bench> {
        let prefix: KeyPrefix = PREFIX.parse().map_err(anyhow::Error::msg)?;
        let store = Store::connect(&url, &prefix).await?;
        let progress = std::io::stderr().is_terminal();
        let task_types = bench_types(&store, usize::from(args.types), args.shards).await?;
        // The bench writes each task into its shard, as an application would.
        let store = store.with_shards(task_types.iter().filter(|_| args.shards > 1).map(|t| (t, args.shards)));
        let placement = placement(&store, &task_types).await?;
        let work = TempDir::new("host")?;
        let bench = Bench { args, base_config, url, plugin, store, task_types, placement, work, progress };
        bench.clear().await?;
        Ok(bench)
    }

    async fn run_all(&self) -> Result<()> {
        let s = self.args.scenario;
        if matches!(s, Scenario::Burst | Scenario::All) {
            self.burst().await?;
        }
        if matches!(s, Scenario::Steady | Scenario::All) {
            self.steady().await?;
        }
        if matches!(s, Scenario::Backlog | Scenario::All) {
            self.backlog().await?;
        }
        if matches!(s, Scenario::Footprint | Scenario::All) {
            self.footprint().await?;
        }
        if matches!(s, Scenario::Reload | Scenario::All) {
            self.reload().await?;
        }
        if matches!(s, Scenario::Hostile | Scenario::All) {
            self.hostile().await?;
        }
        if matches!(s, Scenario::Groups | Scenario::All) {
            self.groups().await?;
        }
        if s == Scenario::BacklogScale {
            self.backlog_scale().await?;
        }
        if s == Scenario::Ingest {
            self.ingest().await?;
        }
        Ok(())
    }

    fn report(&self, title: &str, fields: Value) {
        report(self.args.json, title, fields);
    }

    /// The host's global concurrency: `--concurrency`, else the config's.
    fn concurrency(&self) -> usize {
        concurrency(&self.args, &self.base_config)
    }

    /// Each bench type's concurrency: `--concurrency`, else the config's `[defaults]`.
    fn type_concurrency(&self) -> usize {
        self.args.concurrency.unwrap_or(self.base_config.defaults.concurrency)
    }

    fn batch_size(&self) -> usize {
        self.args.batch_size.unwrap_or(self.base_config.runner.batch_size)
    }

    /// Each host's handler threads: `--worker-threads`, else the config's, else the default.
    fn worker_threads(&self) -> usize {
        worker_threads(&self.args, &self.base_config)
    }

    fn common(&self) -> serde_json::Map<String, Value> {
        let mut m = serde_json::Map::new();
        m.insert("worker_threads".into(), json!(self.worker_threads()));
        m.insert("host_threads".into(), json!(host_threads(&self.args, &self.base_config)));
        m.insert("cores".into(), json!(std::thread::available_parallelism().map_or(0, |n| n.get())));
        m.insert("instance_reuse".into(), json!(self.args.reuse.unwrap_or(0)));
        m.insert("instance_reset".into(), json!(!self.args.no_reset));
        m.insert("concurrency".into(), json!(self.concurrency()));
        m.insert("type_concurrency".into(), json!(self.type_concurrency()));
        m.insert("batch_size".into(), json!(self.batch_size()));
        m.insert("hosts".into(), json!(self.args.hosts));
        m.insert("types".into(), json!(self.task_types.len()));
        m.insert("shards".into(), json!(self.args.shards));
        m.insert("type_names".into(), json!(self.task_types.iter().map(ToString::to_string).collect::<Vec<_>>()));
        m.insert("placement".into(), self.placement.clone());
        m.insert("redis".into(), json!(if self.store.target().is_cluster() { "cluster" } else { "single" }));
        m.insert("load_average".into(), json!(load_average()));
        m
    }

    /// Deletes every key of the benchmark types (one command per type: one slot each).
    async fn clear(&self) -> Result<()> {
        for s in self.task_types.iter().flat_map(|t| self.store.shards_of(t)) {
            redis_ops::unlink(&self.store, &self.all_keys(&s)).await?;
        }
        redis_ops::unlink(&self.store, &[format!("{PREFIX}:{{footprint}}:due")]).await
    }

    async fn cleanup(&self) {
        let _ = self.clear().await;
    }

    /// Writes tasks `range` due at `due(i)`, task `i` into type `i % types`,
    /// with pipelined multi-member ZADDs (one pipeline per type: one slot each).
    async fn write_tasks(&self, range: std::ops::Range<u64>, due: impl Fn(u64) -> i64) -> Result<()> {
        let types = self.task_types.len() as u64;
        for (k, t) in self.task_types.iter().enumerate() {
            let first = range.start + (k as u64 + types - range.start % types) % types;
            let ids = (first..range.end).step_by(types as usize);
            let shards = self.store.shards_of(t);
            if shards.len() == 1 {
                self.write_queue(t, ids, &due).await?;
                continue;
            }
            let mut per_shard = vec![Vec::new(); shards.len()];
            for i in ids {
                per_shard[usize::from(shard_of(task_id(i).as_bytes(), shards.len() as u16))].push(i);
            }
            for (shard, ids) in shards.iter().zip(per_shard) {
                self.write_queue(shard, ids.into_iter(), &due).await?;
            }
        }
        Ok(())
    }

    /// Tasks `ids` of type (or shard) `q`: their payloads first when `--payload` is given, then their due times.
    async fn write_queue(
        &self,
        q: &TaskType,
        ids: impl Iterator<Item = u64> + Clone,
        due: impl Fn(u64) -> i64,
    ) -> Result<()> {
        let keys = self.store.keys(q);
        if let Some(payload) = &self.args.payload {
            let bodies = ids.clone().map(|j| (task_id(j), payload.as_bytes().to_vec()));
            redis_ops::add_payloads(&self.store, &keys.payload, bodies, ZADD_CHUNK, PIPELINE_COMMANDS).await?;
        }
        self.write_ids_to(&keys.due, ids, due).await
    }

    async fn write_ids_to(&self, key: &str, ids: impl Iterator<Item = u64>, due: impl Fn(u64) -> i64) -> Result<()> {
        redis_ops::add_due(&self.store, key, ids.map(|j| (due(j), task_id(j))), ZADD_CHUNK, PIPELINE_COMMANDS).await
    }

    /// Waits until `n` tasks are acked (or nothing moves for a while); shows progress on a terminal.
    async fn wait_acked(&self, recorder: &Recorder, n: u64, label: &str) {
        let started = Instant::now();
        let mut last = (0, Instant::now());
        let mut shown = Instant::now();
        loop {
            let done = recorder.acked_total.load(Ordering::Relaxed);
            if done >= n {
                break;
            }
            if done != last.0 {
                last = (done, Instant::now());
            } else if last.1.elapsed() > STALL {
                break;
            }
            if self.progress
                && started.elapsed() > Duration::from_secs(2)
                && shown.elapsed() > Duration::from_millis(250)
            {
                eprint!("\r{label}: {done}/{n} done   ");
                shown = Instant::now();
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        if self.progress && started.elapsed() > Duration::from_secs(2) {
            eprint!("\r{:60}\r", "");
        }
        // Give a duplicate a moment to show itself.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    fn progress_line(&self, text: &str) {
        if self.progress {
            eprint!("\r{text:60}");
        }
    }

    fn progress_done(&self) {
        if self.progress {
            eprint!("\r{:60}\r", "");
        }
    }
}

/// Prints one scenario's result: a JSON line with `--json`, else a table under `title`.
fn report(json: bool, title: &str, fields: Value) {
    let mut out = std::io::stdout().lock();
    if json {
        let _ = writeln!(out, "{fields}");
    } else {
        let _ = writeln!(out, "{title}");
        if let Value::Object(map) = &fields {
            for (k, v) in map {
                let shown = match v {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                let _ = writeln!(out, "  {k:<24} {shown}");
            }
        }
        let _ = writeln!(out);
    }
    let _ = out.flush();
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}
