//! The admin server of a real `hourglass run`: health, readiness, metrics
//! after a known run, completion events, JSON logs, the dashboard's actions,
//! and the dashboard driven by a real headless Chromium.

mod support;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use redis::Commands;
use serde_json::{Value, json};
use support::{Host, RedisServer, now_ms, plugin, schedule_now as schedule, stat, test_plugin, wait_for, zcard};

const LONG: Duration = Duration::from_secs(60);
const ADMIN: &str = "[admin]\nenabled = true\nlisten = \"127.0.0.1:0\"\n";

/// The admin address the host logged at start (it listens on port 0).
fn admin_addr(host: &Host) -> String {
    let log = host.log();
    let at = log.find("admin server listening: http://").unwrap_or_else(|| panic!("no admin address in:\n{log}"));
    let rest = &log[at + "admin server listening: http://".len()..];
    rest[..rest.find('/').unwrap()].to_owned()
}

/// A response of the tiny HTTP client below.
#[derive(Debug)]
struct Response {
    status: u16,
    headers: HashMap<String, String>,
    body: String,
}

/// One HTTP/1.1 request with `Connection: close`; enough for these tests, no dependency.
fn http(addr: &str, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Response {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(LONG)).unwrap();
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
    let body = if headers.get("transfer-encoding").is_some_and(|v| v == "chunked") {
        dechunk(body)
    } else {
        body.to_owned()
    };
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

fn get(addr: &str, path: &str) -> Response {
    http(addr, "GET", path, &[], "")
}

fn post(addr: &str, path: &str, form: &str) -> Response {
    http(addr, "POST", path, &[], form)
}

/// The value of one Prometheus sample: `name` with every `labels` pair (`type="noop"`), if exposed.
fn sample(metrics: &str, name: &str, labels: &[&str]) -> Option<f64> {
    metrics.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (series, value) = l.rsplit_once(' ')?;
        let (metric, rest) = series.split_once('{').unwrap_or((series, ""));
        (metric == name && labels.iter().all(|p| rest.contains(p))).then(|| value.parse().ok())?
    })
}

