//! Which plugin handles which task type, kept current as `.wasm` files and `runner.toml` change.

use hourglass_task::sync::LockExt;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use arc_swap::ArcSwap;
use notify::{RecursiveMode, Watcher};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::config::{Config, ConfigFile, TypePolicy};
use crate::runtime::{Component, Handler, Runtime};
use crate::task_type::TaskType;

/// What serves one task type right now: the sandboxed handler (`E`; the
/// pipeline's unit tests put a fake there), its policy and its plugin file.
pub struct Entry<E = Handler> {
    /// The sandboxed handler (component + limits + config values).
    pub handler: Arc<E>,
    /// Retry policy and limits of the type.
    pub policy: TypePolicy,
    /// The plugin file it came from.
    pub file: PathBuf,
    /// Short content hash of that file (the plugin's version).
    pub hash: String,
}

/// Task type → handler, swapped atomically on reload; readers never block.
#[derive(Clone)]
pub struct Registry {
    runtime: Runtime,
    plugins_dir: PathBuf,
    entries: Arc<ArcSwap<HashMap<TaskType, Arc<Entry>>>>,
    config: Arc<ArcSwap<Config>>,
    /// Bumped after every swap, so the runner can start workers for new types.
    version: watch::Sender<u64>,
    /// Components by file, so an unchanged file is not compiled again.
    loaded: Arc<std::sync::Mutex<HashMap<PathBuf, Component>>>,
    /// The last load error of each plugin file that failed to load, until it loads.
    load_errors: Arc<std::sync::Mutex<BTreeMap<PathBuf, String>>>,
    /// Files refused as they are (see [`crate::runtime::Refused`]), with what
    /// they were refused as: not tried again until the file or the limits change.
    refused: Arc<std::sync::Mutex<HashMap<PathBuf, Stamp>>>,
    /// While the first load runs: plugin files done and in all.
    loading: Arc<std::sync::Mutex<Option<(usize, usize)>>>,
    /// When the config in force took effect (ms since the epoch): the start, or the last reload applied.
    config_applied_ms: Arc<std::sync::atomic::AtomicI64>,
}

impl Registry {
    /// Loads every plugin in `config.runner.plugins_dir`. Broken files are logged and skipped.
    pub fn load(runtime: Runtime, config: Config) -> Result<Registry> {
        let registry = Registry::new(runtime, config)?;
        registry.reload();
        Ok(registry)
    }

    /// A registry serving nothing yet; [`Registry::reload`] loads the plugins,
    /// serving each type as soon as its plugin is ready.
    ///
    /// Fails only on what stops a start: a missing plugins folder or secret.
    pub fn new(runtime: Runtime, config: Config) -> Result<Registry> {
        let plugins_dir = config.runner.plugins_dir.clone();
        if !plugins_dir.is_dir() {
            bail!("plugins folder {} does not exist", plugins_dir.display());
        }
        // Secrets are read now: a missing one stops the start, naming type and key.
        crate::secrets::resolve_all(config.config_values())?;
        let pending = wanted_files(&plugins_dir, &config).map(|w| w.len()).unwrap_or(0);
        Ok(Registry {
            runtime,
            plugins_dir,
            entries: Arc::new(ArcSwap::from_pointee(HashMap::new())),
            config: Arc::new(ArcSwap::from_pointee(config)),
            version: watch::Sender::new(0),
            loaded: Arc::default(),
            load_errors: Arc::default(),
            refused: Arc::default(),
            loading: Arc::new(std::sync::Mutex::new(Some((0, pending)))),
            config_applied_ms: Arc::new(std::sync::atomic::AtomicI64::new(crate::clock::now_ms())),
        })
    }

    /// While the first load runs: how many plugin files are done, of how many.
    pub fn loading(&self) -> Option<(usize, usize)> {
        *self.loading.lock_unpoisoned()
    }

    /// The entry serving `task_type`, if a plugin is loaded for it.
    pub fn get(&self, task_type: &TaskType) -> Option<Arc<Entry>> {
        // A shard is served by its type's plugin.
        self.entries.load().get(&task_type.base()).cloned()
    }

