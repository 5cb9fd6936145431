//! How a freed instance's memory is made as built again on this machine, and whether its pages can be swapped.
//!
//! Every task runs in a fresh instance, but the pool reuses the slot of an
//! earlier one: the slot's pages must be reset before the next instance
//! reads them. With Linux's PAGEMAP_SCAN (6.7+) wasmtime asks the kernel
//! which pages were written and resets just those; without it, the first
//! pages are zeroed and the rest given back with madvise. Wasmtime 48's
//! scan skipped written pages that were swapped out (or being migrated),
//! so the next instance read them (issue 50): the host builds a wasmtime
//! that includes swapped-out pages (vendor/README.md), which makes the scan
//! correct with or without swap. Swap is still reported: a page in swap
//! costs a swap-in when it is reset.

use std::fmt;
use std::path::{Path, PathBuf};

use bytesize::ByteSize;

/// How freed slots are reset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResetMethod {
    /// PAGEMAP_SCAN finds every written page, in memory or in swap, and
    /// each is reset in place; past `keep_resident`, memory is given back.
    DirtyPageScan,
    /// The kernel has no PAGEMAP_SCAN: the first pages are zeroed and the
    /// rest given back with madvise (every core the process ran on is interrupted).
    Madvise,
}

/// Whether this process's memory can go to swap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Swap {
    /// The machine has no swap space (`SwapTotal` is 0).
    None,
    /// The machine has swap, but this process's cgroup may not use it.
    DeniedByCgroup { total: ByteSize, file: PathBuf },
    /// The process's pages can be swapped out.
    Allowed { total: ByteSize },
}

/// The reset the runtime uses, and the machine facts it was chosen on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryReset {
    pub method: ResetMethod,
    pub swap: Swap,
}

impl MemoryReset {
    /// What this machine and process allow now.
    pub fn detect() -> MemoryReset {
        let method = if wasmtime::PoolingAllocationConfig::is_pagemap_scan_available() {
            ResetMethod::DirtyPageScan
        } else {
            ResetMethod::Madvise
        };
        MemoryReset { method, swap: Swap::detect(Path::new("/")) }
    }
}

impl fmt::Display for MemoryReset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.method {
            ResetMethod::DirtyPageScan => f.write_str(
                "written pages found with PAGEMAP_SCAN and reset in place, those in swap included (patched wasmtime, vendor/README.md)",
            )?,
            ResetMethod::Madvise => f.write_str(
                "first pages zeroed and the rest given back with madvise (this kernel lacks PAGEMAP_SCAN, Linux 6.7+)",
            )?,
        }
        match &self.swap {
            Swap::None => f.write_str("; swap: none on this machine"),
            Swap::DeniedByCgroup { total, file } => {
                write!(f, "; swap: {total} on this machine, none for this process ({} is 0)", file.display())
            }
            Swap::Allowed { total } => write!(
                f,
                "; swap: {total}, usable by this process (a page reset from swap is read back first; \
                 MemorySwapMax=0 keeps the host out of it)"
            ),
        }
    }
}

impl Swap {
    /// Reads `/proc/meminfo` and this process's cgroup limits under `root`
    /// (`/` on a real machine; a fixture folder in tests).
    fn detect(root: &Path) -> Swap {
        let meminfo = std::fs::read_to_string(root.join("proc/meminfo")).unwrap_or_default();
        let total_kib = meminfo_kib(&meminfo, "SwapTotal:").unwrap_or(0);
        if total_kib == 0 {
            return Swap::None;
        }
        let total = ByteSize::kib(total_kib);
        let cgroups = std::fs::read_to_string(root.join("proc/self/cgroup")).unwrap_or_default();
        match cgroup_denying_swap(root, &cgroups) {
            Some(file) => Swap::DeniedByCgroup { total, file },
            None => Swap::Allowed { total },
        }
    }
}

/// The value in kB of `field` in /proc/meminfo's text.
fn meminfo_kib(meminfo: &str, field: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with(field))?;
    line[field.len()..].split_whitespace().next()?.parse().ok()
}