#[test]
fn endpoints_answer_with_the_right_content_and_status() {
    let redis = RedisServer::start();
    let host = Host::start(
        &redis,
        &[("noop", plugin("noop")), ("mail", test_plugin("chaos"))],
        &format!("{ADMIN}[types.mail]\nmax_attempts = 1\n"),
    );
    let addr = admin_addr(&host);
    let mut conn = redis.client();

    let r = get(&addr, "/healthz");
    assert_eq!((r.status, r.body.as_str()), (200, "ok\n"));
    let r = get(&addr, "/readyz");
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.body.contains("redis: ok") && r.body.contains("mail, noop"), "{}", r.body);
    let r = get(&addr, "/metrics");
    assert_eq!(r.status, 200);
    assert!(r.headers["content-type"].starts_with("text/plain"), "{:?}", r.headers);
    assert!(r.body.contains("# TYPE hourglass_plugin_info gauge"), "{}", r.body);
    assert_eq!(get(&addr, "/nowhere").status, 404);

    schedule(&mut conn, "mail", "m-1", "error:smtp down");
    wait_for("m-1 to die", LONG, || (zcard(&mut conn, "hourglass:{mail}:dead") == 1).then_some(()));

    let page = get(&addr, "/?type=mail");
    assert_eq!(page.status, 200);
    assert!(page.headers["content-type"].starts_with("text/html"));
    for needle in [
        "Task types",
        "data-type=\"noop\"",
        "Due over the next hour: mail",
        "<svg id=chart",
        "<tr data-id=\"m-1\">",
        "smtp down",
        "data-action=requeue",
        "data-action=purge",
        "data-plugin=\"mail.wasm\"",
        "id=hosts",
        "(this one, admin at",
        "data-outcome-id=\"m-1\" data-outcome=dead",
    ] {
        assert!(page.body.contains(needle), "dashboard lacks {needle:?}:\n{}", page.body);
    }
    assert!(!page.body.contains("http://") && !page.body.contains("https://"), "the page loads outside resources");

    // Nothing changes on a GET: the action URLs refuse the method, the page is read-only.
    let m1 = hex("m-1");
    assert_eq!(get(&addr, &format!("/dead/requeue?type=mail&id_hex={m1}")).status, 405);
    assert_eq!(get(&addr, &format!("/dead/purge?type=mail&id_hex={m1}&confirm=yes")).status, 405);
    get(&addr, "/?type=mail");
    assert_eq!(zcard(&mut conn, "hourglass:{mail}:dead"), 1);

    // A purge without its confirmation is refused and deletes nothing.
    let r = post(&addr, "/dead/purge", &format!("type=mail&id_hex={m1}"));
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("confirm"), "{}", r.body);
    assert_eq!(zcard(&mut conn, "hourglass:{mail}:dead"), 1);
    // Bad input is refused.
    assert_eq!(post(&addr, "/dead/requeue", "type=Bad+Type").status, 400);
    assert_eq!(post(&addr, "/dead/requeue", "type=mail&id_hex=zz").status, 400);
    // Another site's page may not post here.
    let r = http(&addr, "POST", "/dead/requeue", &[("Origin", "http://evil.example")], &format!("type=mail&id_hex={m1}"));
    assert_eq!(r.status, 403);
    assert_eq!(zcard(&mut conn, "hourglass:{mail}:dead"), 1);

    // Re-queue: the task runs again (and dies again: its payload still fails).
    let r = post(&addr, "/dead/requeue", &format!("type=mail&id_hex={m1}"));
    assert_eq!(r.status, 303, "{}", r.body);
    assert!(r.headers["location"].starts_with("/?type=mail&msg=re-queued+1+"), "{:?}", r.headers);
    wait_for("m-1 to die again", LONG, || (stat(&mut conn, "mail", "dead") == 2).then_some(()));
    wait_for("m-1 back in dead", LONG, || (zcard(&mut conn, "hourglass:{mail}:dead") == 1).then_some(()));

    // Purge with confirmation removes it for good, payload included.
    let r = post(&addr, "/dead/purge", &format!("type=mail&id_hex={m1}&confirm=yes"));
    assert_eq!(r.status, 303, "{}", r.body);
    assert_eq!(zcard(&mut conn, "hourglass:{mail}:dead"), 0);
    let payload: Option<String> = conn.hget("hourglass:{mail}:payload", "m-1").unwrap();
    assert_eq!(payload, None);
    assert!(get(&addr, "/?type=mail").body.contains("No dead tasks of mail"));
}

fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn readyz_is_503_without_plugins_or_redis() {
    let mut redis = RedisServer::start();
    let host = Host::start(&redis, &[], ADMIN);
    let addr = admin_addr(&host);
    let r = get(&addr, "/readyz");
    assert_eq!(r.status, 503);
    assert!(r.body.contains("plugins: none loaded"), "{}", r.body);
    redis.stop();
    let r = get(&addr, "/readyz");
    assert_eq!(r.status, 503);
    assert!(r.body.contains("redis"), "{}", r.body);
    assert_eq!(get(&addr, "/healthz").status, 200, "alive even when not ready");
}

#[test]
fn mutations_need_the_token_when_one_is_configured() {
    let redis = RedisServer::start();
    let host = Host::start(
        &redis,
        &[("mail", test_plugin("chaos"))],
        &format!("{ADMIN}token = \"sesame-open-1234\"\n[types.mail]\nmax_attempts = 1\n"),
    );
    let addr = admin_addr(&host);
    let mut conn = redis.client();
    schedule(&mut conn, "mail", "m-1", "error:nope");
    wait_for("m-1 to die", LONG, || (zcard(&mut conn, "hourglass:{mail}:dead") == 1).then_some(()));
    let m1 = hex("m-1");

    assert_eq!(get(&addr, "/?type=mail").status, 200, "reading needs no token");
    assert_eq!(post(&addr, "/dead/requeue", &format!("type=mail&id_hex={m1}")).status, 401);
    assert_eq!(post(&addr, "/dead/requeue", &format!("type=mail&id_hex={m1}&token=wrong-token-123")).status, 401);
    assert_eq!(post(&addr, "/dead/purge", &format!("type=mail&id_hex={m1}&confirm=yes")).status, 401);
    assert_eq!(zcard(&mut conn, "hourglass:{mail}:dead"), 1, "a refused request changed something");

    let bearer = http(
        &addr,
        "POST",
        "/dead/purge",
        &[("Authorization", "Bearer sesame-open-1234")],
        &format!("type=mail&id_hex={m1}&confirm=yes"),
    );
    assert_eq!(bearer.status, 303, "{}", bearer.body);
    assert_eq!(zcard(&mut conn, "hourglass:{mail}:dead"), 0);

    schedule(&mut conn, "mail", "m-2", "error:nope");
    wait_for("m-2 to die", LONG, || (zcard(&mut conn, "hourglass:{mail}:dead") == 1).then_some(()));
    let r = post(&addr, "/dead/requeue", &format!("type=mail&id_hex={}&token=sesame-open-1234", hex("m-2")));
    assert_eq!(r.status, 303, "{}", r.body);
}

