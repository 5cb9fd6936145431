//! Compiling a plugin in a child process under resource limits, so no file in `plugins/` can take the host's memory or CPU.
//!
//! Cranelift has inputs that cost it far more than their size (issue 25: a
//! 1.2 MB component with one function of 20,000 locals took 705 MiB and 11 s), and
//! wasmtime's guidance for untrusted code is to compile it in another process
//! with resource limits. The host runs its own binary as `hourglass
//! compile-worker`: the plugin's bytes arrive on stdin, the compiled artifact
//! goes to one file in the cache folder (temp file + rename), and the kernel
//! holds the child to `compile_memory_limit` (RLIMIT_AS, which bounds its
//! resident memory too) and `compile_timeout` (RLIMIT_CPU, over all its
//! threads). The child inherits no environment (it gets one allocator
//! setting) and no descriptor but its stdio, runs at low CPU priority, dies
//! with the thread that started it, and may not open sockets or trace other
//! processes (seccomp). A child ended by a limit is one line naming the
//! limit, and the plugin is refused.
//!
//! A cache hit starts no child: the host maps the cached file as before.

// The child's limits are set between fork and exec (`pre_exec`: setrlimit,
// prctl and setpriority, plain syscalls on the new process only), and the
// parent reaps it with wait4 to read its peak memory and CPU time, and
// kills it by pid when it overstays (the pid is ours until it is reaped).
#![allow(unsafe_code)]

use std::fmt;
use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use bytesize::ByteSize;

/// Exit code of a worker whose input is not a valid component (the plugin's fault).
const EXIT_INVALID: i32 = 2;
/// Exit code of a worker that could not read its input or write the artifact.
const EXIT_IO: i32 = 3;
/// The wall-clock backstop, as a multiple of `compile_timeout` (CPU time):
/// a compile at low priority on a busy host gets less than a core, so its
/// wall time may well exceed its CPU time; this only ends a stalled child.
const WALL_FACTOR: u32 = 10;
/// Most bytes of the worker's stderr kept for the error line.
const STDERR_KEEP: usize = 4096;

/// What compiling one plugin may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CompileLimits {
    /// Larger plugin files are refused before they are read (`max_plugin_size`).
    pub max_plugin_size: u64,
    /// Address space of the compiling process (`compile_memory_limit`).
    pub memory: u64,
    /// CPU time of the compiling process, all threads together (`compile_timeout`).
    pub cpu_time: Duration,
    /// Threads (and allocator arenas) of the compiling process (`compile_threads`).
    pub threads: usize,
}

/// Default `compile_memory_limit` and `compile_timeout`: the Python and
/// JavaScript examples (interpreters) need up to 640 MiB of address space and
/// 10 s of CPU here (BENCHMARKS.md); these leave room for larger plugins and
/// slower machines.
const DEFAULT_COMPILE_MEMORY: u64 = 1024 * 1024 * 1024;
const DEFAULT_COMPILE_CPU: Duration = Duration::from_secs(120);
/// Default `max_plugin_size`.
const DEFAULT_MAX_PLUGIN_SIZE: u64 = 64 * 1024 * 1024;
/// Compile threads: the figures above were measured with two, and a compile
/// runs once per plugin version (then it is mapped from the cache).
pub const DEFAULT_COMPILE_THREADS: usize = 2;

/// The defaults of runner.toml's `max_plugin_size`, `compile_memory_limit`,
/// `compile_timeout` and `compile_threads`; the same on any number of cores.
impl Default for CompileLimits {
    fn default() -> Self {
        CompileLimits {
            max_plugin_size: DEFAULT_MAX_PLUGIN_SIZE,
            memory: DEFAULT_COMPILE_MEMORY,
            cpu_time: DEFAULT_COMPILE_CPU,
            threads: DEFAULT_COMPILE_THREADS,
        }
    }
}

/// Where plugins are compiled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Compiler {
    /// In a child process running `program compile-worker`, under [`CompileLimits`]:
    /// what `hourglass run` and `hourglass plugin check` do.
    Child {
        /// The `hourglass` binary.
        program: PathBuf,
    },
    /// In this process, with no memory or CPU bound: for embedding the
    /// runtime where no `hourglass` binary is at hand (its own tests).
    InProcess,
}