    /// Every type that has a plugin now.
    pub fn types(&self) -> Vec<TaskType> {
        let mut types: Vec<_> = self.entries.load().keys().cloned().collect();
        types.sort();
        types
    }

    /// The runtime its plugins are loaded into.
    pub fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    /// The config in force (it changes when `runner.toml` is edited).
    pub fn config(&self) -> Arc<Config> {
        self.config.load_full()
    }

    /// When the config in force took effect, in ms since the epoch: the host's
    /// start, or the end of the last `runner.toml` reload that was applied.
    pub fn config_applied_ms(&self) -> i64 {
        self.config_applied_ms.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The last load error of each plugin file whose latest version failed to load.
    pub fn load_errors(&self) -> BTreeMap<PathBuf, String> {
        self.load_errors.lock_unpoisoned().clone()
    }

    /// A receiver that changes whenever the set of handlers was swapped.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
    }

    /// Rescans the plugins folder and swaps in the new mapping.
    ///
    /// A file that fails to load never replaces a working version of itself.
    pub fn reload(&self) {
        self.load_all();
        self.loading.lock_unpoisoned().take();
    }

    fn load_all(&self) {
        let config = self.config.load_full();
        let values = match crate::secrets::resolve_all(config.config_values()) {
            Ok(v) => v,
            Err(e) => {
                error!("plugins not reloaded, the running handlers stay: {e:#}");
                return;
            }
        };
        let wanted = match wanted_files(&self.plugins_dir, &config) {
            Ok(w) => w,
            Err(e) => {
                error!("cannot scan plugins folder: {e:#}");
                return;
            }
        };
        let mut loaded = self.loaded.lock_unpoisoned();
        let before = self.entries.load_full();
        let mut next: HashMap<TaskType, Arc<Entry>> = HashMap::new();
        let mut kept: HashMap<PathBuf, Component> = HashMap::new();
        let total = wanted.len();
        for (done, (file, types)) in wanted.iter().enumerate() {
            if let Some(component) = self.component_for(file, &mut loaded) {
                for task_type in types {
                    let policy = config.policy(task_type);
                    let values = values.get(task_type).cloned().unwrap_or_default();
                    let plugin_name = file_stem(file);
                    let handler = Handler::new(component.clone(), plugin_name, &policy.sandbox(), values);
                    let entry = Entry {
                        handler: Arc::new(handler),
                        policy,
                        file: file.clone(),
                        hash: component.hash().to_owned(),
                    };
                    next.insert(task_type.clone(), Arc::new(entry));
                }
                kept.insert(file.clone(), component);
                // Serve what is ready now: the types of files not reached yet
                // keep what they had, so a slow compile delays only its own types.
                let mut partial: HashMap<TaskType, Arc<Entry>> = (*before).clone();
                partial.extend(next.iter().map(|(t, e)| (t.clone(), e.clone())));
                self.entries.store(Arc::new(partial));
                self.version.send_modify(|v| *v += 1);
            }
            let mut loading = self.loading.lock_unpoisoned();
            if let Some(progress) = loading.as_mut() {
                *progress = (done + 1, total);
            }
        }
        for (t, e) in &next {
            match before.get(t) {
                Some(old) if old.hash == e.hash => {}
                Some(old) => {
                    let engine = e.handler.component().interpreter().as_str();
                    info!(task_type = %t, file = %e.file.display(), from = %old.hash, to = %e.hash, engine, "plugin replaced")
                }
                None => {
                    let engine = e.handler.component().interpreter().as_str();
                    info!(task_type = %t, file = %e.file.display(), hash = %e.hash, engine, "plugin loaded")
                }
            }
        }
        for t in before.keys().filter(|t| !next.contains_key(*t)) {
            warn!(task_type = %t, "plugin removed: its tasks wait in Redis until a plugin serves the type again");
        }
        crate::observe::telemetry::plugins_serving(
            kept.iter().map(|(f, c)| (file_stem(f), c.hash().to_owned())).collect(),
        );
        self.load_errors.lock_unpoisoned().retain(|f, _| wanted.contains_key(f));
        self.refused.lock_unpoisoned().retain(|f, _| wanted.contains_key(f));
        *loaded = kept;
        drop(loaded);
        self.entries.store(Arc::new(next));
        self.version.send_modify(|v| *v += 1);
    }

