//! Outbound HTTP from plugins: the allow-list, limits, secrets and the webhook
//! and order.timeout examples, against a tiny HTTP server on loopback that
//! each test starts for itself.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::support::{Host, RedisServer, RunNow, capture_logs, now_ms, stat, wait_for};
use bytesize::ByteSize;
use hourglass::config::{Config, TypePolicy};
use hourglass::runtime::{Component, Failure, Handler, Runtime, RuntimeOptions, TaskRun};
use hourglass::task::ClaimedTask;
use redis::Commands;

const SECRET: &str = "s3cr3t-t0ken-never-logged";

// --- a scripted HTTP/1.1 server on 127.0.0.1 -------------------------------

/// What the server answers to the next request.
#[derive(Clone)]
enum Reply {
    /// Status, extra headers, body (sent with content-length).
    Status(u16, Vec<(&'static str, String)>, Vec<u8>),
    /// Waits this long before answering 200.
    Slow(Duration),
    /// 200 with a chunked body of this many bytes (no content-length).
    Chunked(usize),
}

/// One request as the server saw it.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    path: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

struct Server {
    addr: SocketAddr,
    connections: Arc<AtomicUsize>,
    seen: Arc<Mutex<Vec<Seen>>>,
    script: Arc<Mutex<VecDeque<Reply>>>,
}

impl Server {
    /// Starts a server answering `script` in order (then 200 with an empty body).
    fn start(script: Vec<Reply>) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let server = Server {
            addr: listener.local_addr().unwrap(),
            connections: Arc::default(),
            seen: Arc::default(),
            script: Arc::new(Mutex::new(script.into())),
        };
        let (connections, seen, script) = (server.connections.clone(), server.seen.clone(), server.script.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                connections.fetch_add(1, Ordering::SeqCst);
                let (seen, script) = (seen.clone(), script.clone());
                std::thread::spawn(move || serve(stream, &seen, &script));
            }
        });
        server
    }

    /// `http://127.0.0.1:<port>`
    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

fn serve(stream: TcpStream, seen: &Mutex<Vec<Seen>>, script: &Mutex<VecDeque<Reply>>) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() || line.is_empty() {
        return;
    }
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_owned();
    let path = parts.next().unwrap_or_default().to_owned();
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).is_err() || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.trim_end().split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_owned()));
        }
    }
    let len: usize = headers.iter().find(|(k, _)| k == "content-length").and_then(|(_, v)| v.parse().ok()).unwrap_or(0);
    let mut body = vec![0; len];
    let _ = reader.read_exact(&mut body);
    seen.lock().unwrap().push(Seen { method, path, headers, body });
    let reply = script.lock().unwrap().pop_front().unwrap_or(Reply::Status(200, vec![], vec![]));
    let mut out = stream;
    let _ = match reply {
        Reply::Status(code, extra, body) => {
            let mut head = format!("HTTP/1.1 {code} X\r\ncontent-length: {}\r\nconnection: close\r\n", body.len());
            for (k, v) in extra {
                head.push_str(&format!("{k}: {v}\r\n"));
            }
            head.push_str("\r\n");
            out.write_all(head.as_bytes()).and_then(|()| out.write_all(&body))
        }
        Reply::Slow(wait) => {
            std::thread::sleep(wait);
            out.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
        }
        Reply::Chunked(total) => {
            let mut r = out.write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n");
            let chunk = vec![b'x'; 4096];
            let mut sent = 0;
            while r.is_ok() && sent < total {
                r = out.write_all(format!("{:x}\r\n", chunk.len()).as_bytes()).and_then(|()| {
                    out.write_all(&chunk)?;
                    out.write_all(b"\r\n")
                });
                sent += chunk.len();
            }
            r.and_then(|()| out.write_all(b"0\r\n\r\n"))
        }
    };
    let _ = out.flush();
}

// --- the runtime, handlers and log capture ---------------------------------

fn runtime() -> &'static Runtime {
    static RT: OnceLock<Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        Runtime::new(RuntimeOptions {
            cache_dir: Some(crate::support::workspace_root().join("target/hourglass-test-cache")),
            max_instances: 32,
            max_memory: ByteSize::mib(64).as_u64(),
            ..RuntimeOptions::new(crate::support::compiler())
        })
        .expect("runtime")
    })
}

fn component(name: &str) -> Component {
    runtime().load(&crate::support::plugin(name)).unwrap_or_else(|e| panic!("load {name}: {e:#}"))
}

