//! Where a scenario runs: a spawned Redis or cluster, a temp folder, where the types' keys land, and what /proc says of this process.

use super::*;

/// A private `redis-server` on a unix socket in a temp folder; killed and removed on drop.
pub(super) struct SpawnedRedis {
    // Dropped before its folder.
    pub(super) server: RedisServer,
    pub(super) _dir: TempDir,
}

impl SpawnedRedis {
    pub(super) async fn start() -> Result<SpawnedRedis> {
        let dir = TempDir::new("redis")?;
        let spec = ServerSpec { dir: dir.path.clone(), socket: Some("redis.sock".into()), ..ServerSpec::default() };
        let server = tokio::task::spawn_blocking(move || {
            RedisServer::spawn_ready(spec, "--spawn-redis", Duration::from_secs(10))
        })
        .await??;
        Ok(SpawnedRedis { server, _dir: dir })
    }

    pub(super) fn url(&self) -> String {
        self.server.url()
    }
}

/// A private 3-master Redis Cluster on loopback ports, killed and removed on drop.
pub(super) struct SpawnedCluster {
    // Dropped before their folder.
    pub(super) nodes: Vec<RedisServer>,
    pub(super) _dir: TempDir,
}

impl SpawnedCluster {
    const MASTERS: usize = 3;

    pub(super) async fn start() -> Result<SpawnedCluster> {
        let dir = TempDir::new("cluster")?;
        let path = dir.path.clone();
        let (nodes, ports) = tokio::task::spawn_blocking(move || -> Result<(Vec<RedisServer>, Vec<u16>)> {
            // Kept as soon as it runs, so a failure below still kills the nodes started so far.
            let mut nodes: Vec<RedisServer> = Vec::new();
            let mut ports = Vec::new();
            for _ in 0..Self::MASTERS {
                let mut tries = 0;
                loop {
                    let port = free_cluster_port(&ports)?;
                    let spec = ServerSpec {
                        dir: path.clone(),
                        port: Some(port),
                        args: ["--cluster-enabled", "yes", "--cluster-config-file", &format!("nodes-{port}.conf")]
                            .map(String::from)
                            .to_vec(),
                        ..ServerSpec::default()
                    };
                    let mut node = RedisServer::spawn(spec, "--spawn-cluster")?;
                    match node.wait_ready(Duration::from_secs(20)) {
                        Ok(()) => {
                            ports.push(port);
                            nodes.push(node);
                            break;
                        }
                        // The probe releases the port before redis-server binds it: another
                        // process on the machine may take it (or its bus port) in between.
                        Err(_) if tries < 3 => tries += 1,
                        Err(e) => return Err(e),
                    }
                }
            }
            Ok((nodes, ports))
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

    pub(super) fn url(&self) -> String {
        let seeds: Vec<String> = self.nodes.iter().filter_map(|n| n.port()).map(|p| format!("127.0.0.1:{p}")).collect();
        format!("redis+cluster://{}", seeds.join(","))
    }
}

/// A free loopback port whose cluster bus port (+10000) is free too.
pub(super) fn free_cluster_port(taken: &[u16]) -> Result<u16> {
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
pub(super) async fn wait_until<T, F: std::future::Future<Output = Option<T>>>(
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
pub(super) struct TempDir {
    pub(super) path: PathBuf,
}

impl TempDir {
    pub(super) fn new(what: &str) -> Result<TempDir> {
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

/// CPU time (user + system) this process has used so far, µs, from its
/// CPU clock (to the ns: `/proc/self/stat` counts 10 ms ticks, too coarse
/// for short runs).
pub(super) fn process_cpu_us() -> f64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    t.tv_sec as f64 * 1e6 + t.tv_nsec as f64 / 1e3
}

/// Context switches of this process's live threads so far (`/proc/self/task/*/status`):
/// a thread parked for want of work and woken again costs two, so their count per
/// task shows what idle threads cost, which CPU time on a busy machine hides.
pub(super) fn context_switches() -> f64 {
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
pub(super) fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(f64::NAN)
}

/// A field of `/proc/self/status` in KiB (`VmRSS`, `VmHWM`).
pub(super) fn proc_status_kib(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

pub(super) fn mib(kib: Option<u64>) -> Value {
    kib.map_or(Value::Null, |k| json!((k as f64 / 1024.0 * 10.0).round() / 10.0))
}

/// The benchmark's task types: `noop`, `noop-1`, `noop-2`, … On a cluster,
/// types of one shard are picked so that their keys spread evenly over the
/// masters (each type's keys share one slot, so one type alone loads one
/// master); sharded types keep the first names, as their shards' tags
/// spread over the masters by themselves (`task_type::shard_tags`).
pub(super) async fn bench_types(store: &Store, n: usize, shards: u16) -> Result<Vec<TaskType>> {
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
pub(super) async fn masters(store: &Store) -> Result<Vec<ClusterNode>> {
    let masters: Vec<_> =
        store.cluster_nodes().await?.into_iter().filter(|n| n.master && !n.slots.is_empty()).collect();
    if masters.is_empty() {
        bail!("CLUSTER NODES lists no master serving slots");
    }
    Ok(masters)
}

/// For the report: each type's shards (shard 0 first), their slots and, on a
/// cluster, the master that serves each (`host:port`).
pub(super) async fn placement(store: &Store, types: &[TaskType]) -> Result<Value> {
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
