//! The scenarios: run the host in-process on the `noop` plugin against a Redis, write tasks as a client would, and measure throughput, lateness, footprint and reload time.
//!
//! Long: every scenario and its report, each a method of one `Bench`; they share its set-up and teardown.

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
mod groups;

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
    /// `hostile`'s component, whose `sleep:<ms>` payload blocks in a host call [default: plugins/testing/chaos.wasm].
    #[arg(long, value_name = "PATH")]
    pub hostile_plugin: Option<PathBuf>,
    /// Let one instance serve up to N consecutive tasks (`instance_reuse`) [default: a fresh instance per task].
    #[arg(long, value_name = "N")]
    pub reuse: Option<u32>,
    /// Global and per-type concurrency of the host [default: the config's `[runner]` and `[defaults]` concurrency].
    #[arg(long, value_name = "N")]
    pub concurrency: Option<usize>,
    /// Most tasks per claim [default: the config's `[runner] batch_size`].
    #[arg(long, value_name = "N")]
    pub batch_size: Option<usize>,
    /// Hosts sharing the work, each with its own engine, Redis connection and host id (in this process).
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
    /// Every scenario in turn (but `backlog-scale`).
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

/// Runs `hourglass bench`; `redis_url` is `--redis` or the config's.
///
/// The host runs with `config`'s `[runner]` and `[defaults]` (so a bench
/// measures your settings), on the bench's own plugin folder, types and key
/// prefix, without the admin server.
pub async fn run(args: BenchArgs, config: Config, redis_url: String) -> Result<()> {
    let plugin = find_plugin(args.plugin.as_deref())?;
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

/// A private `redis-server` on a unix socket in a temp folder; killed and removed on drop.
struct SpawnedRedis {
    // Dropped before its folder.
    server: RedisServer,
    _dir: TempDir,
}

impl SpawnedRedis {
    async fn start() -> Result<SpawnedRedis> {
        let dir = TempDir::new("redis")?;
        let spec = ServerSpec { dir: dir.path.clone(), socket: Some("redis.sock".into()), ..ServerSpec::default() };
        let server = tokio::task::spawn_blocking(move || {
            RedisServer::spawn_ready(spec, "--spawn-redis", Duration::from_secs(10))
        })
        .await??;
        Ok(SpawnedRedis { server, _dir: dir })
    }

    fn url(&self) -> String {
        self.server.url()
    }
}

/// A private 3-master Redis Cluster on loopback ports, killed and removed on drop.
struct SpawnedCluster {
    // Dropped before their folder.
    nodes: Vec<RedisServer>,
    _dir: TempDir,
}

impl SpawnedCluster {
    const MASTERS: usize = 3;

    async fn start() -> Result<SpawnedCluster> {
        let dir = TempDir::new("cluster")?;
        let mut nodes: Vec<RedisServer> = Vec::new();
        let mut ports = Vec::new();
        for _ in 0..Self::MASTERS {
            let port = free_cluster_port(&ports)?;
            let spec = ServerSpec {
                dir: dir.path.clone(),
                port: Some(port),
                args: ["--cluster-enabled", "yes", "--cluster-config-file", &format!("nodes-{port}.conf")]
                    .map(String::from)
                    .to_vec(),
                ..ServerSpec::default()
            };
            ports.push(port);
            // Kept as soon as it runs, so a failure below still kills the nodes started so far.
            nodes.push(RedisServer::spawn(spec, "--spawn-cluster")?);
        }
        let nodes = tokio::task::spawn_blocking(move || -> Result<Vec<RedisServer>> {
            for node in &mut nodes {
                node.wait_ready(Duration::from_secs(20))?;
            }
            Ok(nodes)
        })
        .await??;
        let cluster = SpawnedCluster { nodes, _dir: dir };
        let seeds: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let out = tokio::process::Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&seeds)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .await
            .context("--spawn-cluster needs redis-cli (apt-get install redis-tools)")?;
        if !out.status.success() {
            bail!(
                "redis-cli --cluster create failed: {}",
                String::from_utf8_lossy(&out.stdout).lines().last().unwrap_or("")
            );
        }
        let store = Store::connect(&cluster.url(), &PREFIX.parse().map_err(anyhow::Error::msg)?).await?;
        wait_until("the cluster to be ready (cluster_state:ok on every node)", || async {
            redis_ops::cluster_ready(&store).await.ok().filter(|ready| *ready)
        })
        .await?;
        Ok(cluster)
    }

    fn url(&self) -> String {
        let seeds: Vec<String> = self.nodes.iter().filter_map(|n| n.port()).map(|p| format!("127.0.0.1:{p}")).collect();
        format!("redis+cluster://{}", seeds.join(","))
    }
}

