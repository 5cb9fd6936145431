//! The on-disk cache of compiled plugins, loaded by mapping the file rather than reading it.
//!
//! A compiled interpreter (CPython, StarlingMonkey) is 30–40 MiB of machine
//! code and data. Read into memory, all of it stays resident in every host;
//! mapped from the cache file, the kernel keeps only the pages in use and can
//! drop clean ones under pressure. Entries are keyed by the plugin's bytes and
//! the engine's settings, written once by the compiler (temp file + rename,
//! so concurrent hosts never see half a file), touched on use, and pruned
//! when unused for [`PRUNE_AFTER`].

// `Component::deserialize_file` is unsafe because it runs whatever machine
// code the file holds. The files here are written only by the runtime's
// compiler (`compile.rs`: `Engine::precompile_component` of an engine with
// the host engine's settings, in a child process or in this one), into the
// host's own cache folder: the same
// trust wasmtime's built-in cache places in its folder. A file that does not
// match this engine is rejected by wasmtime and compiled again.
#![allow(unsafe_code)]

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};
use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

/// Entries not used for this long are removed when a runtime starts.
pub const PRUNE_AFTER: Duration = Duration::from_secs(30 * 24 * 3600);
/// Temp files older than this were left by a compile that did not finish.
const TEMP_ABANDONED_AFTER: Duration = Duration::from_secs(3600);

/// A folder of compiled plugins for one engine configuration.
#[derive(Debug, Clone)]
pub struct CompileCache {
    dir: PathBuf,
}

impl CompileCache {
    /// Creates the folder if needed and removes entries unused for [`PRUNE_AFTER`].
    pub fn open(dir: &Path) -> Result<CompileCache> {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create cache folder {}", dir.display()))?;
        let dir = std::path::absolute(dir).with_context(|| format!("cannot resolve cache folder {}", dir.display()))?;
        let now = SystemTime::now();
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            let Ok(age) =
                entry.metadata().and_then(|m| m.modified()).map(|t| now.duration_since(t).unwrap_or_default())
            else {
                continue;
            };
            // Unused entries; and temp files a compile worker killed while it wrote left behind.
            let expired = match path.extension().and_then(|e| e.to_str()) {
                Some("cwasm") => age > PRUNE_AFTER,
                Some("tmp") => age > TEMP_ABANDONED_AFTER,
                _ => false,
            };
            if expired {
                let _ = std::fs::remove_file(&path);
            }
        }
        Ok(CompileCache { dir })
    }

    /// Whether `bytes` were compiled for this engine before (a cache hit).
    pub fn has(&self, engine: &Engine, bytes: &[u8]) -> bool {
        self.dir.join(format!("{}.cwasm", key(engine, bytes))).is_file()
    }

    /// The compiled `bytes`, mapped from the cache, or compiled now by
    /// `compile` into the entry's file (which it writes whole, by temp file
    /// and rename) and then mapped. The stats are `compile`'s, `None` on a hit.
    pub fn load<S>(
        &self,
        engine: &Engine,
        bytes: &[u8],
        compile: impl FnOnce(&Path) -> anyhow::Result<S>,
    ) -> anyhow::Result<(Component, Option<S>)> {
        let file = self.dir.join(format!("{}.cwasm", key(engine, bytes)));
        if file.is_file() {
            match map(engine, &file) {
                Ok(component) => {
                    touch(&file);
                    return Ok((component, None));
                }
                Err(e) => tracing::warn!("compiling again: cache entry {} is unusable: {e:#}", file.display()),
            }
        }
        let stats = compile(&file)?;
        let component = map(engine, &file)
            .map_err(|e| anyhow::anyhow!("cannot map the compiled plugin {}: {e:#}", file.display()))?;
        Ok((component, Some(stats)))
    }
}

/// `compiled`, the output of `precompile_component` by an engine with
/// `engine`'s settings, as a component held in memory (no cache folder).
pub fn in_memory(engine: &Engine, compiled: &[u8]) -> wasmtime::Result<Component> {
    // SAFETY: `compiled` comes from `precompile_component` (see the module
    // note), and wasmtime rejects it unless it was made for `engine`'s
    // version and settings.
    unsafe { Component::deserialize(engine, compiled) }
}

/// Maps a cache entry as a component.
fn map(engine: &Engine, file: &Path) -> wasmtime::Result<Component> {
    // SAFETY: entries are written only by `CompileCache::store` from
    // `precompile_component` (see the module note); wasmtime checks that the
    // file was made for this engine's version and settings.
    unsafe { Component::deserialize_file(engine, file) }
}

/// Marks an entry as used, so pruning keeps it.
fn touch(file: &Path) {
    if let Ok(f) = std::fs::File::options().append(true).open(file) {
        let _ = f.set_modified(SystemTime::now());
    }
}

/// The plugin's bytes and everything about the engine that compiled code depends on.
fn key(engine: &Engine, bytes: &[u8]) -> String {
    let mut settings = std::hash::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut settings);
    let mut sha = Sha256::new();
    sha.update(bytes);
    sha.update(settings.finish().to_le_bytes());
    sha.update(env!("CARGO_PKG_VERSION").as_bytes());
    hex::encode(sha.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_entries_are_pruned_and_others_kept() {
        let dir = tempfile::tempdir().unwrap();
        let old = dir.path().join("old.cwasm");
        let fresh = dir.path().join("fresh.cwasm");
        let other = dir.path().join("notes.txt");
        let abandoned = dir.path().join(".123.abc.tmp");
        let writing = dir.path().join(".124.abd.tmp");
        for f in [&old, &fresh, &other, &abandoned, &writing] {
            std::fs::write(f, b"x").unwrap();
        }
        let long_ago = SystemTime::now() - PRUNE_AFTER - Duration::from_secs(60);
        for f in [&old, &other, &abandoned] {
            std::fs::File::options().append(true).open(f).unwrap().set_modified(long_ago).unwrap();
        }
        CompileCache::open(dir.path()).unwrap();
        assert!(!old.exists(), "an entry unused for 30 days is removed");
        assert!(fresh.exists());
        assert!(other.exists(), "only .cwasm files are ours to remove");
        assert!(!abandoned.exists(), "a temp file an hour old was abandoned");
        assert!(writing.exists(), "a fresh temp file may be being written");
    }
}