/// The cgroup file that keeps this process out of swap, if one does: a
/// `memory.swap.max` of 0 in its cgroup v2 or any ancestor, or (cgroup v1)
/// a `memory.memsw.limit_in_bytes` equal to `memory.limit_in_bytes`.
fn cgroup_denying_swap(root: &Path, proc_cgroup: &str) -> Option<PathBuf> {
    let fs = root.join("sys/fs/cgroup");
    for line in proc_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let path = path.trim_start_matches('/');
        if controllers.is_empty() {
            // cgroup v2: the limit is the smallest along the path.
            let mut dir = fs.join(path);
            loop {
                let file = dir.join("memory.swap.max");
                if std::fs::read_to_string(&file).is_ok_and(|v| v.trim() == "0") {
                    return Some(file);
                }
                if dir == fs || !dir.pop() {
                    break;
                }
            }
        } else if controllers.split(',').any(|c| c == "memory") {
            let dir = fs.join("memory").join(path);
            let read = |name: &str| std::fs::read_to_string(dir.join(name)).ok().map(|v| v.trim().to_owned());
            if let (Some(memsw), Some(mem)) = (read("memory.memsw.limit_in_bytes"), read("memory.limit_in_bytes"))
                && memsw == mem
            {
                return Some(dir.join("memory.memsw.limit_in_bytes"));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake `/` with these files.
    fn root(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (path, text) in files {
            let file = dir.path().join(path);
            std::fs::create_dir_all(file.parent().unwrap()).unwrap();
            std::fs::write(file, text).unwrap();
        }
        dir
    }

    const NO_SWAP: &str = "MemTotal:       24000000 kB\nSwapTotal:             0 kB\n";
    const SWAP: &str = "MemTotal:       24000000 kB\nSwapTotal:       2097148 kB\nSwapFree: 1 kB\n";

    #[test]
    fn no_swap_space_is_none() {
        let r = root(&[("proc/meminfo", NO_SWAP), ("proc/self/cgroup", "0::/a\n")]);
        assert_eq!(Swap::detect(r.path()), Swap::None);
        assert_eq!(Swap::detect(Path::new("/nonexistent")), Swap::None);
    }

    #[test]
    fn swap_space_with_no_cgroup_limit_is_allowed() {
        let r = root(&[
            ("proc/meminfo", SWAP),
            ("proc/self/cgroup", "0::/system.slice/hourglass.service\n"),
            ("sys/fs/cgroup/system.slice/hourglass.service/memory.swap.max", "max\n"),
        ]);
        assert_eq!(Swap::detect(r.path()), Swap::Allowed { total: ByteSize::kib(2097148) });
    }

    #[test]
    fn a_zero_swap_max_in_the_cgroup_or_an_ancestor_denies_it() {
        for at in ["system.slice/hourglass.service", "system.slice"] {
            let file = format!("sys/fs/cgroup/{at}/memory.swap.max");
            let r = root(&[
                ("proc/meminfo", SWAP),
                ("proc/self/cgroup", "0::/system.slice/hourglass.service\n"),
                ("sys/fs/cgroup/system.slice/hourglass.service/memory.swap.max", "max\n"),
                (&file, "0\n"),
            ]);
            match Swap::detect(r.path()) {
                Swap::DeniedByCgroup { file: found, .. } => assert_eq!(found, r.path().join(&file)),
                other => panic!("{at}: {other:?}"),
            }
        }
    }

    #[test]
    fn cgroup_v1_memsw_equal_to_the_memory_limit_denies_it() {
        let r = root(&[
            ("proc/meminfo", SWAP),
            ("proc/self/cgroup", "12:cpu,cpuacct:/x\n9:memory:/kubepods/pod1\n"),
            ("sys/fs/cgroup/memory/kubepods/pod1/memory.limit_in_bytes", "1073741824\n"),
            ("sys/fs/cgroup/memory/kubepods/pod1/memory.memsw.limit_in_bytes", "1073741824\n"),
        ]);
        assert!(matches!(Swap::detect(r.path()), Swap::DeniedByCgroup { .. }));
    }

    #[test]
    fn the_description_names_the_method_and_the_swap() {
        let reset = MemoryReset { method: ResetMethod::DirtyPageScan, swap: Swap::Allowed { total: ByteSize::gib(2) } };
        let text = reset.to_string();
        assert!(text.contains("PAGEMAP_SCAN") && text.contains("swap included") && text.contains("usable"), "{text}");
        assert!(!text.contains('\n'));
        let reset = MemoryReset { method: ResetMethod::Madvise, swap: Swap::None };
        assert!(reset.to_string().contains("madvise"));
    }
}