    /// The component of `file`: the loaded one when the bytes are unchanged,
    /// a fresh compile otherwise, or the last good one when the new file is
    /// refused or cannot be read. A refused file is not tried again until it
    /// (or a compile limit) changes.
    fn component_for(&self, file: &Path, loaded: &mut HashMap<PathBuf, Component>) -> Option<Component> {
        let previous = loaded.get(file).cloned();
        let stamp = Stamp::of(file, self.runtime.compile_limits());
        let mut refused = self.refused.lock_unpoisoned();
        if stamp.is_some() && refused.get(file) == stamp.as_ref() {
            return previous;
        }
        refused.remove(file);
        drop(refused);
        let failed = |e: anyhow::Error| {
            if crate::runtime::is_refused(&e)
                && let Some(stamp) = stamp.clone()
            {
                self.refused.lock_unpoisoned().insert(file.to_owned(), stamp);
            }
            self.load_failed(file, format!("{e:#}"));
            match &previous {
                Some(p) => {
                    error!(file = %file.display(), serving = %p.hash(), "plugin rejected, the previous version keeps serving: {e:#}")
                }
                None => error!(file = %file.display(), "plugin rejected: {e:#}"),
            }
            previous.clone()
        };
        let bytes = match self.runtime.read_plugin(file) {
            Ok(b) => b,
            Err(e) => return failed(e),
        };
        let hash = crate::runtime::short_hash(&bytes);
        if let Some(prev) = &previous
            && prev.hash() == hash
        {
            return previous;
        }
        let compiling = self.runtime.needs_compile(&bytes).then(|| {
            let first = if previous.is_some() { "a new version" } else { "first start" };
            info!(file = %file.display(), "compiling {} ({first}; cached afterwards)…", file.display());
        });
        match self.runtime.load_bytes(file, &bytes) {
            Ok(component) => {
                if let (Some(()), Some(stats)) = (compiling, component.compile_stats()) {
                    info!(file = %file.display(), "compiled {} in {stats}", file.display());
                }
                crate::observe::telemetry::plugin_loaded(&file_stem(file));
                self.load_errors.lock_unpoisoned().remove(file);
                Some(component)
            }
            Err(e) => failed(e),
        }
    }

    fn load_failed(&self, file: &Path, error: String) {
        crate::observe::telemetry::plugin_load_failed(&file_stem(file));
        self.load_errors.lock_unpoisoned().insert(file.to_owned(), error);
    }

    /// Applies an edited `runner.toml`: policies, limits and type mappings
    /// take effect now; settings that shape the running host need a restart.
    ///
    /// `runner.toml reloaded` is logged once the new handlers serve, naming
    /// what changed: a task claimed after that line runs under the new policy.
    pub fn apply_config(&self, new: Config) {
        if let Err(e) = crate::secrets::resolve_all(new.config_values()) {
            error!("runner.toml not reloaded, the running config stays: {e:#}");
            return;
        }
        let old = self.config.load_full();
        for what in needs_restart(&old, &new) {
            warn!("runner.toml: the change to {what} takes effect after a restart");
        }
        for line in new.ineffective_keys() {
            warn!("{line}");
        }
        let before = self.entries.load_full();
        self.runtime.set_compile_limits(new.runner.compile_limits());
        self.config.store(Arc::new(new));
        self.reload();
        self.config_applied_ms.store(crate::clock::now_ms(), std::sync::atomic::Ordering::Relaxed);
        let change = ReloadChange::between(&before, &self.entries.load());
        info!(
            policy_changed = ?change.policy_changed,
            types_added = ?change.added,
            types_removed = ?change.removed,
            "runner.toml reloaded"
        );
    }