#[test]
fn a_non_loopback_admin_address_without_token_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("plugins")).unwrap();
    let config = dir.path().join("runner.toml");
    std::fs::write(&config, "[redis]\nurl = \"redis://127.0.0.1:1\"\n[admin]\nenabled = true\nlisten = \"0.0.0.0:0\"\n")
        .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_hourglass"))
        .arg("--config")
        .arg(&config)
        .arg("run")
        .env_remove("HOURGLASS_REDIS_URL")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("admin.token") && err.contains("0.0.0.0"), "{err}");
}

#[test]
fn metrics_and_events_match_a_known_run() {
    let redis = RedisServer::start();
    let host = Host::start(
        &redis,
        &[("noop", plugin("noop")), ("bad", test_plugin("chaos"))],
        &format!(
            "{ADMIN}[defaults]\nevents = true\nbackoff_base = \"20ms\"\nbackoff_cap = \"50ms\"\n\
             [types.bad]\nmax_attempts = 2\nevents_maxlen = 1000\n"
        ),
    );
    let addr = admin_addr(&host);
    let mut conn = redis.client();
    let before = now_ms();
    for i in 0..5 {
        schedule(&mut conn, "noop", &format!("ok-{i}"), "");
    }
    for i in 0..2 {
        schedule(&mut conn, "bad", &format!("bad-{i}"), "error:boom");
    }
    wait_for("the run", LONG, || {
        (stat(&mut conn, "noop", "succeeded") == 5 && zcard(&mut conn, "hourglass:{bad}:dead") == 2).then_some(())
    });

    let expected: &[(&str, &[&str], f64)] = &[
        ("hourglass_tasks_claimed_total", &["type=\"noop\""], 5.0),
        ("hourglass_tasks_succeeded_total", &["type=\"noop\""], 5.0),
        ("hourglass_tasks_claimed_total", &["type=\"bad\""], 4.0),
        ("hourglass_tasks_failed_total", &["type=\"bad\""], 4.0),
        ("hourglass_tasks_retried_total", &["type=\"bad\""], 2.0),
        ("hourglass_tasks_dead_total", &["type=\"bad\""], 2.0),
        ("hourglass_tasks_in_flight", &["type=\"noop\""], 0.0),
        ("hourglass_tasks_in_flight", &["type=\"bad\""], 0.0),
        ("hourglass_task_lateness_seconds_count", &["type=\"noop\""], 5.0),
        ("hourglass_task_duration_seconds_count", &["type=\"noop\""], 5.0),
        ("hourglass_task_duration_seconds_count", &["type=\"bad\""], 4.0),
        ("hourglass_plugin_loads_total", &["plugin=\"noop\""], 1.0),
        ("hourglass_plugin_loads_total", &["plugin=\"bad\""], 1.0),
    ];
    // The counters follow the settle by a moment; wait for them, then check each.
    let deadline = Instant::now() + LONG;
    let mut metrics = get(&addr, "/metrics").body;
    while Instant::now() < deadline && !expected.iter().all(|(n, l, v)| sample(&metrics, n, l) == Some(*v)) {
        std::thread::sleep(Duration::from_millis(50));
        metrics = get(&addr, "/metrics").body;
    }
    for (n, l, v) in expected {
        assert_eq!(sample(&metrics, n, l), Some(*v), "{n}{l:?}\n{metrics}");
    }
    // Every counter of a served type exists from the start (at 0), so rate() works from the first scrape.
    assert_eq!(sample(&metrics, "hourglass_tasks_succeeded_total", &["type=\"bad\""]), Some(0.0));
    assert_eq!(sample(&metrics, "hourglass_tasks_fenced_total", &["type=\"noop\""]), Some(0.0));
    assert_eq!(sample(&metrics, "hourglass_redis_errors_total", &[]).unwrap_or(0.0), 0.0);
    let noop_hash = hash_of(&support::plugin("noop"));
    assert_eq!(sample(&metrics, "hourglass_plugin_info", &["plugin=\"noop\"", &format!("hash=\"{noop_hash}\"")]), Some(1.0));
    assert!(sample(&metrics, "hourglass_task_lateness_seconds_bucket", &["type=\"noop\"", "le=\"+Inf\""]) == Some(5.0));

    // Events: one entry per outcome, in the order they were committed.
    let after = now_ms();
    let noop_events = events(&mut conn, "noop");
    assert_eq!(noop_events.len(), 5, "{noop_events:?}");
    for e in &noop_events {
        assert_eq!(e["outcome"], "succeeded");
        assert_eq!(e["attempt"], "1");
        assert!(e["id"].starts_with("ok-"));
        assert!(!e.contains_key("error"));
        let (due, started, finished) = (ms(e, "due_ms"), ms(e, "started_ms"), ms(e, "finished_ms"));
        assert!(before <= due && due <= started && started <= finished && finished <= after, "{e:?}");
    }
    let bad_events = events(&mut conn, "bad");
    let outcomes: Vec<(&str, &str, &str)> =
        bad_events.iter().map(|e| (e["id"].as_str(), e["outcome"].as_str(), e["attempt"].as_str())).collect();
    for id in ["bad-0", "bad-1"] {
        let mine: Vec<_> = outcomes.iter().filter(|(i, _, _)| *i == id).map(|(_, o, a)| (*o, *a)).collect();
        assert_eq!(mine, [("retried", "1"), ("dead", "2")], "{bad_events:?}");
    }
    for e in &bad_events {
        assert_eq!(e["error"], "boom");
        if e["outcome"] == "retried" {
            assert!(ms(e, "retry_at_ms") >= ms(e, "finished_ms"), "{e:?}");
        }
    }
    // A type without events writes no stream.
    let exists: bool = conn.exists("hourglass:{other}:events").unwrap();
    assert!(!exists);
}