/// A handler built the way the host builds it: from a `runner.toml` text,
/// secrets resolved by `hourglass::secrets`. `extra` is appended to the type's table.
fn handler_from_toml(plugin: &str, task_type: &str, table: &str) -> Handler {
    let text = format!("[types.\"{task_type}\"]\n{table}\n");
    let config = Config::parse(&text, "runner.toml").unwrap_or_else(|e| panic!("{e:#}"));
    let t = task_type.parse().unwrap();
    let values = hourglass::secrets::resolve_all(config.config_values()).unwrap();
    Handler::new(component(plugin), plugin, &config.policy(&t).sandbox(), values[&t].clone())
}

/// A webhook handler posting to `server` (allowed), with the token from a secret file.
fn webhook(server: &Server, extra: &str) -> (Handler, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, format!("{SECRET}\n")).unwrap();
    let table = format!(
        "allowed_outbound_hosts = [\"{}\"]\nconfig = {{ url = \"{}/hook\", token = {{ file = \"{}\" }} }}\n{extra}",
        server.url(),
        server.url(),
        token.display()
    );
    (handler_from_toml("webhook", "webhook", &table), dir)
}

fn task(task_type: &str, id: &str, payload: &str, attempt: u32) -> ClaimedTask {
    ClaimedTask {
        task_type: task_type.parse().unwrap(),
        id: id.as_bytes().to_vec(),
        payload: payload.as_bytes().to_vec(),
        attempt,
        due_ms: 1_700_000_000_000,
        token: 1,
        claim: 1,
    }
}

fn error_of(run: &TaskRun) -> String {
    match &run.result {
        Err(Failure::Error(m)) => m.clone(),
        other => panic!("expected Failure::Error, got {other:?}"),
    }
}

// --- the tests ---------------------------------------------------------------

#[test]
fn webhook_delivers_the_payload_with_the_bearer_token_and_never_logs_it() {
    let server = Server::start(vec![Reply::Status(204, vec![], vec![])]);
    let (h, _dir) = webhook(&server, "");
    assert!(!format!("{h:?}").contains(SECRET), "Debug of a handler shows a secret: {h:?}");
    let payload = r#"{"event":"order.paid","order_id":42}"#;
    let (run, logs) = capture_logs(|| h.run_now(&task("webhook", "w-1", payload, 1)));
    assert_eq!(run.result, Ok(()), "{logs}");
    let seen = server.seen();
    assert_eq!(seen.len(), 1);
    let req = &seen[0];
    assert_eq!(req.method, "POST");
    assert_eq!(req.path, "/hook");
    assert_eq!(req.header("authorization"), Some(format!("Bearer {SECRET}").as_str()));
    assert_eq!(req.header("content-type"), Some("application/json"));
    assert_eq!(req.header("idempotency-key"), Some("webhook:w-1"));
    assert_eq!(req.body, payload.as_bytes());
    assert!(logs.contains("delivered"), "{logs}");
    assert!(!logs.contains(SECRET), "the secret was logged:\n{logs}");
}

#[test]
fn a_503_with_retry_after_then_200_retries_and_succeeds() {
    let server = Server::start(vec![
        Reply::Status(503, vec![("retry-after", "7".into())], b"busy".to_vec()),
        Reply::Status(429, vec![], vec![]),
        Reply::Status(200, vec![], b"ok".to_vec()),
    ]);
    let (h, _dir) = webhook(&server, "");
    let first = h.run_now(&task("webhook", "w-2", "{}", 1));
    assert_eq!(first.result, Err(Failure::RetryAfter(Duration::from_secs(7))));
    let second = h.run_now(&task("webhook", "w-2", "{}", 2));
    let msg = error_of(&second);
    assert!(msg.contains("429"), "{msg}");
    let third = h.run_now(&task("webhook", "w-2", "{}", 3));
    assert_eq!(third.result, Ok(()));
    assert_eq!(server.seen().len(), 3);
}

#[test]
fn a_400_is_a_permanent_failure() {
    let server = Server::start(vec![Reply::Status(400, vec![], b"unknown event".to_vec())]);
    let (h, _dir) = webhook(&server, "");
    match h.run_now(&task("webhook", "w-3", "{}", 1)).result {
        Err(Failure::Permanent(m)) => assert!(m.contains("400") && m.contains("unknown event"), "{m}"),
        other => panic!("expected a permanent failure, got {other:?}"),
    }
}

