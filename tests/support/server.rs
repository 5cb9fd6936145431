//! The Redis side of the test harness: a private `redis-server` per test,
//! tasks written as clients write them, and the store's view of them. It
//! names only `hourglass-store`, so the store's tests (tests/store) link no
//! wasmtime; the host's tests get it through `support` (tests/support/mod.rs).

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// A ready `redis-server` on `dir/redis.sock`, with `extra` arguments.
fn spawn(dir: PathBuf, extra: &[&str]) -> hourglass_store::redis_server::RedisServer {
    let spec = hourglass_store::redis_server::ServerSpec {
        dir,
        socket: Some("redis.sock".into()),
        args: extra.iter().map(|a| a.to_string()).collect(),
        ..Default::default()
    };
    hourglass_store::redis_server::RedisServer::spawn_ready(spec, "the tests", Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("{e:#}"))
}

/// A `redis-server` child on a unix socket in a temp dir (the library's one
/// spawner); killed on drop.
pub struct RedisServer {
    server: hourglass_store::redis_server::RedisServer,
    _dir: tempfile::TempDir,
}

impl RedisServer {
    /// Starts a Redis with no persistence.
    pub fn start() -> RedisServer {
        RedisServer::start_with(&[])
    }

    /// Starts a Redis with extra `redis-server` arguments (e.g. `["--appendonly", "yes"]`).
    pub fn start_with(extra: &[&str]) -> RedisServer {
        let dir = tempfile::tempdir().expect("temp dir");
        RedisServer { server: spawn(dir.path().to_owned(), extra), _dir: dir }
    }

    /// `redis+unix://` URL of this server.
    pub fn url(&self) -> String {
        self.server.url()
    }

    /// The path of its unix socket.
    pub fn socket(&self) -> PathBuf {
        self.server.socket().expect("a unix socket")
    }

    /// Folder holding the socket and any data files.
    pub fn dir(&self) -> &Path {
        self.server.dir()
    }

    /// A blocking client connection.
    pub fn client(&self) -> redis::Connection {
        redis::Client::open(self.url()).unwrap().get_connection().unwrap()
    }

    /// Runs `redis-cli` against this server and returns its stdout.
    pub fn cli(&self, args: &[&str]) -> String {
        let socket = self.server.socket().expect("a unix socket");
        let out = Command::new("redis-cli").arg("-s").arg(socket).args(args).output().expect("redis-cli");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Kills the server (SIGKILL) and starts it again on the same socket and data dir.
    pub fn restart(&mut self, extra: &[&str]) {
        self.server.kill();
        let _ = std::fs::remove_file(self.socket());
        self.server = spawn(self.dir().to_owned(), extra);
    }

    /// Stops the server without starting it again.
    pub fn stop(&mut self) {
        self.server.kill();
    }
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

/// A task written as a client would: `ZADD hourglass:{type}:due <due_ms> <id>`.
pub fn zadd(conn: &mut redis::Connection, task_type: &str, id: &str, due_ms: i64) {
    let _: () =
        redis::cmd("ZADD").arg(format!("hourglass:{{{task_type}}}:due")).arg(due_ms).arg(id).query(conn).unwrap();
}

/// A task's payload: `HSET hourglass:{type}:payload <id> <body>`.
pub fn payload(conn: &mut redis::Connection, task_type: &str, id: &str, body: &str) {
    let _: () =
        redis::cmd("HSET").arg(format!("hourglass:{{{task_type}}}:payload")).arg(id).arg(body).query(conn).unwrap();
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

/// The tasks of `task_type` leased now: id → the host id that holds them, as
/// the store's own `holders` script reads them (from the claim records and
/// the per-task leases older hosts left in `tokens`).
pub fn leases(conn: &mut impl redis::ConnectionLike, task_type: &str) -> std::collections::HashMap<String, String> {
    leases_in(conn, &format!("hourglass:{{{task_type}}}:claimed"), &format!("hourglass:{{{task_type}}}:tokens"))
}

/// Most ids per host the lease readers ask `holders` for: all of them.
pub const ALL_IDS: u64 = 1 << 40;

/// [`leases`], from the claim records in `claimed` and the per-task leases in
/// `tokens`. A key planted with another type (the bad-data tests) holds no
/// leases: it is read as an absent key (the script refuses the whole call
/// when either key is not a hash).
pub fn leases_in(
    conn: &mut impl redis::ConnectionLike,
    claimed: &str,
    tokens: &str,
) -> std::collections::HashMap<String, String> {
    let mut hash_or_absent = |key: &str| -> String {
        let kind: String = redis::cmd("TYPE").arg(key).query(conn).unwrap();
        if matches!(kind.as_str(), "hash" | "none") { key.to_owned() } else { format!("{key}:not-a-hash") }
    };
    let (tokens, claimed) = (hash_or_absent(tokens), hash_or_absent(claimed));
    let reply: redis::Value = redis::Script::new(&hourglass_store::holders_source())
        .key(tokens)
        .key(claimed)
        .arg(ALL_IDS)
        .invoke(conn)
        .unwrap();
    lease_map(reply)
}

/// The `holders` script's reply (the store's decoder) as id → host.
pub fn lease_map(value: redis::Value) -> std::collections::HashMap<String, String> {
    let mut out = std::collections::HashMap::new();
    for h in hourglass_store::HolderCount::decode(value).unwrap() {
        for id in h.ids {
            out.insert(String::from_utf8(id).unwrap(), h.host.clone());
        }
    }
    out
}

/// A plain success of `task`, with `followups`, to settle.
pub fn ack(
    task: &hourglass_store::task::ClaimedTask,
    followups: Vec<hourglass_store::task::FollowUp>,
) -> hourglass_store::task::Settlement {
    hourglass_store::task::Settlement {
        lease: task.lease(),
        outcome: hourglass_store::task::Outcome::Ack { followups, groups: Vec::new(), graphs: Vec::new() },
        run: Default::default(),
    }
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

/// One multi-threaded tokio runtime per test binary, for blocking on futures from test threads.
pub fn tokio_runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("tokio runtime")
    })
}

/// A task type by name (tests use valid names).
pub fn ty(name: &str) -> hourglass_store::task_type::TaskType {
    name.parse().unwrap()
}

/// The Redis key `hourglass:{t}:suffix`.
pub fn key(t: &str, suffix: &str) -> String {
    format!("hourglass:{{{t}}}:{suffix}")
}

/// A `Store` on `server` under the default prefix.
pub async fn store(server: &RedisServer) -> hourglass_store::Store {
    let prefix: hourglass_store::KeyPrefix = "hourglass".parse().unwrap();
    hourglass_store::Store::connect(&server.url(), &prefix).await.unwrap()
}

/// Redis `TIME` in ms: the clock every script uses.
pub fn redis_now(conn: &mut redis::Connection) -> i64 {
    let (s, us): (i64, i64) = redis::cmd("TIME").query(conn).unwrap();
    s * 1000 + us / 1000
}