fn ms(e: &HashMap<String, String>, field: &str) -> i64 {
    e.get(field).unwrap_or_else(|| panic!("no {field} in {e:?}")).parse().unwrap()
}

/// Every entry of `hourglass:{T}:events`, oldest first.
fn events(conn: &mut redis::Connection, task_type: &str) -> Vec<HashMap<String, String>> {
    let reply: redis::streams::StreamRangeReply = conn.xrange_all(format!("hourglass:{{{task_type}}}:events")).unwrap();
    reply
        .ids
        .into_iter()
        .map(|entry| {
            entry.map.into_iter().map(|(k, v)| (k, redis::from_redis_value::<String>(v).unwrap())).collect()
        })
        .collect()
}

/// The short version hash the host gives a plugin file (first 12 hex digits of SHA-256).
fn hash_of(file: &Path) -> String {
    hourglass::registry::short_hash(&std::fs::read(file).unwrap())
}

#[test]
fn events_are_capped_by_events_maxlen() {
    let redis = RedisServer::start();
    let _host = Host::start(&redis, &[("noop", plugin("noop"))], "[types.noop]\nevents = true\nevents_maxlen = 10\n");
    let mut conn = redis.client();
    let now = now_ms();
    let mut pipe = redis::pipe();
    for i in 0..500 {
        pipe.zadd("hourglass:{noop}:due", format!("t{i}"), now).ignore();
    }
    let _: () = pipe.query(&mut conn).unwrap();
    wait_for("all done", LONG, || (stat(&mut conn, "noop", "succeeded") == 500).then_some(()));
    let len: usize = conn.xlen("hourglass:{noop}:events").unwrap();
    // MAXLEN ~ trims whole radix-tree nodes (100 entries by default), never below the cap.
    assert!((10..=200).contains(&len), "{len} entries kept");
}