#[test]
fn a_host_not_on_the_list_is_refused_without_a_connection() {
    let allowed = Server::start(vec![]);
    let other = Server::start(vec![]);
    // Allowed: `allowed` only; the URL points at `other`.
    let table = format!(
        "allowed_outbound_hosts = [\"{}\"]\nconfig = {{ url = \"{}/hook?sig=abc\" }}",
        allowed.url(),
        other.url()
    );
    let h = handler_from_toml("webhook", "webhook", &table);
    let (run, logs) = capture_logs(|| h.run_now(&task("webhook", "w-4", "{}", 1)));
    let msg = error_of(&run);
    assert!(msg.contains("not allowed") && msg.contains(&other.url()), "{msg}");
    assert!(!msg.contains("sig=abc"), "the query is kept out of error texts: {msg}");
    assert!(logs.contains("outbound HTTP request refused"), "{logs}");
    for field in ["plugin=webhook", "task_id=w-4", &format!("target_url={}", other.url())] {
        assert!(logs.contains(field), "no {field} in:\n{logs}");
    }

    // No allow-list at all: no outbound HTTP.
    let h = handler_from_toml("webhook", "webhook", &format!("config = {{ url = \"{}/hook\" }}", other.url()));
    assert!(error_of(&h.run_now(&task("webhook", "w-5", "{}", 1))).contains("not allowed"));

    // Wildcards never reach loopback: `*` hosts and ports are not enough.
    let h = handler_from_toml(
        "webhook",
        "webhook",
        &format!(
            "allowed_outbound_hosts = [\"http://*:*\", \"*://*.localhost:*\"]\nconfig = {{ url = \"{}/hook\" }}",
            other.url()
        ),
    );
    assert!(error_of(&h.run_now(&task("webhook", "w-6", "{}", 1))).contains("not allowed"));
    let port = other.addr.port();
    let h = handler_from_toml(
        "webhook",
        "webhook",
        &format!("allowed_outbound_hosts = [\"http://*:*\"]\nconfig = {{ url = \"http://localhost:{port}/hook\" }}"),
    );
    assert!(error_of(&h.run_now(&task("webhook", "w-7", "{}", 1))).contains("not allowed"));

    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(other.connections(), 0, "a refused request reached the server");
    assert_eq!(allowed.connections(), 0);
}

#[test]
fn a_slow_server_hits_the_http_timeout() {
    let server = Server::start(vec![Reply::Slow(Duration::from_secs(5))]);
    let (h, _dir) = webhook(&server, "http_timeout = \"300ms\"");
    let started = Instant::now();
    let msg = error_of(&h.run_now(&task("webhook", "w-8", "{}", 1)));
    assert!(msg.contains("timed out"), "{msg}");
    assert!(started.elapsed() < Duration::from_secs(4), "took {:?}", started.elapsed());
    assert_eq!(server.connections(), 1);
}

#[test]
fn the_task_deadline_bounds_a_request_too() {
    let server = Server::start(vec![Reply::Slow(Duration::from_secs(5))]);
    let (h, _dir) = webhook(&server, "timeout = \"500ms\"\nhttp_timeout = \"30s\"");
    let started = Instant::now();
    let msg = error_of(&h.run_now(&task("webhook", "w-9", "{}", 1)));
    assert!(msg.contains("timed out") || msg.contains("deadline"), "{msg}");
    assert!(started.elapsed() < Duration::from_secs(4), "took {:?}", started.elapsed());
}

#[test]
fn an_oversized_response_is_cut_off_with_a_clear_error() {
    let server = Server::start(vec![
        Reply::Chunked(256 * 1024),
        Reply::Status(200, vec![], vec![b'y'; 8 * 1024]),
        Reply::Status(200, vec![], vec![b'z'; 1000]),
    ]);
    let (h, _dir) = webhook(&server, "http_max_response = \"4KiB\"");
    // Streamed without a length: cut off while reading.
    let msg = error_of(&h.run_now(&task("webhook", "w-10", "{}", 1)));
    assert!(msg.contains("cut off") && msg.contains("http_max_response"), "{msg}");
    // Announced by content-length: refused before reading.
    let msg = error_of(&h.run_now(&task("webhook", "w-11", "{}", 1)));
    assert!(msg.contains("http_max_response"), "{msg}");
    // Under the limit: fine.
    assert_eq!(h.run_now(&task("webhook", "w-12", "{}", 1)).result, Ok(()));
}