/// A free loopback port whose cluster bus port (+10000) is free too.
fn free_cluster_port(taken: &[u16]) -> Result<u16> {
    for _ in 0..100 {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        if port < 55_000 && !taken.contains(&port) && std::net::TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok()
        {
            return Ok(port);
        }
    }
    bail!("no free port pair for a cluster node")
}

/// Polls `check` every 20 ms for up to 20 s.
async fn wait_until<T, F: std::future::Future<Output = Option<T>>>(
    what: &str,
    mut check: impl FnMut() -> F,
) -> Result<T> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(v) = check().await {
            return Ok(v);
        }
        if Instant::now() > deadline {
            bail!("timed out waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A folder under the system temp dir, removed on drop.
struct TempDir {
    path: PathBuf,
}

impl TempDir {
    fn new(what: &str) -> Result<TempDir> {
        let nonce: u64 = rand::random();
        let path = std::env::temp_dir().join(format!("hourglass-bench-{what}-{}-{nonce:x}", std::process::id()));
        std::fs::create_dir_all(&path).with_context(|| format!("cannot create {}", path.display()))?;
        Ok(TempDir { path })
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// The id of task `i`: 16 bytes, as the issue's footprint asks.
fn task_id(i: u64) -> String {
    format!("{i:016x}")
}

/// What one burst measured.
struct Burst {
    rate: f64,
    seconds: f64,
    lost: u64,
    doubled: u64,
    /// Script time in Redis (claims, settles and what they call) per acked task.
    redis_us_per_task: f64,
    /// CPU of the Redis servers per acked task (scripts, network, event loop).
    redis_cpu_us_per_task: f64,
    /// CPU of the busiest master per acked task: one core's worth of it caps throughput.
    busiest_master_cpu_us_per_task: f64,
    /// Scripts run per acked task.
    scripts_per_task: f64,
    /// CPU of this process (the host under test, plus the bench's own few ms) per acked task.
    host_cpu_us_per_task: f64,
    /// Context switches of the host's threads per task.
    context_switches_per_task: f64,
}

impl Burst {
    fn costs(&self, m: &mut serde_json::Map<String, Value>) {
        m.insert("redis_us_per_task".into(), json!(round3(self.redis_us_per_task)));
        m.insert("redis_cpu_us_per_task".into(), json!(round3(self.redis_cpu_us_per_task)));
        m.insert("busiest_master_cpu_us_per_task".into(), json!(round3(self.busiest_master_cpu_us_per_task)));
        m.insert("scripts_per_task".into(), json!(round3(self.scripts_per_task)));
        m.insert("host_cpu_us_per_task".into(), json!(round3(self.host_cpu_us_per_task)));
        m.insert("context_switches_per_task".into(), json!(round3(self.context_switches_per_task)));
    }
}

/// The lateness (start − due) of every task a run started, sorted, µs.
struct Lateness(Vec<i64>);

impl Lateness {
    fn of(recorder: &Recorder) -> Lateness {
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
    fn ms(&self, p: f64) -> Value {
        if self.0.is_empty() {
            return Value::Null;
        }
        let i = ((p / 100.0) * self.0.len() as f64).ceil() as usize;
        json!(round3(self.0[i.clamp(1, self.0.len()) - 1] as f64 / 1000.0))
    }
}

/// CPU time (user + system) this process has used so far, µs, from
/// `/proc/self/stat` (in USER_HZ ticks, which Linux fixes at 100 per second).
fn process_cpu_us() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else { return f64::NAN };
    // The command name (field 2) may hold spaces: count from after its ')'.
    let Some((_, rest)) = stat.rsplit_once(')') else { return f64::NAN };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line: 11 and 12 counted from 0 after the name.
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(f64::NAN);
    (ticks(11) + ticks(12)) * 10_000.0
}

/// Context switches of this process's live threads so far (`/proc/self/task/*/status`):
/// a thread parked for want of work and woken again costs two, so their count per
/// task shows what idle threads cost, which CPU time on a busy machine hides.
fn context_switches() -> f64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return f64::NAN };
    let mut n = 0u64;
    for task in tasks.flatten() {
        let Ok(status) = std::fs::read_to_string(task.path().join("status")) else { continue };
        for line in status.lines() {
            if let Some(v) =
                line.strip_prefix("voluntary_ctxt_switches:").or(line.strip_prefix("nonvoluntary_ctxt_switches:"))
            {
                n += v.trim().parse::<u64>().unwrap_or(0);
            }
        }
    }
    n as f64
}

/// `/proc/loadavg`'s 1-minute figure: other work on the machine skews the numbers.
fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(f64::NAN)
}

/// A field of `/proc/self/status` in KiB (`VmRSS`, `VmHWM`).
fn proc_status_kib(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn mib(kib: Option<u64>) -> Value {
    kib.map_or(Value::Null, |k| json!((k as f64 / 1024.0 * 10.0).round() / 10.0))
}

/// The running in-process hosts (one unless `--hosts`), sharing one plugins folder.
struct Host {
    shutdown: CancellationToken,
    handles: Vec<tokio::task::JoinHandle<Result<()>>>,
    plugins: PathBuf,
}

impl Host {
    async fn stop(self) -> Result<()> {
        self.shutdown.cancel();
        for handle in self.handles {
            handle.await.context("host task panicked")??;
        }
        Ok(())
    }

    /// The error of a host that stopped on its own.
    async fn failed(&mut self) -> Option<anyhow::Error> {
        let i = self.handles.iter().position(|h| h.is_finished())?;
        Some(match self.handles.swap_remove(i).await {
            Ok(Ok(())) => anyhow::anyhow!("a host stopped at start"),
            Ok(Err(e)) => e,
            Err(e) => anyhow::Error::new(e).context("host task panicked"),
        })
    }
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
        Ok(())
    }

    fn report(&self, title: &str, fields: Value) {
        let mut out = std::io::stdout().lock();
        if self.args.json {
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

    /// The host's global concurrency: `--concurrency`, else the config's.
    fn concurrency(&self) -> usize {
        self.args.concurrency.unwrap_or(self.base_config.runner.concurrency)
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
        self.args.worker_threads.map_or_else(|| self.base_config.runner.worker_threads(), usize::from)
    }

    fn common(&self) -> serde_json::Map<String, Value> {
        let mut m = serde_json::Map::new();
        m.insert("worker_threads".into(), json!(self.worker_threads()));
        m.insert("host_threads".into(), json!(host_threads(&self.args, &self.base_config)));
        m.insert("cores".into(), json!(std::thread::available_parallelism().map_or(0, |n| n.get())));
        m.insert("instance_reuse".into(), json!(self.args.reuse.unwrap_or(0)));
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

    /// Starts the host with `noop` (and `extra` plugin files) in a fresh plugins folder.
    async fn start_host(&self, recorder: &Arc<Recorder>, extra: &[PathBuf]) -> Result<Host> {
        self.start_host_with(recorder, extra, &[]).await
    }

    /// [`Self::start_host`], with `types` configured besides the bench's own.
    async fn start_host_with(
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
        let type_config = TypeConfig {
            concurrency: Some(self.type_concurrency()),
            instance_reuse: self.args.reuse,
            plugin: Some(PathBuf::from(format!("{TYPE}.wasm"))),
            shards: Some(self.args.shards),
            ..TypeConfig::default()
        };
        config.types = self.task_types.iter().map(|t| (t.clone(), type_config.clone())).collect();
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
        let deadline = Instant::now() + Duration::from_secs(120);
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
                    redis_ops::add_due(&self.store, &self.store.keys(t).due, warm.into_iter(), ZADD_CHUNK, 1).await?;
                }
            }
            if let Some(e) = host.failed().await {
                host.shutdown.cancel();
                return Err(e);
            }
            if Instant::now() > deadline {
                host.shutdown.cancel();
                bail!("the in-process hosts did not all run warm-up tasks within 120s");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // Let the last warm-up round drain so it does not overlap the measurement.
        while recorder.warm_acks.load(Ordering::Relaxed) < written && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(host)
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
                self.write_ids_to(&self.store.keys(t).due, ids, &due).await?;
                continue;
            }
            let mut per_shard = vec![Vec::new(); shards.len()];
            for i in ids {
                per_shard[usize::from(shard_of(task_id(i).as_bytes(), shards.len() as u16))].push(i);
            }
            for (shard, ids) in shards.iter().zip(per_shard) {
                self.write_ids_to(&self.store.keys(shard).due, ids.into_iter(), &due).await?;
            }
        }
        Ok(())
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

    /// One burst of `n` tasks due at one instant, and what it cost.
    async fn one_burst(&self, n: u64, recorder: &Arc<Recorder>) -> Result<Burst> {
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

    fn burst_size(&self) -> u64 {
        self.args.tasks.unwrap_or(200_000)
    }

    async fn burst(&self) -> Result<()> {
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

    async fn steady(&self) -> Result<()> {
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
    async fn steady_writer(&self, rate: u64, duration: Duration, label: &str) -> Result<(i64, u64)> {
        self.steady_writer_sampled(rate, duration, label, || {}).await
    }

    /// [`Self::steady_writer`], calling `at_quarter` once, when a quarter of the tasks are due.
    async fn steady_writer_sampled(
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

    async fn one_steady(&self, rate: u64, duration: Duration) -> Result<()> {
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

    async fn backlog(&self) -> Result<()> {
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

    /// Two bursts on the same host: alone, then while a `hostile` type holds all
    /// of its own slots with runs blocked in a host call (cut at a 1 s deadline
    /// and retried at once, so it churns through the burst). Containment means
    /// the hostile type costs the others little: the ratio is the figure.
    async fn hostile(&self) -> Result<()> {
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

    /// Every key of type `t`.
    fn all_keys(&self, t: &TaskType) -> Vec<String> {
        self.store.keys(t).fixed().map(str::to_owned).to_vec()
    }

    async fn footprint(&self) -> Result<()> {
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

    async fn reload(&self) -> Result<()> {
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

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// Appends a custom section (id 0) to a Wasm module or component: same code, different bytes.
fn append_custom_section(bytes: &mut Vec<u8>, name: &str, data: &[u8]) {
    fn leb(mut v: usize, out: &mut Vec<u8>) {
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

/// The benchmark's task types: `noop`, `noop-1`, `noop-2`, … On a cluster,
/// types of one shard are picked so that their keys spread evenly over the
/// masters (each type's keys share one slot, so one type alone loads one
/// master); sharded types keep the first names, as their shards' tags
/// spread over the masters by themselves (`task_type::shard_tags`).
async fn bench_types(store: &Store, n: usize, shards: u16) -> Result<Vec<TaskType>> {
    let name = |i: usize| if i == 0 { TYPE.to_owned() } else { format!("{TYPE}-{i}") };
    if !store.target().is_cluster() || shards > 1 {
        return (0..n).map(|i| Ok(name(i).parse::<TaskType>()?)).collect();
    }
    let masters = masters(store).await?;
    let per_master = n.div_ceil(masters.len());
    let mut load = vec![0usize; masters.len()];
    let mut chosen = Vec::with_capacity(n);
    for i in 0..100_000 {
        if chosen.len() == n {
            break;
        }
        let t: TaskType = name(i).parse()?;
        let slot = redis_ops::keyslot(store, &store.keys(&t).due).await?;
        match masters.iter().position(|m| m.slots.iter().any(|r| r.contains(&slot))) {
            Some(m) if load[m] < per_master => load[m] += 1,
            _ => continue,
        }
        chosen.push(t);
    }
    if chosen.len() < n {
        bail!("found no {n} type names that spread evenly over the masters");
    }
    Ok(chosen)
}

/// The masters that serve slots, from `CLUSTER NODES`.
async fn masters(store: &Store) -> Result<Vec<ClusterNode>> {
    let masters: Vec<_> =
        store.cluster_nodes().await?.into_iter().filter(|n| n.master && !n.slots.is_empty()).collect();
    if masters.is_empty() {
        bail!("CLUSTER NODES lists no master serving slots");
    }
    Ok(masters)
}

/// For the report: each type's shards (shard 0 first), their slots and, on a
/// cluster, the master that serves each (`host:port`).
async fn placement(store: &Store, types: &[TaskType]) -> Result<Value> {
    let cluster = store.target().is_cluster();
    let masters = if cluster { masters(store).await? } else { Vec::new() };
    let mut out = serde_json::Map::new();
    for t in types {
        let mut shards = Vec::new();
        for s in store.shards_of(t) {
            // The server's own hash where there is a cluster to ask.
            let slot = if cluster {
                redis_ops::keyslot(store, &store.keys(&s).due).await?
            } else {
                key_slot(s.as_str().as_bytes())
            };
            let master = masters.iter().find(|m| m.slots.iter().any(|r| r.contains(&slot)));
            let master = master.map(|m| format!("{}:{}", m.host, m.port));
            shards.push(json!({ "tag": s.to_string(), "slot": slot, "master": master }));
        }
        out.insert(t.to_string(), Value::Array(shards));
    }
    Ok(Value::Object(out))
}