impl Compiler {
    /// A child running this very binary: `/proc/self/exe` still names it
    /// after the file was replaced on disk (an upgrade in place), so the
    /// child always compiles with the engine settings of this host.
    pub fn this_binary() -> Compiler {
        let program = if Path::new("/proc/self/exe").exists() {
            PathBuf::from("/proc/self/exe")
        } else {
            std::env::current_exe().unwrap_or_else(|_| PathBuf::from("hourglass"))
        };
        Compiler::Child { program }
    }
}

/// What one compile took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompileStats {
    /// Wall-clock time, spawn to exit.
    pub wall: Duration,
    /// CPU time of the compiling process (`None` in process: not measured apart from the host's).
    pub cpu: Option<Duration>,
    /// Peak resident memory of the compiling process (`None` in process).
    pub peak_rss: Option<u64>,
}

impl fmt::Display for CompileStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let secs = |d: Duration| {
            if d < Duration::from_secs(1) {
                format!("{} ms", d.as_millis())
            } else {
                format!("{:.1} s", d.as_secs_f64())
            }
        };
        write!(f, "{}", secs(self.wall))?;
        if let Some(cpu) = self.cpu {
            write!(f, " ({} of CPU)", secs(cpu))?;
        }
        if let Some(peak) = self.peak_rss {
            write!(f, ", peak {}", size(peak))?;
        }
        Ok(())
    }
}

/// A plugin the host will not load as it is: not a component, not the
/// world, over a limit. The plugin's fault, so the same file is not tried
/// again until it changes (or the limits do); other errors (I/O) are retried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused(pub String);

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refused {}

/// An error that says the plugin is refused (see [`Refused`]).
pub(crate) fn refused(message: String) -> anyhow::Error {
    anyhow::Error::new(Refused(message))
}

/// Whether `e` refuses the plugin (rather than failing for a reason of the host's).
pub fn is_refused(e: &anyhow::Error) -> bool {
    e.downcast_ref::<Refused>().is_some()
}

/// `n` bytes the way runner.toml spells them (`512 MiB`, `2 GiB`), or bytesize's text.
pub(crate) fn size(n: u64) -> String {
    const MIB: u64 = 1024 * 1024;
    const GIB: u64 = 1024 * MIB;
    match n {
        n if n >= GIB && n % GIB == 0 => format!("{} GiB", n / GIB),
        n if n >= MIB && n % MIB == 0 => format!("{} MiB", n / MIB),
        n => ByteSize::b(n).to_string(),
    }
}

