//! Test harness: a private `redis-server` per test and the compiled plugins.
//!
//! Every test gets its own Redis on a unix socket in a temp dir, so tests run
//! in parallel and never touch the machine's shared 6379.

#![allow(dead_code)]

mod server;

pub use server::*;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// A loopback TCP port nothing listens on now (for a server a test starts).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// Builds every plugin once per test binary (cargo's own lock serialises
/// concurrent builds) and returns the folder with the example `*.wasm`.
pub fn plugins_dir() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let root = workspace_root();
            let status =
                Command::new("bash").arg(root.join("plugins/build.sh")).status().expect("run plugins/build.sh");
            assert!(status.success(), "plugins/build.sh failed");
            root.join("plugins")
        })
        .clone()
}

/// Path of a compiled example plugin, e.g. `plugin("noop")`.
pub fn plugin(name: &str) -> PathBuf {
    plugins_dir().join(format!("{name}.wasm"))
}

/// Path of a compiled test-only plugin from `plugins/testing/`, e.g. `test_plugin("chaos")`.
pub fn test_plugin(name: &str) -> PathBuf {
    plugins_dir().join("testing").join(format!("{name}.wasm"))
}

/// Path of a compiled Python or JavaScript example plugin, e.g. `polyglot_plugin("py.echo")`.
/// Builds them (and installs their toolchains when missing) once per test binary
/// with `plugins/build-polyglot.sh`, which skips plugins that are up to date.
pub fn polyglot_plugin(name: &str) -> PathBuf {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        let script = workspace_root().join("plugins/build-polyglot.sh");
        let status = Command::new("bash").arg(script).status().expect("run plugins/build-polyglot.sh");
        assert!(status.success(), "plugins/build-polyglot.sh failed");
    });
    workspace_root().join("plugins").join(format!("{name}.wasm"))
}

/// The grant the heartbeat example needs in runner.toml: `device.offline`
/// schedules `device.alert` follow-ups.
pub const DEVICE_GRANTS: &str = "[types.\"device.offline\"]\nmay_schedule = [\"device.alert\"]\n";

/// The built `hourglass` binary (the host package's tests; the benchmark's
/// tests, which share this module, do not start hosts).
pub fn hourglass_bin() -> PathBuf {
    match option_env!("CARGO_BIN_EXE_hourglass") {
        Some(path) => PathBuf::from(path),
        None => panic!("the hourglass binary is built for the host's tests only"),
    }
}

/// Runs the built `hourglass <args>` against `redis` (`--redis`, whatever the environment says).
pub fn hourglass_on(redis: &RedisServer, args: &[&str]) -> std::process::Output {
    Command::new(hourglass_bin())
        .arg("--redis")
        .arg(redis.url())
        .args(args)
        .env_remove("HOURGLASS_REDIS_URL")
        .output()
        .unwrap()
}

/// Compiles in a child process running the built `hourglass`, under the
/// default limits, as `hourglass run` does.
pub fn compiler() -> hourglass::runtime::Compiler {
    hourglass::runtime::Compiler::Child { program: hourglass_bin() }
}

/// A running `hourglass run` child process with its own config, plugins
/// folder and log file; killed on drop.
pub struct Host {
    child: Option<Child>,
    pub dir: tempfile::TempDir,
    pub log: PathBuf,
    /// Environment variables the process gets beside the test's own.
    env: Vec<(String, String)>,
    /// Started as a user would from the host's folder: `--config runner.toml`
    /// (relative), `--redis` this URL and `--plugins plugins`, no `[redis]` table.
    from_folder: Option<String>,
}

impl Host {
    /// Writes `runner.toml` (with `config` appended to a `[redis]` table
    /// pointing at `redis`) and a plugins folder holding `plugins`
    /// (`(task type, compiled .wasm)` pairs), then starts the host.
    pub fn start(redis: &RedisServer, plugins: &[(&str, PathBuf)], config: &str) -> Host {
        Host::start_at(&redis.url(), plugins, config)
    }

