//! `runner.toml`: the host's configuration, parsed from a string and validated.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use bytesize::ByteSize;
use serde::Deserialize;

use crate::task_type::TaskType;

mod policy;
mod telemetry;

pub use crate::recurring::{RecurringConfig, RecurringName};
pub use hourglass_store::{KeyPrefix, Rate, RedisConfig};
pub use policy::{TypeConfig, TypePolicy};
pub use telemetry::{TelemetryConfig, traces_url};

/// The whole `runner.toml`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Where Redis is and how keys are named.
    #[serde(default)]
    pub redis: RedisConfig,
    /// How the runner claims and runs tasks.
    #[serde(default)]
    pub runner: RunnerConfig,
    /// Policy and limits that every task type gets unless it overrides them.
    #[serde(default)]
    pub defaults: TypePolicy,
    /// Per task type: which plugin handles it, and overrides of `defaults`.
    #[serde(default)]
    pub types: BTreeMap<TaskType, TypeConfig>,
    /// The admin HTTP server: health, metrics and the dashboard.
    #[serde(default)]
    pub admin: AdminConfig,
    /// Recurring schedules: each fires tasks of its type by a cron expression or an interval.
    #[serde(default)]
    pub schedules: BTreeMap<RecurringName, RecurringConfig>,
    /// Traces (opt-in): where to send one span per run.
    #[serde(default)]
    pub telemetry: TelemetryConfig,
    /// The `[admin]` keys the file wrote, to say when they do nothing ([`Config::ineffective_keys`]).
    #[serde(skip)]
    admin_written: Vec<&'static str>,
}

/// The `[admin]` table.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    /// Serve `/healthz`, `/readyz`, `/metrics` and the dashboard at `/`.
    pub enabled: bool,
    /// Address to listen on; a port of 0 picks a free one (logged at start).
    pub listen: std::net::SocketAddr,
    /// Secret that the dashboard's actions (re-queue, purge, run now, postpone, cancel) must carry; required when `listen` is not loopback.
    pub token: Option<String>,
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig { enabled: false, listen: std::net::SocketAddr::from(([127, 0, 0, 1], 9090)), token: None }
    }
}

impl AdminConfig {
    fn validate(&self) -> Result<()> {
        if let Some(token) = &self.token
            && (token.len() < 8 || token.chars().any(char::is_whitespace))
        {
            bail!("admin.token must be at least 8 characters, without whitespace");
        }
        if self.enabled && !self.listen.ip().is_loopback() && self.token.is_none() {
            bail!(
                "admin.listen = \"{}\" is not a loopback address: set admin.token, or listen on 127.0.0.1",
                self.listen
            );
        }
        Ok(())
    }
}

/// What `hourglass run`'s flags change of the config file: applied at
/// start and again to every edited file, so a reload neither undoes them
/// nor reports them as changes waiting for a restart.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overrides {
    /// `--plugins`: wins over `[runner] plugins_dir`.
    pub plugins_dir: Option<PathBuf>,
    /// `--admin-listen`: wins over `[admin] listen`, and turns the admin server on.
    pub admin_listen: Option<std::net::SocketAddr>,
    /// `--redis` / `HOURGLASS_REDIS_URL`: wins over `[redis] url` and `cluster`.
    pub redis_url: Option<String>,
}

impl Overrides {
    /// Applies them to `config`; an address the admin server may not use
    /// (not loopback, and no `admin.token`) is an error naming the flag.
    pub fn apply(&self, config: &mut Config) -> Result<()> {
        if let Some(dir) = &self.plugins_dir {
            config.runner.plugins_dir.clone_from(dir);
        }
        if let Some(url) = &self.redis_url {
            // As `Target::resolve` reads it: the flag's URL replaces the file's url and cluster.
            config.redis.url.clone_from(url);
            config.redis.cluster.clear();
        }
        if let Some(listen) = self.admin_listen {
            config.admin.enabled = true;
            config.admin.listen = listen;
            config.admin.validate().context("--admin-listen (HOURGLASS_ADMIN_LISTEN)")?;
        }
        Ok(())
    }
}

/// The config file a host watches, and the flags that win over it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigFile {
    /// The file.
    pub path: PathBuf,
    /// What `hourglass run`'s flags change of it.
    pub overrides: Overrides,
}

/// How the runner wakes up for due tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WakeupMode {
    /// Keyspace notifications when the server has them or lets us turn them on, else polling.
    Auto,
    /// Keyspace notifications only; fail at start if they cannot be enabled.
    Notify,
    /// Poll every `poll_interval`.
    Poll,
}

