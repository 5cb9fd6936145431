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
        let out = Command::new("redis-cli")
            .arg("-s")
            .arg(&self.socket)
            .args(args)
            .output()
            .expect("redis-cli");
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
            let status = Command::new("bash")
                .arg(root.join("plugins/build.sh"))
                .status()
                .expect("run plugins/build.sh");
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