    /// [`Host::start`] against any Redis URL (e.g. `redis+cluster://...`). Lines of
    /// `config` before its `[runner]` header land in the `[redis]` table.
    pub fn start_at(url: &str, plugins: &[(&str, PathBuf)], config: &str) -> Host {
        Host::start_with_cache(url, plugins, config, None, &[], false)
    }

    /// [`Host::start`] with environment variables set for the process (e.g. `HOURGLASS_ADMIN_LISTEN`).
    pub fn start_with_env(
        redis: &RedisServer,
        plugins: &[(&str, PathBuf)],
        config: &str,
        env: &[(&str, &str)],
    ) -> Host {
        Host::start_with_cache(&redis.url(), plugins, config, None, env, false)
    }

    /// [`Host::start`] with a compile cache of its own, empty at first (a first start).
    pub fn start_cold(redis: &RedisServer, plugins: &[(&str, PathBuf)], config: &str) -> Host {
        let cache = tempfile::tempdir().unwrap().keep();
        Host::start_with_cache(&redis.url(), plugins, config, Some(cache), &[], false)
    }

    fn start_with_cache(
        url: &str,
        plugins: &[(&str, PathBuf)],
        config: &str,
        cache: Option<PathBuf>,
        env: &[(&str, &str)],
        from_folder: bool,
    ) -> Host {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("plugins")).unwrap();
        for (task_type, wasm) in plugins {
            std::fs::copy(wasm, dir.path().join("plugins").join(format!("{task_type}.wasm"))).unwrap();
        }
        let cache = cache.unwrap_or_else(|| workspace_root().join("target/test-plugin-cache"));
        // Share one compile cache across tests; merge it into the caller's [runner] table.
        let cache_line = format!("cache_dir = \"{}\"\n", cache.display());
        let config = if config.contains("[runner]\n") {
            config.replacen("[runner]\n", &format!("[runner]\n{cache_line}"), 1)
        } else {
            format!("[runner]\n{cache_line}{config}")
        };
        let redis_table = if from_folder { String::new() } else { format!("[redis]\nurl = \"{url}\"\n") };
        std::fs::write(dir.path().join("runner.toml"), format!("{redis_table}{config}\n")).unwrap();
        let env = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let from_folder = from_folder.then(|| url.to_owned());
        let mut host = Host { child: None, log: dir.path().join("host.log"), dir, env, from_folder };
        host.spawn();
        host
    }

    /// [`Host::start`] as an operator starts a host from its folder:
    /// `hourglass --config runner.toml --redis URL run --plugins plugins`,
    /// relative paths, the URL given by flag and `runner.toml` holding only `config`.
    pub fn start_from_folder(redis: &RedisServer, plugins: &[(&str, PathBuf)], config: &str) -> Host {
        Host::start_with_cache(&redis.url(), plugins, config, None, &[], true)
    }

    /// Starts the process (again) on the same folder; the log is appended to.
    pub fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log).unwrap();
        let mut command = Command::new(hourglass_bin());
        match &self.from_folder {
            Some(url) => {
                command.current_dir(self.dir.path()).args(["--config", "runner.toml", "--redis", url]);
                command.args(["run", "--plugins", "plugins"])
            }
            None => command.arg("--config").arg(self.dir.path().join("runner.toml")).arg("run"),
        };
        let child = command
            .env("HOURGLASS_LOG", "info,hourglass=debug,hourglass_store=debug")
            .env("NO_COLOR", "1")
            .env_remove("HOURGLASS_REDIS_URL")
            .env_remove("HOURGLASS_ADMIN_LISTEN")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start hourglass");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.log().contains("hourglass is running") {
            let exited = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten());
            assert!(exited.is_none(), "host exited at start ({exited:?}); log:\n{}", self.log());
            assert!(Instant::now() < deadline, "host did not start; log:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The host's process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// A number field of the host's `/proc/<pid>/status` in kB (or a count), e.g. `"VmHWM:"`.
    pub fn proc_status(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        let line = status.lines().find(|l| l.starts_with(field)).unwrap_or_else(|| panic!("no {field} in status"));
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    /// The plugins folder the host watches.
    pub fn plugins(&self) -> PathBuf {
        self.dir.path().join("plugins")
    }

    /// Puts `wasm` into the running host's plugins folder as `<task_type>.wasm`
    /// the way deploy tools do: copied under another name, then renamed into place.
    pub fn drop_in(&self, task_type: &str, wasm: &Path) {
        let staged = self.dir.path().join(format!("{task_type}.wasm.new"));
        std::fs::copy(wasm, &staged).unwrap();
        std::fs::rename(&staged, self.plugins().join(format!("{task_type}.wasm"))).unwrap();
    }

    /// Everything the host logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the log contains `needle` (panics with the log otherwise).
    pub fn wait_log(&self, needle: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while !self.log().contains(needle) {
            assert!(Instant::now() < deadline, "host never logged {needle:?}; log:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends a signal (`"TERM"`, `"KILL"`, `"INT"`) to the host.
    pub fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("running").id();
        let status = Command::new("kill").arg(format!("-{signal}")).arg(pid.to_string()).status().unwrap();
        assert!(status.success());
    }

    /// Waits for the host to exit and returns its exit code.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<i32> {
        let mut child = self.child.take().expect("running");
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status.code();
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("host did not exit in time; log:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// How many times the host logged that task `id` of `task_type` succeeded.
    pub fn runs_of(&self, log: &str, task_type: &str, id: &str) -> usize {
        let needle_id = format!("task_id={id} ");
        let needle_type = format!("task_type={task_type} ");
        log.lines().filter(|l| l.contains("succeeded") && l.contains(&needle_type) && l.contains(&needle_id)).count()
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A `MakeWriter` into a shared buffer, to read what was logged.
#[derive(Clone, Default)]
struct LogBuf(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for LogBuf {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(data);
        Ok(data.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Runs `f` with a thread-local subscriber (TRACE) and returns what it logged, as text.
pub fn capture_logs<T>(f: impl FnOnce() -> T) -> (T, String) {
    let buf = LogBuf::default();
    let writer = buf.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let out = tracing::subscriber::with_default(subscriber, f);
    let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
    (out, text)
}

/// Runs a handler's task to its end from a test's plain thread, as the host's
/// executor would (the future is polled on the calling thread, so a
/// thread-local log subscriber from [`capture_logs`] sees its lines).
pub trait RunNow {
    /// [`hourglass::runtime::Handler::run`], blocking.
    fn run_now(&self, task: &hourglass::task::ClaimedTask) -> hourglass::runtime::TaskRun;
}

impl RunNow for hourglass::runtime::Handler {
    fn run_now(&self, task: &hourglass::task::ClaimedTask) -> hourglass::runtime::TaskRun {
        tokio_runtime().block_on(self.run(task, Default::default()))
    }
}

// --- a tiny HTTP/1.1 client for the admin server --------------------------

use std::collections::HashMap;
use std::io::{Read as _, Write as _};
use std::net::TcpStream;

const HTTP_WAIT: Duration = Duration::from_secs(60);

/// `host:port` of a host's admin server, from its start-up log line.
pub fn admin_addr(host: &Host) -> String {
    let log = host.log();
    let at = log.find("admin server listening: http://").unwrap_or_else(|| panic!("no admin address in:\n{log}"));
    let rest = &log[at + "admin server listening: http://".len()..];
    rest[..rest.find('/').unwrap()].to_owned()
}

/// A response of the tiny HTTP client below.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: HashMap<String, String>,
    pub body: String,
}

/// One HTTP/1.1 request with `Connection: close`; enough for these tests, no dependency.
pub fn http(addr: &str, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Response {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(HTTP_WAIT)).unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if method == "POST" {
        req.push_str("Content-Type: application/x-www-form-urlencoded\r\n");
    }
    req.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    stream.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").expect("a complete response");
    let mut lines = head.lines();
    let status = lines.next().unwrap().split(' ').nth(1).unwrap().parse().unwrap();
    let headers: HashMap<String, String> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let body =
        if headers.get("transfer-encoding").is_some_and(|v| v == "chunked") { dechunk(body) } else { body.to_owned() };
    Response { status, headers, body }
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        s = &rest[n + 2..];
    }
    out
}

pub fn get(addr: &str, path: &str) -> Response {
    http(addr, "GET", path, &[], "")
}

pub fn post(addr: &str, path: &str, form: &str) -> Response {
    http(addr, "POST", path, &[], form)
}

/// The value of one Prometheus sample: `name` with every `labels` pair (`type="noop"`), if exposed.
pub fn sample(metrics: &str, name: &str, labels: &[&str]) -> Option<f64> {
    metrics.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (series, value) = l.rsplit_once(' ')?;
        let (metric, rest) = series.split_once('{').unwrap_or((series, ""));
        (metric == name && labels.iter().all(|p| rest.contains(p))).then(|| value.parse().ok())?
    })
}

/// A valid component whose one core module has `funcs` functions of `locals`
/// i64 locals, each `loops` loops of `shuffles` local-to-local moves: small
/// on disk, costly for Cranelift's register allocator (a compile bomb).
/// Deterministic: the same arguments give the same bytes.
pub fn compile_bomb(funcs: u32, locals: u32, loops: u32, shuffles: u32) -> Vec<u8> {
    use wasm_encoder::{
        BlockType, CodeSection, Component, Function, FunctionSection, Module, ModuleSection, TypeSection, ValType,
    };
    let mut types = TypeSection::new();
    types.ty().function([], []);
    let mut functions = FunctionSection::new();
    let mut code = CodeSection::new();
    let mut seed: u32 = 0x2545_F491;
    let mut local = || {
        seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        (seed >> 8) % locals
    };
    for _ in 0..funcs {
        functions.function(0);
        let mut f = Function::new([(locals, ValType::I64)]);
        for _ in 0..loops {
            f.instructions().loop_(BlockType::Empty);
            for _ in 0..shuffles {
                let (from, to) = (local(), local());
                f.instructions().local_get(from).local_set(to);
            }
            f.instructions().local_get(local()).i64_eqz().br_if(0).end();
        }
        f.instructions().end();
        code.function(&f);
    }
    let mut module = Module::new();
    module.section(&types).section(&functions).section(&code);
    let mut component = Component::new();
    component.section(&ModuleSection(&module));
    component.finish()
}

/// The peak resident memory of a host and of the compile workers it starts,
/// sampled every few ms from /proc until the sampler is stopped.
pub struct MemorySampler {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<MemoryPeaks>>,
}

/// What a [`MemorySampler`] saw, in kB.
#[derive(Debug, Default, Clone, Copy)]
pub struct MemoryPeaks {
    /// The most the host and its children held at once (sum of VmRSS).
    pub together: u64,
    /// The largest peak (VmHWM) of any child seen.
    pub child: u64,
    /// How many child processes were seen.
    pub children_seen: usize,
}

impl MemorySampler {
    pub fn start(pid: u32) -> MemorySampler {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut peaks = MemoryPeaks::default();
            let mut seen = std::collections::HashSet::new();
            while !stopped.load(std::sync::atomic::Ordering::SeqCst) {
                let mut together = proc_kb(pid, "VmRSS:").unwrap_or(0);
                for child in children_of(pid) {
                    together += proc_kb(child, "VmRSS:").unwrap_or(0);
                    peaks.child = peaks.child.max(proc_kb(child, "VmHWM:").unwrap_or(0));
                    seen.insert(child);
                }
                peaks.together = peaks.together.max(together);
                std::thread::sleep(Duration::from_millis(2));
            }
            peaks.children_seen = seen.len();
            peaks
        });
        MemorySampler { stop, thread: Some(thread) }
    }

    pub fn finish(mut self) -> MemoryPeaks {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        self.thread.take().unwrap().join().unwrap()
    }
}

/// A `/proc/<pid>/status` field in kB, while the process lives.
fn proc_kb(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find(|l| l.starts_with(field))?.split_whitespace().nth(1)?.parse().ok()
}

/// The live children of `pid`, over all its threads.
fn children_of(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return Vec::new() };
    tasks
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("children")).ok())
        .flat_map(|list| list.split_whitespace().filter_map(|p| p.parse().ok()).collect::<Vec<u32>>())
        .collect()
}