/// The `[runner]` table.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RunnerConfig {
    /// Folder with the `*.wasm` handlers, relative to the config file; `--plugins` wins over it.
    pub plugins_dir: PathBuf,
    /// Folder for compiled plugins, so restarts do not recompile; relative to the config file.
    pub cache_dir: PathBuf,
    /// Most tasks in hand at once (claimed and not yet settled), over all types.
    pub concurrency: usize,
    /// Most tasks one claim takes from Redis (never more than half of the type's `concurrency`).
    pub batch_size: usize,
    /// How long a claimed task is leased before another host may take it (extended while it runs).
    #[serde(with = "humantime_serde")]
    pub lease: Duration,
    /// On SIGTERM: how long running tasks may take to finish before their leases are handed back.
    #[serde(with = "humantime_serde")]
    pub grace_period: Duration,
    /// `auto`, `notify` or `poll`: how the runner learns that a task was scheduled sooner.
    pub wakeup: WakeupMode,
    /// Poll interval when keyspace notifications are not in use.
    #[serde(with = "humantime_serde")]
    pub poll_interval: Duration,
    /// This host's id in `hourglass stats` and in the leases it holds [default: `<hostname>-<pid>`].
    pub host_id: Option<String>,
    /// Larger plugin files are refused before they are read.
    pub max_plugin_size: ByteSize,
    /// Most memory (address space) the child process that compiles one plugin may take; past it the plugin is refused.
    pub compile_memory_limit: ByteSize,
    /// Most CPU time (over all its threads) the child process that compiles one plugin may use; past it the plugin is refused.
    #[serde(with = "humantime_serde")]
    pub compile_timeout: Duration,
    /// Threads one compile uses (and allocator arenas it may fill): fixed, not the machine's core count, so
    /// `compile_memory_limit` means the same on 1 core and on 64.
    pub compile_threads: usize,
    /// Threads that run handlers [default: the machine's cores, at most 8 (docs/operations.md, "Threads")].
    pub worker_threads: Option<usize>,
    /// Threads of the host's own work: claims, settles, Redis, the admin server [default: the machine's cores, at most 4].
    pub host_threads: Option<usize>,
}

impl RunnerConfig {
    /// What one compile may take: `max_plugin_size`, `compile_memory_limit`, `compile_timeout`, `compile_threads`.
    pub fn compile_limits(&self) -> crate::runtime::CompileLimits {
        crate::runtime::CompileLimits {
            max_plugin_size: self.max_plugin_size.as_u64(),
            memory: self.compile_memory_limit.as_u64(),
            cpu_time: self.compile_timeout,
            threads: self.compile_threads,
        }
    }

    /// Threads that run handlers: `worker_threads`, else the machine's cores up to [`MAX_DEFAULT_WORKER_THREADS`].
    pub fn worker_threads(&self) -> usize {
        self.worker_threads.unwrap_or_else(crate::runtime::default_worker_threads)
    }

    /// Threads of the host's own runtime: `host_threads`, else the machine's cores up to [`MAX_DEFAULT_HOST_THREADS`].
    pub fn host_threads(&self) -> usize {
        self.host_threads.unwrap_or_else(|| cores().min(MAX_DEFAULT_HOST_THREADS))
    }
}

/// The cores this process may use (cgroup quota and affinity included).
fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

pub use crate::runtime::{DEFAULT_COMPILE_THREADS, MAX_DEFAULT_WORKER_THREADS, MAX_THREADS};
/// Like [`MAX_DEFAULT_WORKER_THREADS`], for the host's own runtime: defaults
/// stop growing with the machine (`host_threads` raises it).
pub const MAX_DEFAULT_HOST_THREADS: usize = 4;

impl Default for RunnerConfig {
    fn default() -> Self {
        // The compile limits' defaults are the sandbox's own (hourglass-runtime).
        let compile = crate::runtime::CompileLimits::default();
        // The claim's defaults are the store's own (hourglass-store), written once.
        let claim = crate::store::ClaimLimits::default();
        RunnerConfig {
            plugins_dir: PathBuf::from("plugins"),
            cache_dir: PathBuf::from(".hourglass/cache"),
            concurrency: 512,
            batch_size: claim.max_tasks,
            lease: claim.lease,
            grace_period: Duration::from_secs(10),
            wakeup: WakeupMode::Auto,
            poll_interval: Duration::from_millis(100),
            host_id: None,
            max_plugin_size: ByteSize::b(compile.max_plugin_size),
            compile_memory_limit: ByteSize::b(compile.memory),
            compile_timeout: compile.cpu_time,
            compile_threads: compile.threads,
            worker_threads: None,
            host_threads: None,
        }
    }
}

/// The most a config may ask for, so a typo cannot make the host unusable.
pub(crate) const MAX_CONCURRENCY: usize = 100_000;
const MAX_BATCH: usize = 10_000;
/// Most shards of one type: several per master of a large cluster.
pub const MAX_SHARDS: u16 = 256;

