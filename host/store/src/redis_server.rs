//! A `redis-server` child process: the one spawner behind the managed Redis, `hourglass bench --spawn-redis` / `--spawn-cluster`, and the tests.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// How to start one server.
#[derive(Debug, Clone, Default)]
pub struct ServerSpec {
    /// Its working folder (`--dir`): data files, and the unix socket when there is one.
    pub dir: PathBuf,
    /// TCP port on `bind`; `None`: no TCP (`--port 0`).
    pub port: Option<u16>,
    /// The address the TCP port listens on [default: 127.0.0.1].
    pub bind: Option<String>,
    /// Listen on `<dir>/<socket>` too (a unix socket name, e.g. `redis.sock`).
    pub socket: Option<String>,
    /// Append-only persistence with this `appendfsync` (`everysec`, `always`);
    /// `None`: nothing on disk.
    pub appendfsync: Option<&'static str>,
    /// More arguments (cluster mode, TLS, notification flags ...).
    pub args: Vec<String>,
    /// Where its own log goes; `None`: nowhere.
    pub log: Option<PathBuf>,
}

/// A running `redis-server` child; killed (SIGKILL) on drop.
#[derive(Debug)]
pub struct RedisServer {
    child: Option<Child>,
    spec: ServerSpec,
}

impl RedisServer {
    /// Starts a server by `spec`; `needed_by` says what wants it, in the one-line
    /// error when `redis-server` is not installed.
    pub fn spawn(spec: ServerSpec, needed_by: &str) -> Result<RedisServer> {
        let child = start(&spec, needed_by)?;
        Ok(RedisServer { child: Some(child), spec })
    }

    /// Starts a server by `spec` and waits until it answers.
    pub fn spawn_ready(spec: ServerSpec, needed_by: &str, timeout: Duration) -> Result<RedisServer> {
        let mut server = RedisServer::spawn(spec, needed_by)?;
        server.wait_ready(timeout)?;
        Ok(server)
    }

    /// Waits (blocking) until the server answers `PING`; fails when it exits
    /// first or `timeout` passes.
    pub fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let url = self.url();
        loop {
            if let Ok(client) = redis::Client::open(url.as_str())
                && let Ok(mut conn) = client.get_connection_with_timeout(Duration::from_millis(500))
                && redis::cmd("PING").query::<String>(&mut conn).is_ok()
            {
                return Ok(());
            }
            if let Some(status) = self.exited() {
                bail!("redis-server exited at start ({status}){}", self.see_log());
            }
            if Instant::now() > deadline {
                bail!("redis-server did not answer within {}s{}", timeout.as_secs(), self.see_log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A URL that reaches it: its unix socket when it has one, else its TCP port.
    pub fn url(&self) -> String {
        match (&self.spec.socket, self.spec.port) {
            (Some(socket), _) => format!("redis+unix://{}", self.spec.dir.join(socket).display()),
            (None, Some(port)) => format!("redis://{}:{port}", self.spec.bind.as_deref().unwrap_or("127.0.0.1")),
            (None, None) => String::new(),
        }
    }

    /// Its working folder.
    pub fn dir(&self) -> &Path {
        &self.spec.dir
    }

    /// Its TCP port, if it has one.
    pub fn port(&self) -> Option<u16> {
        self.spec.port
    }

    /// Its unix socket, if it has one.
    pub fn socket(&self) -> Option<PathBuf> {
        self.spec.socket.as_ref().map(|s| self.spec.dir.join(s))
    }

    /// Its process id, while it runs (to stop it with SIGSTOP, say).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Its exit status, once it exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.as_mut().and_then(|c| c.try_wait().ok().flatten())
    }

    /// Waits up to `timeout` for it to exit by itself (after a `SHUTDOWN`); true if it did.
    pub fn wait_exit(&mut self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.child.is_none() || self.exited().is_some() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// Kills it (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn see_log(&self) -> String {
        self.spec.log.as_ref().map(|l| format!("; see {}", l.display())).unwrap_or_default()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

fn start(spec: &ServerSpec, needed_by: &str) -> Result<Child> {
    let mut cmd = Command::new("redis-server");
    cmd.args(["--daemonize", "no", "--save", ""]);
    match spec.port {
        Some(port) => cmd.args(["--port", &port.to_string(), "--bind", spec.bind.as_deref().unwrap_or("127.0.0.1")]),
        None => cmd.args(["--port", "0"]),
    };
    if let Some(socket) = &spec.socket {
        cmd.arg("--unixsocket").arg(spec.dir.join(socket));
    }
    match spec.appendfsync {
        Some(fsync) => cmd.args(["--appendonly", "yes", "--appendfsync", fsync]),
        None => cmd.args(["--appendonly", "no"]),
    };
    // Servers sharing a folder (a cluster's nodes) each need their own RDB file:
    // a replica saves the snapshot of a full sync under this name and then
    // loads it, so with a shared name one replica can load another's dataset.
    let rdb = match (spec.port, &spec.socket) {
        (Some(port), _) => format!("dump-{port}.rdb"),
        (None, Some(socket)) => format!("dump-{socket}.rdb"),
        (None, None) => "dump.rdb".to_owned(),
    };
    cmd.arg("--dir").arg(&spec.dir).arg("--dbfilename").arg(rdb).args(&spec.args);
    let log = match &spec.log {
        Some(path) => {
            Stdio::from(std::fs::File::create(path).with_context(|| format!("cannot write {}", path.display()))?)
        }
        None => Stdio::null(),
    };
    cmd.stdin(Stdio::null()).stdout(log).stderr(Stdio::null());
    cmd.spawn().map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => {
            anyhow::anyhow!("{needed_by} needs redis-server, which is not installed (apt-get install redis-server)")
        }
        _ => anyhow::Error::new(e).context("cannot start redis-server"),
    })
}