    /// Watches the plugins folder (and `config_file`, if any) and reloads on
    /// change until `shutdown`. Bursts of events are coalesced; an edited
    /// config file gets its overrides (`hourglass run`'s flags) again.
    pub fn watch(
        &self,
        config_file: Option<ConfigFile>,
        shutdown: CancellationToken,
    ) -> Result<tokio::task::JoinHandle<()>> {
        let (tx, mut rx) = mpsc::unbounded_channel::<bool>();
        let plugins_dir = self.plugins_dir.clone();
        let config_file_abs = config_file.map(|file| ConfigFile {
            path: std::path::absolute(&file.path).unwrap_or(file.path.clone()),
            overrides: file.overrides,
        });
        let watched_config = config_file_abs.as_ref().map(|c| c.path.clone());
        let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
            let Ok(event) = event else { return };
            if matches!(event.kind, notify::EventKind::Access(_)) {
                return;
            }
            let config_changed = watched_config
                .as_ref()
                .is_some_and(|c| event.paths.iter().any(|p| std::path::absolute(p).is_ok_and(|p| &p == c)));
            let plugin_changed = event.paths.iter().any(|p| p.extension().is_some_and(|e| e == "wasm"));
            if config_changed || plugin_changed {
                let _ = tx.send(config_changed);
            }
        })
        .context("cannot start the file watcher")?;
        watcher
            .watch(&plugins_dir, RecursiveMode::NonRecursive)
            .with_context(|| format!("cannot watch plugins folder {}", plugins_dir.display()))?;
        if let Some(dir) = config_file_abs.as_ref().and_then(|c| c.path.parent())
            && dir != std::path::absolute(&plugins_dir).unwrap_or_default()
        {
            watcher
                .watch(dir, RecursiveMode::NonRecursive)
                .with_context(|| format!("cannot watch config folder {}", dir.display()))?;
        }
        let registry = self.clone();
        Ok(tokio::spawn(async move {
            let _watcher = watcher; // dropping it stops the events
            loop {
                let mut config_changed = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    ev = rx.recv() => match ev { Some(c) => c, None => return },
                };
                // Editors and copies fire several events per change; take them together.
                tokio::time::sleep(Duration::from_millis(50)).await;
                while let Ok(c) = rx.try_recv() {
                    config_changed |= c;
                }
                let registry = registry.clone();
                let config_file = config_file_abs.clone();
                let _ = tokio::task::spawn_blocking(move || {
                    if config_changed && let Some(file) = config_file {
                        match Config::load_with(&file) {
                            Ok(new) => return registry.apply_config(new),
                            Err(e) => {
                                error!("runner.toml not reloaded, the running config stays: {e:#}")
                            }
                        }
                    }
                    registry.reload();
                })
                .await;
            }
        }))
    }
}

/// What a refused file was refused as: the file's identity and size and
/// the limits then in force. Cheaper than hashing a large refused file again.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamp {
    len: u64,
    modified: Option<std::time::SystemTime>,
    inode: u64,
    limits: crate::runtime::CompileLimits,
}

impl Stamp {
    fn of(file: &Path, limits: crate::runtime::CompileLimits) -> Option<Stamp> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(file).ok()?;
        Some(Stamp { len: meta.len(), modified: meta.modified().ok(), inode: meta.ino(), limits })
    }
}

/// The settings that differ between `old` and `new` but apply only at a
/// restart. Both sides carry the same overrides (`hourglass run`'s flags)
/// and paths resolved against the same folder, so only an edit shows here.
fn needs_restart(old: &Config, new: &Config) -> Vec<&'static str> {
    [
        ("[redis]", format!("{:?}", old.redis) != format!("{:?}", new.redis)),
        ("[admin]", old.admin != new.admin),
        ("runner.plugins_dir", old.runner.plugins_dir != new.runner.plugins_dir),
        ("runner.concurrency", old.runner.concurrency != new.runner.concurrency),
        ("runner.wakeup", old.runner.wakeup != new.runner.wakeup),
        ("a type's concurrency", concurrencies(old) != concurrencies(new)),
        ("a type's shards", new.types.keys().chain(old.types.keys()).any(|t| old.shards(t) != new.shards(t))),
    ]
    .into_iter()
    .filter_map(|(what, changed)| changed.then_some(what))
    .collect()
}