/// Reads a plugin file, refusing it unread when it is over `max` bytes.
pub(crate) fn read_plugin(path: &Path, max: u64) -> Result<Vec<u8>> {
    let over = |len: u64| {
        refused(format!(
            "{}: plugin file of {} is over max_plugin_size = {}; not read",
            path.display(),
            size(len),
            size(max)
        ))
    };
    let file = std::fs::File::open(path).with_context(|| format!("{}: cannot read plugin", path.display()))?;
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    if len > max {
        return Err(over(len));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    // Bounded even if the file grows while it is read.
    file.take(max + 1).read_to_end(&mut bytes).with_context(|| format!("{}: cannot read plugin", path.display()))?;
    if bytes.len() as u64 > max {
        return Err(over(bytes.len() as u64));
    }
    Ok(bytes)
}

/// Compiles `bytes` in a child process running `program`, which writes the
/// artifact to `dest` (a file in an existing folder). `path` names the
/// plugin in errors.
pub(crate) fn in_child(
    program: &Path,
    path: &Path,
    bytes: &[u8],
    dest: &Path,
    limits: &CompileLimits,
) -> Result<CompileStats> {
    let (dir, name) = match (dest.parent(), dest.file_name()) {
        (Some(dir), Some(name)) => (dir, name),
        _ => return Err(anyhow!("compile destination {} is not a file path", dest.display())),
    };
    let started = Instant::now();
    let mut command = Command::new(program);
    command
        .arg("compile-worker")
        .arg("--out")
        .arg(name)
        .arg("--threads")
        .arg(limits.threads.to_string())
        .current_dir(dir)
        .env_clear()
        // The limit is on address space, so what takes it must not grow with
        // the machine: jemalloc would make 4 arenas per core, each keeping
        // what its threads freed, and unmap nothing (retain). One arena per
        // compile thread and the main one, and freed memory unmapped.
        .env("_RJEM_MALLOC_CONF", format!("narenas:{},retain:false", limits.threads + 1))
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let (memory, cpu_secs) = (limits.memory, limits.cpu_time.as_secs().max(1));
    // SAFETY: the closure runs in the forked child before exec and only makes
    // syscalls (no allocation, no locks), as pre_exec requires.
    unsafe {
        command.pre_exec(move || child_limits(memory, cpu_secs));
    }
    let mut child = command
        .spawn()
        .with_context(|| format!("{}: cannot start the compile worker {}", path.display(), program.display()))?;
    let pid = child.id() as libc::pid_t;

    // The wall-clock backstop: kills a child that outlives it.
    let wall_limit = limits.cpu_time.saturating_mul(WALL_FACTOR);
    let (done, finished) = mpsc::channel::<()>();
    let overstayed = Arc::new(AtomicBool::new(false));
    let watchdog = {
        let overstayed = overstayed.clone();
        std::thread::Builder::new()
            .name("hourglass-compile-watch".into())
            .spawn(move || {
                if finished.recv_timeout(wall_limit) == Err(mpsc::RecvTimeoutError::Timeout) {
                    overstayed.store(true, Ordering::SeqCst);
                    // SAFETY: `pid` is our child, not reaped yet (the reaper waits for this thread).
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
            })
            .context("cannot start the compile watchdog")?
    };

    // The worker reads all of stdin before it writes anything; a worker that
    // died early just makes this write fail (EPIPE), which its status explains.
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(bytes);
    }
    let mut stderr = Vec::new();
    if let Some(mut pipe) = child.stderr.take() {
        let _ = (&mut pipe).take(STDERR_KEEP as u64).read_to_end(&mut stderr);
        // Drain the rest (a worker writes one line; this is only a bound).
        let _ = std::io::copy(&mut pipe, &mut std::io::sink());
    }
    let reaped = reap(pid);
    let _ = done.send(());
    let _ = watchdog.join();
    let (status, usage) = reaped.with_context(|| format!("{}: cannot wait for the compile worker", path.display()))?;
    let stats = CompileStats {
        wall: started.elapsed(),
        cpu: Some(cpu_time(&usage)),
        peak_rss: Some(u64::try_from(usage.ru_maxrss).unwrap_or(0) * 1024),
    };
    let stderr = crate::one_line(&String::from_utf8_lossy(&stderr));
    let plugin = path.display();
    if overstayed.load(Ordering::SeqCst) {
        return Err(refused(format!(
            "{plugin}: compile did not finish in {} of wall-clock time ({WALL_FACTOR} × compile_timeout)",
            humantime::format_duration(wall_limit)
        )));
    }
    if out_of_memory(&stderr) {
        return Err(refused(format!("{plugin}: compile exceeded {} (compile_memory_limit)", size(limits.memory))));
    }
    if libc::WIFSIGNALED(status) {
        let signal = libc::WTERMSIG(status);
        if signal == libc::SIGXCPU || (signal == libc::SIGKILL && stats.cpu >= Some(Duration::from_secs(cpu_secs))) {
            return Err(refused(format!(
                "{plugin}: compile exceeded {} of CPU time (compile_timeout)",
                humantime::format_duration(Duration::from_secs(cpu_secs))
            )));
        }
        let why = if stderr.is_empty() { String::new() } else { format!(": {stderr}") };
        return Err(refused(format!("{plugin}: the compiler crashed (signal {signal}){why}")));
    }
    match libc::WEXITSTATUS(status) {
        0 => Ok(stats),
        EXIT_INVALID => Err(refused(format!("{plugin}: invalid WebAssembly component: {stderr}"))),
        code => Err(anyhow!("{plugin}: the compile worker failed (exit {code}): {stderr}")),
    }
}

/// Whether the worker's last words say an allocation failed (RLIMIT_AS reached).
fn out_of_memory(stderr: &str) -> bool {
    ["memory allocation of", "Cannot allocate memory", "out of memory", "failed to allocate"]
        .iter()
        .any(|needle| stderr.contains(needle))
}

/// Limits of the worker process, set between fork and exec.
fn child_limits(memory: u64, cpu_secs: u64) -> std::io::Result<()> {
    let set = |resource, soft: u64, hard: u64| {
        let limit = libc::rlimit { rlim_cur: soft, rlim_max: hard };
        // SAFETY: a plain syscall on this (child) process.
        if unsafe { libc::setrlimit(resource, &limit) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    };
    set(libc::RLIMIT_AS, memory, memory)?;
    // SIGXCPU at the limit, SIGKILL a second later if it is ignored.
    set(libc::RLIMIT_CPU, cpu_secs, cpu_secs + 1)?;
    // A killed compile dumps no core of hundreds of MiB.
    set(libc::RLIMIT_CORE, 0, 0)?;
    // SAFETY: plain syscalls on this process. The worker dies with the host
    // thread that started it; it gets less CPU than the tasks the host runs.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0);
        libc::setpriority(libc::PRIO_PROCESS, 0, super::priority::COMPILE_NICE);
        // Every descriptor but stdio closes at exec (Rust opens its own
        // close-on-exec; this covers any a library opened without it).
        // Kernels before 5.11 lack the flag: the call fails and nothing changes.
        libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, libc::CLOSE_RANGE_CLOEXEC);
    }
    Ok(())
}