#[test]
fn json_logs_carry_task_and_plugin_fields() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("plugins")).unwrap();
    std::fs::copy(test_plugin("chaos"), dir.path().join("plugins/talk.wasm")).unwrap();
    let config = dir.path().join("runner.toml");
    let cache = support::workspace_root().join("target/test-plugin-cache");
    std::fs::write(&config, format!("[redis]\nurl = \"{}\"\n[runner]\ncache_dir = \"{}\"\n", redis.url(), cache.display()))
        .unwrap();
    let log = dir.path().join("host.log");
    let mut child = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_hourglass"))
            .args(["--log-format", "json", "--config"])
            .arg(&config)
            .arg("run")
            .env("HOURGLASS_LOG", "info,hourglass=debug")
            .env_remove("HOURGLASS_REDIS_URL")
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    let read = || std::fs::read_to_string(&log).unwrap_or_default();
    wait_for("host start", LONG, || read().contains("hourglass is running").then_some(()));
    let mut conn = redis.client();
    schedule(&mut conn, "talk", "t-1", "stdout");
    wait_for("t-1 done", LONG, || (stat(&mut conn, "talk", "succeeded") == 1).then_some(()));
    wait_for("its log line", LONG, || read().contains("\"message\":\"succeeded\"").then_some(()));
    let _ = child.0.kill();
    let lines: Vec<Value> = read()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}")))
        .collect();
    let done = lines.iter().find(|l| l["message"] == "succeeded").unwrap();
    assert_eq!((done["task_type"].as_str(), done["task_id"].as_str(), done["attempt"].as_u64()), (Some("talk"), Some("t-1"), Some(1)));
    assert_eq!(done["level"], "DEBUG");
    assert!(done["timestamp"].is_string());
    let said = lines.iter().find(|l| l["message"] == "hello from stdout").expect("the plugin's output line");
    assert_eq!(said["plugin"], "talk");
    assert_eq!(said["plugin_hash"], hash_of(&test_plugin("chaos")).as_str());
    assert_eq!((said["task_id"].as_str(), said["attempt"].as_u64()), (Some("t-1"), Some(1)));
}

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Headless Chromium driven over the DevTools protocol on a pipe
/// (`--remote-debugging-pipe`: JSON messages ending in NUL on fds 3 and 4).
struct Browser {
    child: KillOnDrop,
    to: std::fs::File,
    from: mpsc::Receiver<Value>,
    next: u64,
    session: String,
    _dir: tempfile::TempDir,
}

/// The Chromium binary: `HOURGLASS_CHROMIUM`, else `chromium` or `chromium-browser` on PATH.
fn chromium() -> PathBuf {
    if let Some(p) = std::env::var_os("HOURGLASS_CHROMIUM") {
        return PathBuf::from(p);
    }
    for name in ["chromium", "chromium-browser"] {
        if let Ok(out) = Command::new("sh").arg("-c").arg(format!("command -v {name}")).output()
            && out.status.success()
        {
            return PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        }
    }
    panic!("headless Chromium is needed for the dashboard test: apt-get install chromium (.ci/run installs it)");
}