/// What a reload changed of the types served: the line an operator reads to
/// know the edit took, and what it took.
#[derive(Debug, Default, PartialEq, Eq)]
struct ReloadChange {
    /// Types served before and after whose policy (retries, timeouts, limits) differs.
    policy_changed: Vec<String>,
    /// Types served now that were not before.
    added: Vec<String>,
    /// Types served before that are not now.
    removed: Vec<String>,
}

impl ReloadChange {
    fn between<E>(before: &HashMap<TaskType, Arc<Entry<E>>>, after: &HashMap<TaskType, Arc<Entry<E>>>) -> ReloadChange {
        let sorted = |mut v: Vec<String>| {
            v.sort();
            v
        };
        ReloadChange {
            policy_changed: sorted(
                after
                    .iter()
                    .filter(|(t, e)| before.get(*t).is_some_and(|old| old.policy != e.policy))
                    .map(|(t, _)| t.to_string())
                    .collect(),
            ),
            added: sorted(after.keys().filter(|t| !before.contains_key(*t)).map(|t| t.to_string()).collect()),
            removed: sorted(before.keys().filter(|t| !after.contains_key(*t)).map(|t| t.to_string()).collect()),
        }
    }
}

fn concurrencies(c: &Config) -> BTreeMap<TaskType, Option<usize>> {
    c.types.iter().map(|(t, tc)| (t.clone(), tc.concurrency)).collect()
}

/// The plugin files to load and the types each serves: `<type>.wasm` serves
/// its stem, and `[types.X] plugin = "file.wasm"` maps a file to more types.
fn wanted_files(dir: &Path, config: &Config) -> Result<BTreeMap<PathBuf, BTreeSet<TaskType>>> {
    let mut wanted: BTreeMap<PathBuf, BTreeSet<TaskType>> = BTreeMap::new();
    // A type mapped to a file explicitly is served by that file only.
    let explicit: BTreeSet<&TaskType> =
        config.types.iter().filter(|(_, t)| t.plugin.is_some()).map(|(name, _)| name).collect();
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))? {
        let path = entry?.path();
        if path.extension().is_none_or(|e| e != "wasm") || !path.is_file() {
            continue;
        }
        let stem = file_stem(&path);
        match stem.parse::<TaskType>() {
            Ok(t) if !explicit.contains(&t) => {
                wanted.entry(path).or_default().insert(t);
            }
            Ok(_) => {}
            Err(e) if stem.starts_with('.') => drop(e), // hidden temp files of copy tools
            Err(e) => {
                warn!(file = %path.display(), "ignored: the file name is not a task type: {e}")
            }
        }
    }
    for (task_type, tc) in &config.types {
        if let Some(plugin) = &tc.plugin {
            let path = dir.join(plugin);
            if path.is_file() {
                wanted.entry(path).or_default().insert(task_type.clone());
            } else {
                warn!(task_type = %task_type, file = %path.display(), "plugin file named in runner.toml does not exist");
            }
        }
    }
    Ok(wanted)
}

/// A plugin file's name without `.wasm`: the task type it serves, when that is a valid name.
pub(crate) fn file_stem(path: &Path) -> String {
    path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_map_to_types_by_stem_and_config() {
        let dir = tempfile::tempdir().unwrap();
        for f in ["order.timeout.wasm", "noop.wasm", "Bad Name.wasm", "notes.txt", ".tmp.wasm"] {
            std::fs::write(dir.path().join(f), b"x").unwrap();
        }
        let config = Config::parse(
            "[types.\"bench\"]\nplugin = \"noop.wasm\"\n[types.\"noop\"]\nplugin = \"order.timeout.wasm\"\n",
            "runner.toml",
        )
        .unwrap();
        let wanted = wanted_files(dir.path(), &config).unwrap();
        let names = |f: &str| -> Vec<String> { wanted[&dir.path().join(f)].iter().map(|t| t.to_string()).collect() };
        assert_eq!(names("noop.wasm"), ["bench"]);
        assert_eq!(names("order.timeout.wasm"), ["noop", "order.timeout"]);
        assert_eq!(wanted.len(), 2);
    }
}