impl Config {
    /// Parses and validates a `runner.toml` text; `origin` names it in errors.
    ///
    /// Errors are one line: `runner.toml:12: unknown field `concurency` ...`.
    pub fn parse(text: &str, origin: &str) -> Result<Config> {
        let config: Config = toml::from_str(text).map_err(|e| {
            let line = e.span().map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1);
            let message = e.message().trim().replace('\n', " ");
            match line {
                Some(line) => anyhow::anyhow!("{origin}:{line}: {message}"),
                None => anyhow::anyhow!("{origin}: {message}"),
            }
        })?;
        config.validate().with_context(|| format!("{origin}: invalid configuration"))?;
        let mut config = config;
        if let Some(admin) = text.parse::<toml::Table>().ok().and_then(|t| t.get("admin")?.as_table().cloned()) {
            config.admin_written = ["listen", "token"].into_iter().filter(|k| admin.contains_key(*k)).collect();
        }
        Ok(config)
    }

    /// One line for each key that is set but has no effect, because another
    /// key turns its feature off: logged at start and on every reload.
    pub fn ineffective_keys(&self) -> Vec<String> {
        let mut lines = Vec::new();
        if !self.admin.enabled && !self.admin_written.is_empty() {
            lines.push(format!(
                "runner.toml: [admin] {} has no effect without [admin] enabled = true: no admin server, metrics or \
                 dashboard is started",
                self.admin_written.join(" and ")
            ));
        }
        lines
    }

    /// The config file to use: `explicit` (a `--config`), else `./runner.toml`
    /// when it exists, else none (built-in defaults).
    pub fn find(explicit: Option<&Path>) -> Option<PathBuf> {
        match explicit {
            Some(path) => Some(path.to_owned()),
            None => Some(PathBuf::from("runner.toml")).filter(|p| p.exists()),
        }
    }

    /// The config from [`Config::find`]'s file, else the built-in defaults.
    pub fn load_or_default(explicit: Option<&Path>) -> Result<Config> {
        match Config::find(explicit) {
            Some(path) => Config::load(&path),
            None => Ok(Config::default()),
        }
    }

    /// Reads and parses a config file; relative folders in it are resolved against the file's folder.
    pub fn load(path: &Path) -> Result<Config> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("cannot read config file {}", path.display()))?;
        let mut config = Config::parse(&text, &path.display().to_string())?;
        // The file's absolute folder: `--config runner.toml` at start and the
        // watcher's absolute path at a reload resolve to the same folders.
        let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_owned());
        config.resolve_paths(absolute.parent().unwrap_or(Path::new(".")));
        Ok(config)
    }

    /// [`Config::load`], then `overrides` on top.
    pub fn load_with(file: &ConfigFile) -> Result<Config> {
        let mut config = Config::load(&file.path)?;
        file.overrides.apply(&mut config)?;
        Ok(config)
    }

    /// Makes relative folders relative to `base` (the config file's folder).
    pub fn resolve_paths(&mut self, base: &Path) {
        for dir in [&mut self.redis.data_dir, &mut self.runner.plugins_dir, &mut self.runner.cache_dir] {
            if dir.is_relative() {
                *dir = base.join(&*dir);
            }
        }
        for tc in self.types.values_mut() {
            for value in tc.config.values_mut() {
                value.resolve_path(base);
            }
        }
        if let Some(ca) = self.redis.ca_file.as_mut().filter(|p| p.is_relative()) {
            *ca = base.join(&*ca);
        }
    }

    fn validate(&self) -> Result<()> {
        let r = &self.runner;
        if r.concurrency == 0 || r.concurrency > MAX_CONCURRENCY {
            bail!("runner.concurrency must be between 1 and {MAX_CONCURRENCY}");
        }
        if r.batch_size == 0 || r.batch_size > MAX_BATCH {
            bail!("runner.batch_size must be between 1 and {MAX_BATCH}");
        }
        if r.lease < Duration::from_secs(1) {
            bail!("runner.lease must be at least 1s");
        }
        if r.poll_interval.is_zero() {
            bail!("runner.poll_interval must be more than 0");
        }
        if r.max_plugin_size < ByteSize::kib(1) || r.max_plugin_size > ByteSize::gib(1) {
            bail!("runner.max_plugin_size must be between 1 KiB and 1 GiB");
        }
        if r.compile_memory_limit < ByteSize::mib(64) || r.compile_memory_limit > ByteSize::gib(64) {
            bail!("runner.compile_memory_limit must be between 64 MiB and 64 GiB");
        }
        if r.compile_timeout < Duration::from_secs(1) || r.compile_timeout > Duration::from_secs(3600) {
            bail!("runner.compile_timeout must be between 1s and 1h");
        }
        if r.compile_threads == 0 || r.compile_threads > MAX_THREADS {
            bail!("runner.compile_threads must be between 1 and {MAX_THREADS}");
        }
        if r.worker_threads.is_some_and(|n| n == 0 || n > MAX_THREADS) {
            bail!("runner.worker_threads must be between 1 and {MAX_THREADS}");
        }
        if r.host_threads.is_some_and(|n| n == 0 || n > MAX_THREADS) {
            bail!("runner.host_threads must be between 1 and {MAX_THREADS}");
        }
        if let Some(id) = &r.host_id
            && (id.is_empty() || id.len() > 128 || id.chars().any(|c| c.is_whitespace() || c.is_control()))
        {
            bail!("runner.host_id must be 1 to 128 characters without whitespace");
        }
        self.admin.validate()?;
        for (name, schedule) in &self.schedules {
            schedule.rule().with_context(|| format!("schedules.\"{name}\""))?;
        }
        self.telemetry.validate()?;
        self.defaults.validate("defaults")?;
        for (name, tc) in &self.types {
            let policy = self.policy(name);
            policy.validate(&format!("types.\"{name}\""))?;
            if let Some(n) = tc.shards {
                if n == 0 || n > MAX_SHARDS {
                    bail!("types.\"{name}\".shards must be between 1 and {MAX_SHARDS}");
                }
                // Each shard claims its part of max_running: none may get 0, which means no limit.
                if policy.max_running > 0 && policy.max_running < u64::from(n) {
                    bail!(
                        "types.\"{name}\".max_running = {} is less than its {n} shards: each shard needs at least 1",
                        policy.max_running
                    );
                }
            }
        }
        Ok(())
    }

    /// Every type's `config` values as written (secrets not read yet).
    pub fn config_values(&self) -> impl Iterator<Item = (&TaskType, &BTreeMap<String, crate::secrets::ConfigValue>)> {
        self.types.iter().map(|(t, tc)| (t, &tc.config))
    }

    /// The cap of the type's events stream, or `None` when its events are off.
    pub fn events_maxlen(&self, task_type: &TaskType) -> Option<u64> {
        let policy = self.policy(task_type);
        policy.events.then_some(policy.events_maxlen)
    }

    /// The types with more than one shard, and how many.
    pub fn sharded_types(&self) -> impl Iterator<Item = (&TaskType, u16)> {
        self.types.iter().filter_map(|(t, tc)| tc.shards.filter(|&n| n > 1).map(|n| (t, n)))
    }

    /// How many shards the type is spread over (`[types.T] shards`, default 1); a shard name gives its type's.
    pub fn shards(&self, task_type: &TaskType) -> u16 {
        self.types.get(&task_type.base()).and_then(|t| t.shards).unwrap_or(1)
    }

    /// The effective policy of a type (or of a shard: its type's): its overrides on top of `[defaults]`.
    pub fn policy(&self, task_type: &TaskType) -> TypePolicy {
        let d = &self.defaults;
        let Some(t) = self.types.get(&task_type.base()) else {
            return d.clone();
        };
        TypePolicy {
            concurrency: t.concurrency.unwrap_or(d.concurrency),
            max_running: t.max_running.unwrap_or(d.max_running),
            rate: t.rate.or(d.rate),
            fair_by: t.fair_by.clone().or_else(|| d.fair_by.clone()),
            max_attempts: t.max_attempts.unwrap_or(d.max_attempts),
            backoff_base: t.backoff_base.unwrap_or(d.backoff_base),
            backoff_cap: t.backoff_cap.unwrap_or(d.backoff_cap),
            timeout: t.timeout.unwrap_or(d.timeout),
            allowed_outbound_hosts: t
                .allowed_outbound_hosts
                .clone()
                .unwrap_or_else(|| d.allowed_outbound_hosts.clone()),
            http_timeout: t.http_timeout.unwrap_or(d.http_timeout),
            http_max_response: t.http_max_response.unwrap_or(d.http_max_response),
            http_concurrency: t.http_concurrency.unwrap_or(d.http_concurrency),
            memory_limit: t.memory_limit.unwrap_or(d.memory_limit),
            host_memory_limit: t.host_memory_limit.unwrap_or(d.host_memory_limit),
            max_payload: t.max_payload.unwrap_or(d.max_payload),
            instance_reuse: t.instance_reuse.unwrap_or(d.instance_reuse),
            instance_reset: t.instance_reset.unwrap_or(d.instance_reset),
            instance_warm_up: t.instance_warm_up.unwrap_or(d.instance_warm_up),
            events: t.events.unwrap_or(d.events),
            events_maxlen: t.events_maxlen.unwrap_or(d.events_maxlen),
            may_schedule: t.may_schedule.clone().unwrap_or_else(|| d.may_schedule.clone()),
            may_replace: t.may_replace.clone().unwrap_or_else(|| d.may_replace.clone()),
        }
    }
}

#[cfg(test)]
mod tests;