/// Waits for `pid` and returns its status and resource usage.
fn reap(pid: libc::pid_t) -> std::io::Result<(libc::c_int, libc::rusage)> {
    let mut status: libc::c_int = 0;
    // SAFETY: rusage is plain data; wait4 fills it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: waits for our own child and writes into the two locals.
        let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
        if r == pid {
            return Ok((status, usage));
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

fn cpu_time(usage: &libc::rusage) -> Duration {
    let tv = |t: libc::timeval| {
        Duration::from_secs(u64::try_from(t.tv_sec).unwrap_or(0))
            + Duration::from_micros(u64::try_from(t.tv_usec).unwrap_or(0))
    };
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// The arguments of `hourglass compile-worker` (and of the bench's).
#[derive(Debug, Clone, clap::Args)]
pub struct WorkerArgs {
    /// Where the compiled artifact goes (temp file + rename).
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,
    /// Compile threads (`compile_threads`): never the machine's core count.
    #[arg(
        long,
        value_name = "N",
        default_value_t = DEFAULT_COMPILE_THREADS as u16,
        value_parser = clap::value_parser!(u16).range(1..=crate::MAX_THREADS as i64)
    )]
    pub threads: u16,
}

/// The one entry of a compile worker, for every binary a host may start as
/// one (`hourglass`, `hourglass-bench`): when this process was started as
/// `<program> compile-worker --out FILE --threads N`, runs [`worker`] and
/// returns its exit code; otherwise `None`, and the program goes on. It
/// runs before logging, threads and config, which the worker has none of.
pub fn worker_if_asked() -> Option<ExitCode> {
    use clap::Parser;

    /// `<program> compile-worker ...`.
    #[derive(Debug, clap::Parser)]
    #[command(name = "compile-worker")]
    struct Invocation {
        #[command(flatten)]
        args: WorkerArgs,
    }

    if std::env::args_os().nth(1)? != "compile-worker" {
        return None;
    }
    Some(match Invocation::try_parse_from(std::env::args_os().skip(1)) {
        Ok(invocation) => worker(&invocation.args),
        Err(e) => {
            let text = e.to_string();
            let first = text.lines().next().unwrap_or_default().trim_start_matches("error: ");
            eprintln!("error: compile-worker: {first}");
            // A usage error: clap's own status, as both binaries' parsers gave before.
            ExitCode::from(2)
        }
    })
}

/// `hourglass compile-worker --out FILE --threads N`: the child's side. Reads a
/// component from stdin, compiles it with the host's engine settings on N
/// threads and writes the artifact to FILE (in the current folder: the cache
/// folder) by temp file and rename, so a host never maps half a file.
///
/// Exit 0 when written, 2 when the input is not a valid component (the
/// error on stderr, one line), 3 on an I/O error.
pub fn worker(args: &WorkerArgs) -> ExitCode {
    let out = args.out.as_path();
    deny_network_and_tracing();
    // wasmtime compiles functions in parallel on rayon's global pool, which
    // would otherwise have one thread per core (or RAYON_NUM_THREADS): each
    // thread holds a function's compile state at once, so the memory a
    // compile takes would grow with the machine (issue 35: 16 cores
    // refused noop.wasm at 1 GiB). A fixed count keeps the limit's meaning.
    if let Err(e) = rayon::ThreadPoolBuilder::new().num_threads(usize::from(args.threads)).build_global() {
        eprintln!("cannot start the compile threads: {e}");
        return ExitCode::from(EXIT_IO as u8);
    }
    let mut bytes = Vec::new();
    if let Err(e) = std::io::stdin().lock().read_to_end(&mut bytes) {
        eprintln!("cannot read the plugin from stdin: {e}");
        return ExitCode::from(EXIT_IO as u8);
    }
    let compiled =
        wasmtime::Engine::new(&super::engine_config()).and_then(|engine| engine.precompile_component(&bytes));
    drop(bytes);
    let compiled = match compiled {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{}", crate::one_line(&format!("{e:#}")));
            return ExitCode::from(EXIT_INVALID as u8);
        }
    };
    match write_atomically(out, &compiled) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cannot write the compiled plugin {}: {e}", out.display());
            ExitCode::from(EXIT_IO as u8)
        }
    }
}