impl Browser {
    fn launch() -> Browser {
        let exe = chromium();
        let dir = tempfile::tempdir().unwrap();
        let (to_browser, from_browser) = (dir.path().join("in"), dir.path().join("out"));
        for fifo in [&to_browser, &from_browser] {
            assert!(Command::new("mkfifo").arg(fifo).status().unwrap().success(), "mkfifo failed");
        }
        let child = Command::new("sh")
            .arg("-c")
            .arg(r#"exec "$0" "$@" 3<"$TO_BROWSER" 4>"$FROM_BROWSER""#)
            .arg(&exe)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-dev-shm-usage",
                "--window-size=1280,1600",
                "--remote-debugging-pipe",
            ])
            .arg(format!("--user-data-dir={}", dir.path().join("profile").display()))
            .env("TO_BROWSER", &to_browser)
            .env("FROM_BROWSER", &from_browser)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", exe.display()));
        let child = KillOnDrop(child);
        // The shell opens its ends in this order, so these opens cannot deadlock.
        let to = std::fs::OpenOptions::new().write(true).open(&to_browser).unwrap();
        let from = std::fs::File::open(&from_browser).unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(from);
            let mut buf = Vec::new();
            loop {
                buf.clear();
                match reader.read_until(0, &mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {
                        buf.pop_if(|b| *b == 0);
                        if let Ok(v) = serde_json::from_slice(&buf)
                            && tx.send(v).is_err()
                        {
                            return;
                        }
                    }
                }
            }
        });
        let mut b = Browser { child, to, from: rx, next: 0, session: String::new(), _dir: dir };
        let target = b.call("Target.createTarget", json!({"url": "about:blank"}));
        let target_id = target["targetId"].as_str().unwrap().to_owned();
        let attached = b.call("Target.attachToTarget", json!({"targetId": target_id, "flatten": true}));
        b.session = attached["sessionId"].as_str().unwrap().to_owned();
        b
    }

    /// Sends one command (to the page once attached) and waits for its result.
    fn call(&mut self, method: &str, params: Value) -> Value {
        self.next += 1;
        let id = self.next;
        let mut msg = json!({"id": id, "method": method, "params": params});
        if !self.session.is_empty() {
            msg["sessionId"] = json!(self.session);
        }
        let mut bytes = serde_json::to_vec(&msg).unwrap();
        bytes.push(0);
        self.to.write_all(&bytes).unwrap_or_else(|e| panic!("browser gone ({e}) at {method}"));
        let deadline = Instant::now() + LONG;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let reply = self.from.recv_timeout(left).unwrap_or_else(|_| panic!("no answer to {method}"));
            if reply["id"] == id {
                assert!(reply.get("error").is_none(), "{method} failed: {reply}");
                return reply["result"].clone();
            }
        }
    }

    fn goto(&mut self, url: &str) {
        self.call("Page.navigate", json!({"url": url}));
    }

    /// Evaluates a JavaScript expression in the page and returns its value.
    fn eval(&mut self, expression: &str) -> Value {
        let r = self.call(
            "Runtime.evaluate",
            json!({"expression": expression, "returnByValue": true, "awaitPromise": true}),
        );
        r["result"]["value"].clone()
    }

    fn wait_until(&mut self, what: &str, expression: &str) {
        let deadline = Instant::now() + LONG;
        while self.eval(expression) != json!(true) {
            if Instant::now() > deadline {
                let body = self.eval("document.body ? document.body.innerText : ''");
                panic!("the page never showed {what}; it shows:\n{}", body.as_str().unwrap_or(""));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Clicks the middle of the element `selector` with real mouse events.
    fn click(&mut self, selector: &str) {
        let at = self.eval(&format!(
            "(() => {{ const e = document.querySelector({sel}); if (!e) return null; \
             e.scrollIntoView({{block: 'center'}}); const r = e.getBoundingClientRect(); \
             return [r.x + r.width / 2, r.y + r.height / 2]; }})()",
            sel = json!(selector)
        ));
        let (x, y) = (at[0].as_f64().expect("element to click"), at[1].as_f64().unwrap());
        self.call("Input.dispatchMouseEvent", json!({"type": "mouseMoved", "x": x, "y": y}));
        for kind in ["mousePressed", "mouseReleased"] {
            self.call(
                "Input.dispatchMouseEvent",
                json!({"type": kind, "x": x, "y": y, "button": "left", "buttons": 1, "clickCount": 1}),
            );
        }
    }

    /// Saves a PNG of the page (for people looking at a failure).
    fn screenshot(&mut self, path: &Path) {
        let shot = self.call("Page.captureScreenshot", json!({"format": "png"}));
        let data = shot["data"].as_str().unwrap_or_default();
        let _ = std::fs::write(path, base64_decode(data));
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        self.session.clear();
        let mut bytes = serde_json::to_vec(&json!({"id": 0, "method": "Browser.close"})).unwrap();
        bytes.push(0);
        let _ = self.to.write_all(&bytes);
        let _ = self.child.0.kill();
    }
}

fn base64_decode(s: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        _ => 63,
    };
    let clean: Vec<u8> = s.bytes().filter(|&c| c != b'=' && !c.is_ascii_whitespace()).collect();
    let mut out = Vec::with_capacity(clean.len() * 3 / 4);
    for chunk in clean.chunks(4) {
        let n = chunk.iter().enumerate().fold(0u32, |acc, (i, &c)| acc | (u32::from(value(c)) << (18 - 6 * i)));
        for i in 0..chunk.len().saturating_sub(1) {
            out.push((n >> (16 - 8 * i)) as u8);
        }
    }
    out
}

#[test]
fn stats_watch_redraws_every_second_until_ctrl_c() {
    let redis = RedisServer::start();
    let mut conn = redis.client();
    schedule(&mut conn, "noop", "later-1", "");
    let out = tempfile::NamedTempFile::new().unwrap();
    let mut child = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_hourglass"))
            .args(["--redis", &redis.url(), "stats", "--watch"])
            .stdout(out.reopen().unwrap())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let frames = || std::fs::read_to_string(out.path()).unwrap_or_default().matches("\x1b[2J\x1b[H").count();
    wait_for("two frames", LONG, || (frames() >= 2).then_some(()));
    let text = std::fs::read_to_string(out.path()).unwrap();
    assert!(text.contains("DUE-NOW") && text.contains("noop"), "{text}");
    let status = Command::new("kill").args(["-INT", &child.0.id().to_string()]).status().unwrap();
    assert!(status.success());
    let code = wait_for("exit on Ctrl-C", LONG, || child.0.try_wait().unwrap()).code();
    assert_eq!(code, Some(0));
    assert!(Command::new(env!("CARGO_BIN_EXE_hourglass")).args(["stats", "--watch", "--json"]).output().unwrap().status.code() == Some(2));
}

#[test]
fn dashboard_in_a_real_browser_requeues_a_dead_task_that_then_succeeds() {
    let redis = RedisServer::start();
    let host = Host::start(&redis, &[("mail", test_plugin("chaos"))], &format!("{ADMIN}[types.mail]\nmax_attempts = 1\n"));
    let addr = admin_addr(&host);
    let mut conn = redis.client();
    schedule(&mut conn, "mail", "d-1", "error:smtp server down");
    wait_for("d-1 to die", LONG, || (zcard(&mut conn, "hourglass:{mail}:dead") == 1).then_some(()));

    let mut browser = Browser::launch();
    browser.goto(&format!("http://{addr}/?type=mail"));
    browser.wait_until(
        "the dead task with its error",
        r#"(() => { const row = document.querySelector('#dead tr[data-id="d-1"]');
                    return !!row && row.innerText.includes('smtp server down'); })()"#,
    );
    if let Some(path) = std::env::var_os("HOURGLASS_SCREENSHOT") {
        browser.screenshot(Path::new(&format!("{}-dead.png", path.to_string_lossy())));
    }
    // The operator fixes the cause, then re-queues the task from the page.
    let _: () = conn.hset("hourglass:{mail}:payload", "d-1", "ok").unwrap();
    browser.click(r#"#dead tr[data-id="d-1"] button[data-action=requeue]"#);
    browser.wait_until(
        "the re-queued task succeed",
        r#"(() => !!document.querySelector('#recent tr[data-outcome-id="d-1"][data-outcome=succeeded]')
                  && !document.querySelector('#dead tr[data-id="d-1"]')
                  && document.querySelector('#types tr[data-type=mail] td[data-col=succeeded]').innerText === '1')()"#,
    );
    assert!(browser.eval("location.search").as_str().unwrap().contains("msg=re-queued"));
    if let Some(path) = std::env::var_os("HOURGLASS_SCREENSHOT") {
        browser.screenshot(Path::new(&format!("{}-done.png", path.to_string_lossy())));
    }
    assert_eq!(stat(&mut conn, "mail", "succeeded"), 1);
    assert_eq!(zcard(&mut conn, "hourglass:{mail}:dead"), 0);
}