#[test]
fn order_timeout_calls_the_order_service_or_only_logs() {
    let server =
        Server::start(vec![Reply::Status(200, vec![], vec![]), Reply::Status(404, vec![], b"no such order".to_vec())]);
    let table = format!(
        "allowed_outbound_hosts = [\"{}\"]\nconfig = {{ order_service = \"{}/api/\" }}",
        server.url(),
        server.url()
    );
    let h = handler_from_toml("order.timeout", "order.timeout", &table);
    let (run, logs) =
        capture_logs(|| h.run_now(&task("order.timeout", "o-1", r#"{"order_id":"A 17","amount":12.5}"#, 1)));
    assert_eq!(run.result, Ok(()), "{logs}");
    let seen = server.seen();
    assert_eq!(seen[0].method, "POST");
    assert_eq!(seen[0].path, "/api/orders/A%2017/cancel");
    let body: serde_json::Value = serde_json::from_slice(&seen[0].body).unwrap();
    assert_eq!(body["order_id"], "A 17");
    assert!(logs.contains("cancelled at the order service"), "{logs}");
    match h.run_now(&task("order.timeout", "o-2", r#"{"order_id":7,"amount":1}"#, 1)).result {
        Err(Failure::Permanent(m)) => assert!(m.contains("404"), "{m}"),
        other => panic!("{other:?}"),
    }
    match h.run_now(&task("order.timeout", "o-3", "not json", 1)).result {
        Err(Failure::Permanent(m)) => assert!(m.contains("invalid JSON"), "{m}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(server.seen().len(), 2);

    // Without order_service it only logs (the quick start).
    let h = Handler::new(component("order.timeout"), "order.timeout", &TypePolicy::default().sandbox(), Arc::default());
    let (run, logs) = capture_logs(|| h.run_now(&task("order.timeout", "o-4", r#"{"order_id":"B1","amount":3}"#, 1)));
    assert_eq!(run.result, Ok(()));
    assert!(logs.contains("B1") && logs.contains("log only"), "{logs}");
}

#[test]
fn plugins_without_http_still_load_and_run() {
    // noop was built without any HTTP use: it imports no wasi:http and fits the world.
    let report = runtime().check(&crate::support::plugin("noop")).unwrap();
    assert!(report.fits(), "{report}");
    assert!(!report.imports.iter().any(|i| i.starts_with("wasi:http")), "{report}");
    let report = runtime().check(&crate::support::plugin("webhook")).unwrap();
    assert!(report.fits(), "{report}");
    assert!(report.imports.iter().any(|i| i.starts_with("wasi:http/outgoing-handler")), "{report}");
}

#[test]
fn end_to_end_retry_dead_letter_and_secret_kept_out_of_the_log() {
    let server = Server::start(vec![
        Reply::Status(503, vec![("retry-after", "1".into())], vec![]),
        Reply::Status(200, vec![], vec![]),
        Reply::Status(400, vec![], b"bad payload".to_vec()),
    ]);
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, SECRET).unwrap();
    let config = format!(
        "[types.\"webhook\"]\nmax_attempts = 5\nallowed_outbound_hosts = [\"{}\"]\nconfig = {{ url = \"{}/hook\", token = {{ file = \"{}\" }} }}\n",
        server.url(),
        server.url(),
        token.display()
    );
    let host = Host::start(&redis, &[("webhook", crate::support::plugin("webhook"))], &config);
    let mut conn = redis.client();
    let _: () = conn.hset("hourglass:{webhook}:payload", "ok-after-retry", r#"{"n":1}"#).unwrap();
    let _: () = conn.zadd("hourglass:{webhook}:due", "ok-after-retry", now_ms()).unwrap();
    wait_for("the retried delivery", Duration::from_secs(60), || {
        (stat(&mut conn, "webhook", "succeeded") == 1).then_some(())
    });
    assert_eq!(stat(&mut conn, "webhook", "retried"), 1);
    let _: () = conn.zadd("hourglass:{webhook}:due", "rejected", now_ms()).unwrap();
    wait_for("the dead letter", Duration::from_secs(60), || (stat(&mut conn, "webhook", "dead") == 1).then_some(()));
    let error: String = conn.hget("hourglass:{webhook}:errors", "rejected").unwrap();
    assert!(error.contains("400"), "{error}");
    let seen = server.seen();
    assert_eq!(seen.len(), 3);
    assert!(seen.iter().all(|s| s.header("authorization") == Some(format!("Bearer {SECRET}").as_str())));
    let log = host.log();
    assert!(!log.contains(SECRET), "the secret was logged:\n{log}");
}

#[test]
fn a_missing_secret_stops_the_host_with_a_clear_error() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("plugins")).unwrap();
    std::fs::write(
        dir.path().join("runner.toml"),
        "[types.\"webhook\"]\nconfig = { token = { env = \"HOURGLASS_TEST_SURELY_UNSET_TOKEN\" } }\n",
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hourglass"))
        .arg("--config")
        .arg(dir.path().join("runner.toml"))
        .args(["--redis", &redis.url()])
        .arg("run")
        .env_remove("HOURGLASS_TEST_SURELY_UNSET_TOKEN")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains(
            "types.\"webhook\".config.token: environment variable HOURGLASS_TEST_SURELY_UNSET_TOKEN is not set"
        ),
        "{stderr}"
    );
}