/// Writes `data` to `dest` through a temp file beside it and a rename.
pub(crate) fn write_atomically(dest: &Path, data: &[u8]) -> std::io::Result<()> {
    let dir = dest.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let tmp = dir.join(format!(".{}.{:x}.tmp", std::process::id(), rand::random::<u64>()));
    let written = std::fs::write(&tmp, data).and_then(|()| std::fs::rename(&tmp, dest));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// The worker may not open sockets or look into other processes: a bug in
/// the compiler that a plugin could exploit still reaches nothing. Where
/// seccomp is unavailable the worker goes on without it (the memory and CPU
/// limits, which the kernel sets before exec, still hold).
fn deny_network_and_tracing() {
    use seccompiler::{BpfProgram, SeccompAction, SeccompFilter};
    let denied = [libc::SYS_socket, libc::SYS_ptrace, libc::SYS_process_vm_readv, libc::SYS_process_vm_writev];
    let Ok(arch) = std::env::consts::ARCH.try_into() else { return };
    let filter = SeccompFilter::new(
        denied.iter().map(|&nr| (nr, Vec::new())).collect(),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EACCES as u32),
        arch,
    );
    let program: Option<BpfProgram> = filter.ok().and_then(|f| f.try_into().ok());
    if let Some(program) = program
        && let Err(e) = seccompiler::apply_filter(&program)
    {
        eprintln!("note: compiling without the seccomp filter: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_like_runner_toml() {
        assert_eq!(size(512 * 1024 * 1024), "512 MiB");
        assert_eq!(size(64 * 1024 * 1024), "64 MiB");
        assert_eq!(size(2 * 1024 * 1024 * 1024), "2 GiB");
        assert!(size(1500).contains("KiB"), "{}", size(1500));
    }

    #[test]
    fn a_file_over_the_size_limit_is_refused_unread() {
        let dir = std::env::temp_dir().join(format!("hourglass-size-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("big.wasm");
        std::fs::write(&file, vec![0u8; 4096]).unwrap();
        let err = read_plugin(&file, 1024).unwrap_err();
        assert!(is_refused(&err));
        let text = format!("{err:#}");
        assert!(text.contains("big.wasm: plugin file of 4.0 KiB is over max_plugin_size = 1.0 KiB"), "{text}");
        assert_eq!(read_plugin(&file, 4096).unwrap().len(), 4096);
        let missing = read_plugin(&dir.join("missing.wasm"), 4096).unwrap_err();
        assert!(!is_refused(&missing), "a missing file is retried, not refused");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn allocation_failures_read_as_the_memory_limit() {
        assert!(out_of_memory("memory allocation of 1048576 bytes failed"));
        assert!(!out_of_memory("invalid WebAssembly"));
    }
}
