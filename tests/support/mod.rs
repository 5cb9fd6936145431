//! Test harness: a private `redis-server` per test and the compiled plugins.
//!
//! Every test gets its own Redis on a unix socket in a temp dir, so tests run
//! in parallel and never touch the machine's shared 6379.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// A `redis-server` child on a unix socket; killed on drop.
pub struct RedisServer {
    child: Child,
    dir: tempfile::TempDir,
    socket: PathBuf,
}

impl RedisServer {
    /// Starts a Redis with no persistence.
    pub fn start() -> RedisServer {
        RedisServer::start_with(&[])
    }

    /// Starts a Redis with extra `redis-server` arguments (e.g. `["--appendonly", "yes"]`).
    pub fn start_with(extra: &[&str]) -> RedisServer {
        let dir = tempfile::tempdir().expect("temp dir");
        let socket = dir.path().join("redis.sock");
        let child = spawn_redis(dir.path(), &socket, extra);
        let server = RedisServer { child, dir, socket };
        server.wait_ready();
        server
    }

    /// `redis+unix://` URL of this server.
    pub fn url(&self) -> String {
        format!("redis+unix://{}", self.socket.display())
    }

    /// Folder holding the socket and any data files.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A blocking client connection.
    pub fn client(&self) -> redis::Connection {
        redis::Client::open(self.url()).unwrap().get_connection().unwrap()
    }

    /// Runs `redis-cli` against this server and returns its stdout.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("redis-cli").arg("-s").arg(&self.socket).args(args).output().expect("redis-cli");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Kills the server (SIGKILL) and starts it again on the same socket and data dir.
    pub fn restart(&mut self, extra: &[&str]) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.socket);
        self.child = spawn_redis(self.dir.path(), &self.socket, extra);
        self.wait_ready();
    }

    /// Stops the server without starting it again.
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(client) = redis::Client::open(self.url())
                && let Ok(mut conn) = client.get_connection()
                && redis::cmd("PING").query::<String>(&mut conn).is_ok()
            {
                return;
            }
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn_redis(dir: &Path, socket: &Path, extra: &[&str]) -> Child {
    Command::new("redis-server")
        .args(["--port", "0", "--save", "", "--appendonly", "no", "--daemonize", "no"])
        .arg("--unixsocket")
        .arg(socket)
        .arg("--dir")
        .arg(dir)
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server must be installed (apt-get install redis-server)")
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

/// Polls `check` until it returns `Some`, or panics after `timeout` naming `what`.
///
/// Waits are generous on purpose: this is a correctness helper, never a timing assertion.
pub fn wait_for<T>(what: &str, timeout: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A running `hourglass run` child process with its own config, plugins
/// folder and log file; killed on drop.
pub struct Host {
    child: Option<Child>,
    pub dir: tempfile::TempDir,
    pub log: PathBuf,
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
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("plugins")).unwrap();
        for (task_type, wasm) in plugins {
            std::fs::copy(wasm, dir.path().join("plugins").join(format!("{task_type}.wasm"))).unwrap();
        }
        let cache = workspace_root().join("target/test-plugin-cache");
        // Share one compile cache across tests; merge it into the caller's [runner] table.
        let cache_line = format!("cache_dir = \"{}\"\n", cache.display());
        let config = if config.contains("[runner]\n") {
            config.replacen("[runner]\n", &format!("[runner]\n{cache_line}"), 1)
        } else {
            format!("[runner]\n{cache_line}{config}")
        };
        std::fs::write(dir.path().join("runner.toml"), format!("[redis]\nurl = \"{url}\"\n{config}\n"))
            .unwrap();
        let mut host = Host { child: None, log: dir.path().join("host.log"), dir };
        host.spawn();
        host
    }

    /// Starts the process (again) on the same folder; the log is appended to.
    pub fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_hourglass"))
            .arg("--config")
            .arg(self.dir.path().join("runner.toml"))
            .arg("run")
            .env("HOURGLASS_LOG", "info,hourglass=debug")
            .env("NO_COLOR", "1")
            .env_remove("HOURGLASS_REDIS_URL")
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

    /// The plugins folder the host watches.
    pub fn plugins(&self) -> PathBuf {
        self.dir.path().join("plugins")
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

/// A task written as a client would: `ZADD hourglass:{type}:due <due_ms> <id>`.
pub fn zadd(conn: &mut redis::Connection, task_type: &str, id: &str, due_ms: i64) {
    let _: () = redis::cmd("ZADD").arg(format!("hourglass:{{{task_type}}}:due")).arg(due_ms).arg(id).query(conn).unwrap();
}

/// A task's payload: `HSET hourglass:{type}:payload <id> <body>`.
pub fn payload(conn: &mut redis::Connection, task_type: &str, id: &str, body: &str) {
    let _: () = redis::cmd("HSET").arg(format!("hourglass:{{{task_type}}}:payload")).arg(id).arg(body).query(conn).unwrap();
}

/// A task due now, with its payload unless `body` is empty.
pub fn schedule_now(conn: &mut redis::Connection, task_type: &str, id: &str, body: &str) {
    if !body.is_empty() {
        payload(conn, task_type, id, body);
    }
    zadd(conn, task_type, id, now_ms());
}

/// `ZCARD key`.
pub fn zcard(conn: &mut redis::Connection, key: &str) -> usize {
    redis::cmd("ZCARD").arg(key).query(conn).unwrap()
}

/// `HGET <prefix>:{type}:stats <field>` as a number (0 when absent).
pub fn stat(conn: &mut redis::Connection, task_type: &str, field: &str) -> i64 {
    redis::cmd("HGET")
        .arg(format!("hourglass:{{{task_type}}}:stats"))
        .arg(field)
        .query::<Option<i64>>(conn)
        .unwrap()
        .unwrap_or(0)
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
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
