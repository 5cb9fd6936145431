//! The admin server of a real `hourglass run`: health, readiness, metrics
//! after a known run, completion events, JSON logs, the dashboard's actions,
//! and the dashboard driven by a real headless Chromium.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::support::{
    Host, RedisServer, admin_addr, get, http, now_ms, plugin, post, sample, schedule_now as schedule, stat,
    test_plugin, wait_for, zcard,
};
use redis::Commands;
use serde_json::{Value, json};

const LONG: Duration = Duration::from_secs(60);
const ADMIN: &str = "[admin]\nenabled = true\nlisten = \"127.0.0.1:0\"\n";

/// The admin address the host logged at start (it listens on port 0).
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
    let r =
        http(&addr, "POST", "/dead/requeue", &[("Origin", "http://evil.example")], &format!("type=mail&id_hex={m1}"));
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
    assert_eq!(post(&addr, "/task/requeue", &format!("type=mail&id_hex={m1}")).status, 401);
    crate::support::zadd(&mut conn, "mail", "m-later", now_ms() + 3_600_000);
    for (action, extra) in [("run-now", ""), ("postpone", "&by=5m"), ("cancel", "&confirm=yes")] {
        let r = post(&addr, &format!("/task/{action}"), &format!("type=mail&id_hex={}{extra}", hex("m-later")));
        assert_eq!(r.status, 401, "{action}");
    }
    assert_eq!(zcard(&mut conn, "hourglass:{mail}:due"), 1, "a refused request changed something");
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
    std::fs::write(
        &config,
        "[redis]\nurl = \"redis://127.0.0.1:1\"\n[admin]\nenabled = true\nlisten = \"0.0.0.0:0\"\n",
    )
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
    let noop_hash = hash_of(&crate::support::plugin("noop"));
    assert_eq!(
        sample(&metrics, "hourglass_plugin_info", &["plugin=\"noop\"", &format!("hash=\"{noop_hash}\"")]),
        Some(1.0)
    );
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
        .map(|entry| entry.map.into_iter().map(|(k, v)| (k, redis::from_redis_value::<String>(v).unwrap())).collect())
        .collect()
}

/// The short version hash the host gives a plugin file (first 12 hex digits of SHA-256).
fn hash_of(file: &Path) -> String {
    hourglass::runtime::short_hash(&std::fs::read(file).unwrap())
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
    let cache = crate::support::workspace_root().join("target/test-plugin-cache");
    std::fs::write(
        &config,
        format!("[redis]\nurl = \"{}\"\n[runner]\ncache_dir = \"{}\"\n", redis.url(), cache.display()),
    )
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
    assert_eq!(
        (done["task_type"].as_str(), done["task_id"].as_str(), done["attempt"].as_u64()),
        (Some("talk"), Some("t-1"), Some(1))
    );
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
        let r = self
            .call("Runtime.evaluate", json!({"expression": expression, "returnByValue": true, "awaitPromise": true}));
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
    assert!(
        Command::new(env!("CARGO_BIN_EXE_hourglass"))
            .args(["stats", "--watch", "--json"])
            .output()
            .unwrap()
            .status
            .code()
            == Some(2)
    );
}

#[test]
fn dashboard_in_a_real_browser_requeues_a_dead_task_that_then_succeeds() {
    let redis = RedisServer::start();
    let host =
        Host::start(&redis, &[("mail", test_plugin("chaos"))], &format!("{ADMIN}[types.mail]\nmax_attempts = 1\n"));
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

/// With no `?type=`, the page opens on the type with the most activity, not the first by name.
#[test]
fn dashboard_opens_on_the_busiest_type() {
    let redis = RedisServer::start();
    let host = Host::start(&redis, &[("alpha", plugin("noop")), ("zulu", plugin("noop"))], ADMIN);
    let addr = admin_addr(&host);
    let mut conn = redis.client();
    schedule(&mut conn, "alpha", "a-1", "");
    for i in 0..5 {
        schedule(&mut conn, "zulu", &format!("z-{i}"), "");
    }
    wait_for("the runs", LONG, || {
        (stat(&mut conn, "alpha", "succeeded") == 1 && stat(&mut conn, "zulu", "succeeded") == 5).then_some(())
    });
    let page = get(&addr, "/").body;
    assert!(page.contains("<tr class=selected data-type=\"zulu\">"), "zulu (5 runs) selected:\n{page}");
    assert!(page.contains("<tr data-type=\"alpha\">"), "alpha (1 run) listed, not selected");
    // Asked for by name, the named one.
    assert!(get(&addr, "/?type=alpha").body.contains("<tr class=selected data-type=\"alpha\">"));
}

/// A workflow group's page in a browser: a progress bar of its children (each
/// linked to its task page), refreshed while the group is open, and the
/// callback's own run once it fired; the types table counts the open groups.
#[test]
fn dashboard_in_a_real_browser_follows_a_workflow_group_to_its_callback() {
    let redis = RedisServer::start();
    let host = Host::start(
        &redis,
        &[("mail", test_plugin("chaos")), ("report", plugin("noop"))],
        &format!("{ADMIN}[types.mail]\nmax_attempts = 1\n"),
    );
    let addr = admin_addr(&host);
    let mut conn = redis.client();
    let cli = |args: &[&str]| {
        let out = crate::support::hourglass_on(&redis, args);
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    cli(&["group", "open", "report", "week-48"]);
    cli(&["group", "add", "report", "week-48", "mail", "m-ok", "--payload", "ok"]);
    cli(&["group", "add", "report", "week-48", "mail", "m-bounce", "--payload", "error:mailbox full"]);
    cli(&["group", "add", "report", "week-48", "mail", "m-later", "--in", "1h", "--payload", "ok"]);
    wait_for("two children to end", LONG, || {
        (stat(&mut conn, "mail", "succeeded") == 1 && zcard(&mut conn, "hourglass:{mail}:dead") == 1).then_some(())
    });

    let mut browser = Browser::launch();
    browser.goto(&format!("http://{addr}/?type=report"));
    browser.wait_until(
        "the types table counting one open group, and its progress in the open groups",
        r#"(() => { const n = document.querySelector('#types tr[data-type=report] td[data-col=groups_open]');
                    return !!n && n.innerText === '1'
                        && !!document.querySelector('#groups tr[data-group="week-48"] .progress .pending'); })()"#,
    );
    browser.click(r#"#groups tr[data-group="week-48"] a"#);
    browser.wait_until(
        "the open group with 1 succeeded, 1 dead and 1 pending of 3",
        r#"(() => !!document.querySelector('#group[data-state=open]')
                  && !!document.querySelector('#group .progress[data-added="3"] .succeeded[data-succeeded="1"]')
                  && !!document.querySelector('#group .progress .dead[data-dead="1"]')
                  && !!document.querySelector('#group .progress .pending[data-pending="1"]')
                  && !!document.querySelector('#group tr.child[data-child=pending] a[href*="id=%6D%2D%6C%61%74%65%72"]')
                  && !!document.querySelector('#group tr.child[data-child=dead] a')
                  && document.getElementById('back').getAttribute('href') === '/?type=%72%65%70%6F%72%74')()"#,
    );
    if let Some(path) = std::env::var_os("HOURGLASS_SCREENSHOT") {
        browser.screenshot(Path::new(&format!("{}-group-open.png", path.to_string_lossy())));
    }
    // The last child runs now and the group is sealed: the page, refreshing
    // itself, shows the group done and the callback's run.
    cli(&["schedule", "mail", "m-later", "--at", "0", "--payload", "ok"]);
    cli(&["group", "seal", "report", "week-48"]);
    browser.wait_until(
        "the group done, its callback fired",
        r#"(() => !!document.querySelector('#group[data-state=done]')
                  && !!document.querySelector('#group .progress .succeeded[data-succeeded="2"]')
                  && !document.querySelector('#group .progress .pending')
                  && !!document.querySelector('#callback-run a[href^="/task?type="]'))()"#,
    );
    // A child's link leads to its task page.
    browser.click("#group tr.child[data-child=dead] a");
    browser.wait_until(
        "the dead child's task page",
        r#"(() => location.pathname === '/task' && !!document.querySelector('#task[data-state=dead]'))()"#,
    );
    wait_for("the callback to run", LONG, || (stat(&mut conn, "report", "succeeded") == 1).then_some(()));
    // Back on the group's page, the callback's run is shown succeeded.
    browser.goto(&format!("http://{addr}/group?type=report&group=week-48"));
    browser.wait_until(
        "the callback's run, succeeded",
        r#"(() => { const r = document.querySelector('#callback-run[data-state=succeeded]');
                    return !!r && r.innerText.includes('succeeded at'); })()"#,
    );
    if let Some(path) = std::env::var_os("HOURGLASS_SCREENSHOT") {
        browser.screenshot(Path::new(&format!("{}-group-done.png", path.to_string_lossy())));
    }
}

/// The backlog gauges follow the due set of a type no host serves (so nothing
/// claims its tasks): each sample matches `ZCOUNT` within one sampling period.
#[test]
fn backlog_gauges_follow_the_due_set() {
    let redis = RedisServer::start();
    let host = Host::start(&redis, &[("noop", plugin("noop"))], ADMIN);
    let addr = admin_addr(&host);
    let mut conn = redis.client();
    let now = now_ms();
    for i in 0..3 {
        crate::support::zadd(&mut conn, "report", &format!("late-{i}"), now - 60_000 - i);
    }
    for i in 0..2 {
        crate::support::zadd(&mut conn, "report", &format!("later-{i}"), now + 3_600_000);
    }
    let gauges = |metrics: &str| {
        let g = |name| sample(metrics, name, &["type=\"report\""]);
        (g("hourglass_tasks_due"), g("hourglass_tasks_scheduled"), g("hourglass_oldest_due_age_seconds"))
    };
    let count = |conn: &mut redis::Connection, min: &str, max: &str| -> f64 {
        let n: u64 = redis::cmd("ZCOUNT").arg("hourglass:{report}:due").arg(min).arg(max).query(conn).unwrap();
        n as f64
    };
    assert_eq!((count(&mut conn, "-inf", &now.to_string()), count(&mut conn, &format!("({now}"), "+inf")), (3.0, 2.0));
    let (_, _, age) = wait_for("the gauges to match the due set", LONG, || {
        let (due, later, age) = gauges(&get(&addr, "/metrics").body);
        (due == Some(3.0) && later == Some(2.0)).then(|| (due, later, age.expect("the age gauge with the others")))
    });
    // The oldest is 60.002 s old when written, and only gets older.
    assert!(age >= 60.0, "oldest due age {age}");

    // The next samples see a change: two more due, one scheduled one brought forward, then all gone.
    crate::support::zadd(&mut conn, "report", "late-3", now_ms());
    crate::support::zadd(&mut conn, "report", "later-0", now_ms());
    wait_for("the gauges to follow", LONG, || {
        let (due, later, _) = gauges(&get(&addr, "/metrics").body);
        (due == Some(5.0) && later == Some(1.0)).then_some(())
    });
    let _: () = redis::cmd("DEL").arg("hourglass:{report}:due").query(&mut conn).unwrap();
    wait_for("the gauges to drop to 0", LONG, || {
        (gauges(&get(&addr, "/metrics").body) == (Some(0.0), Some(0.0), Some(0.0))).then_some(())
    });
    // A served type's gauges exist too (its tasks are claimed at once: nothing waits).
    let metrics = get(&addr, "/metrics").body;
    assert_eq!(sample(&metrics, "hourglass_tasks_due", &["type=\"noop\""]), Some(0.0), "{metrics}");
    assert!(metrics.contains("# TYPE hourglass_oldest_due_age_seconds gauge"), "{metrics}");

    // Every metric the Kubernetes files and their README name is one this host serves.
    let deploy = crate::support::workspace_root().join("deploy");
    let mut named = Vec::new();
    for file in ["keda-scaledobject.yaml", "servicemonitor.yaml", "hourglass.yaml", "README.md"] {
        let text = std::fs::read_to_string(deploy.join(file)).unwrap();
        for (at, _) in text.match_indices("hourglass_") {
            let name: String = text[at..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            // `hourglass_*` names them all, not one.
            if !name.ends_with('_') {
                named.push((file, name));
            }
        }
    }
    assert!(named.iter().any(|(f, n)| *f == "keda-scaledobject.yaml" && n == "hourglass_tasks_due"), "{named:?}");
    for (file, name) in named {
        assert!(
            metrics.contains(&format!("# TYPE {name} ")),
            "deploy/{file} names {name}, which /metrics does not serve"
        );
    }
}

/// The task page: found from the search box, it shows each state with the
/// actions that fit it, and each action moves only a task in the state it is for.
#[test]
fn task_page_shows_a_task_and_its_actions_change_only_what_they_should() {
    let redis = RedisServer::start();
    let host = Host::start(
        &redis,
        &[("mail", test_plugin("chaos"))],
        &format!("{ADMIN}[types.mail]\nmax_attempts = 1\ntimeout = \"60s\"\n"),
    );
    let addr = admin_addr(&host);
    let mut conn = redis.client();
    assert!(get(&addr, "/").body.contains("<form method=get action=/task class=search"), "the search box");
    let page = |id: &str| get(&addr, &format!("/task?type=mail&id={id}"));
    let score =
        |conn: &mut redis::Connection, id: &str| -> Option<i64> { conn.zscore("hourglass:{mail}:due", id).unwrap() };

    // Scheduled: run now, postpone and cancel are offered.
    let in_an_hour = now_ms() + 3_600_000;
    crate::support::payload(&mut conn, "mail", "later", "ok");
    crate::support::zadd(&mut conn, "mail", "later", in_an_hour);
    let r = page("later");
    assert_eq!(r.status, 200, "{}", r.body);
    for needle in [
        "data-state=scheduled",
        "scheduled for",
        "2 bytes, text: ok",
        "data-action=run-now",
        "data-action=postpone",
        "data-action=cancel",
    ] {
        assert!(r.body.contains(needle), "task page lacks {needle:?}:\n{}", r.body);
    }
    assert!(!r.body.contains("data-action=requeue"));
    let later = hex("later");

    // Postpone adds to its due time; a bad duration is refused and writes nothing.
    assert_eq!(post(&addr, "/task/postpone", &format!("type=mail&id_hex={later}&by=soon")).status, 400);
    assert_eq!(post(&addr, "/task/postpone", &format!("type=mail&id_hex={later}&by=0s")).status, 400);
    assert_eq!(score(&mut conn, "later"), Some(in_an_hour));
    let r = post(&addr, "/task/postpone", &format!("type=mail&id_hex={later}&by=5m"));
    assert_eq!(r.status, 303, "{}", r.body);
    assert!(
        r.headers["location"]
            .starts_with(&format!("/task?type=mail&id_hex={later}&msg=mail%2Flater%3A+postponed+by+5m")),
        "{:?}",
        r.headers
    );
    assert_eq!(score(&mut conn, "later"), Some(in_an_hour + 300_000));

    // Run now: it runs (the chaos payload "ok" succeeds) and is then gone.
    let r = post(&addr, "/task/run-now", &format!("type=mail&id_hex={later}"));
    assert_eq!(r.status, 303, "{}", r.body);
    wait_for("the task run now to succeed", LONG, || (stat(&mut conn, "mail", "succeeded") == 1).then_some(()));
    let r = page("later");
    assert!(
        r.body.contains("data-state=unknown") && r.body.contains("unknown: not scheduled, running or dead"),
        "{}",
        r.body
    );
    // Run now and postpone of a task no longer scheduled write nothing: no task is re-created.
    for (action, extra) in [("run-now", ""), ("postpone", "&by=5m")] {
        let r = post(&addr, &format!("/task/{action}"), &format!("type=mail&id_hex={later}{extra}"));
        assert!(r.headers["location"].contains("was+not+moved"), "{action}: {:?}", r.headers);
    }
    assert_eq!(score(&mut conn, "later"), None);

    // Cancel needs its confirmation, then removes the task and its payload.
    crate::support::payload(&mut conn, "mail", "doomed", "ok");
    crate::support::zadd(&mut conn, "mail", "doomed", in_an_hour);
    assert_eq!(post(&addr, "/task/cancel", &format!("type=mail&id_hex={}", hex("doomed"))).status, 400);
    assert_eq!(score(&mut conn, "doomed"), Some(in_an_hour));
    let r = post(&addr, "/task/cancel", &format!("type=mail&id_hex={}&confirm=yes", hex("doomed")));
    assert!(r.headers["location"].contains("cancelled"), "{:?}", r.headers);
    assert_eq!(score(&mut conn, "doomed"), None);
    let body: Option<String> = conn.hget("hourglass:{mail}:payload", "doomed").unwrap();
    assert_eq!(body, None);

    // Running: shown with its host and attempt, with only a Cancel button; run now leaves it alone.
    schedule(&mut conn, "mail", "busy", "sleep:30000");
    let r = wait_for("the task to run", LONG, || Some(page("busy")).filter(|r| r.body.contains("data-state=running")));
    assert!(r.body.contains("running on host ") && r.body.contains(", attempt 1, lease until "), "{}", r.body);
    assert!(r.body.contains("data-action=cancel") && !r.body.contains("data-action=run-now"), "{}", r.body);
    let r = post(&addr, "/task/run-now", &format!("type=mail&id_hex={}", hex("busy")));
    assert!(r.headers["location"].contains("was+not+moved"), "{:?}", r.headers);
    assert_eq!(score(&mut conn, "busy"), None, "a running task was put back in due");
    // Its Cancel stops the handler (30 s of sleep) and records it as cancelled, not retried.
    let r = post(&addr, "/task/cancel", &format!("type=mail&id_hex={}&confirm=yes", hex("busy")));
    assert!(r.headers["location"].contains("cancelled+while+running"), "{:?}", r.headers);
    wait_for("the running task to be cancelled", LONG, || (stat(&mut conn, "mail", "cancelled") == 1).then_some(()));
    let r = page("busy");
    assert!(r.body.contains("data-state=unknown"), "a cancelled task is gone: {}", r.body);
    assert_eq!(score(&mut conn, "busy"), None, "a cancelled task was retried");

    // Dead: re-queue is offered, and runs it again.
    schedule(&mut conn, "mail", "bad", "error:smtp down");
    wait_for("the task to die", LONG, || (zcard(&mut conn, "hourglass:{mail}:dead") == 1).then_some(()));
    let r = page("bad");
    assert!(
        r.body.contains("data-state=dead") && r.body.contains("smtp down") && r.body.contains("data-action=requeue"),
        "{}",
        r.body
    );
    assert!(!r.body.contains("data-action=cancel") && !r.body.contains("data-action=run-now"));
    let r = post(&addr, "/task/requeue", &format!("type=mail&id_hex={}", hex("bad")));
    assert!(r.headers["location"].contains("re-queued"), "{:?}", r.headers);
    wait_for("the re-queued task to die again", LONG, || (stat(&mut conn, "mail", "dead") == 2).then_some(()));
    let r = post(&addr, "/task/requeue", &format!("type=mail&id_hex={}", hex("later")));
    assert!(r.headers["location"].contains("not+re-queued"), "{:?}", r.headers);

    // Ids are any bytes: the page takes them as hex too.
    let id: &[u8] = &[0xff, 0x00];
    let _: () = conn.zadd("hourglass:{mail}:due", id, in_an_hour).unwrap();
    let r = get(&addr, "/task?type=mail&id_hex=ff00");
    assert!(r.body.contains("data-state=scheduled") && r.body.contains("value=\"ff00\""), "{}", r.body);

    // Bad input, GETs and other sites' pages change nothing.
    assert_eq!(get(&addr, "/task?type=Bad&id=x").status, 400);
    assert_eq!(get(&addr, "/task?type=mail&id_hex=zz").status, 400);
    assert_eq!(get(&addr, "/task/run-now?type=mail&id_hex=ff00").status, 405);
    let r = http(&addr, "POST", "/task/run-now", &[("Origin", "http://evil.example")], "type=mail&id_hex=ff00");
    assert_eq!(r.status, 403);
    assert_eq!(post(&addr, "/task/run-now", "type=mail&id_hex=").status, 400);
    let left: Option<i64> = conn.zscore("hourglass:{mail}:due", id).unwrap();
    assert_eq!(left, Some(in_an_hour));
}

#[test]
fn dashboard_in_a_real_browser_finds_a_task_and_runs_it_now() {
    let redis = RedisServer::start();
    let host = Host::start(&redis, &[("mail", test_plugin("chaos"))], ADMIN);
    let addr = admin_addr(&host);
    let mut conn = redis.client();
    crate::support::payload(&mut conn, "mail", "w-1", "ok");
    crate::support::zadd(&mut conn, "mail", "w-1", now_ms() + 3_600_000);

    let mut browser = Browser::launch();
    browser.goto(&format!("http://{addr}/"));
    browser.wait_until("the search box", "!!document.querySelector('form.search input[name=id]')");
    // Type into the search box as a person would, then press its button.
    browser.eval("document.querySelector('form.search input[name=type]').value = 'mail'");
    browser.click("form.search input[name=id]");
    browser.call("Input.insertText", json!({"text": "w-1"}));
    browser.click("form.search button");
    browser.wait_until(
        "the task page of w-1, scheduled",
        r#"(() => location.pathname === '/task' && !!document.querySelector('#task[data-state=scheduled]')
                  && document.getElementById('headline').innerText.startsWith('scheduled for'))()"#,
    );
    if let Some(path) = std::env::var_os("HOURGLASS_SCREENSHOT") {
        browser.screenshot(Path::new(&format!("{}-task.png", path.to_string_lossy())));
    }
    browser.click("button[data-action=run-now]");
    browser.wait_until(
        "the run-now message and the task gone after it succeeded",
        r#"(() => { const msg = document.getElementById('msg');
                    return !!msg && msg.innerText.includes('run now')
                        && !!document.querySelector('#task[data-state=unknown]'); })()"#,
    );
    assert_eq!(stat(&mut conn, "mail", "succeeded"), 1);
}

#[test]
fn dashboard_in_a_real_browser_pauses_and_resumes_a_type_and_cancels_a_running_task() {
    let redis = RedisServer::start();
    let host = Host::start(&redis, &[("mail", test_plugin("chaos"))], ADMIN);
    let addr = admin_addr(&host);
    let mut conn = redis.client();
    // One task run first, so the type has a row on the page.
    schedule(&mut conn, "mail", "first", "ok");
    wait_for("the first task to succeed", LONG, || (stat(&mut conn, "mail", "succeeded") == 1).then_some(()));

    let mut browser = Browser::launch();
    browser.goto(&format!("http://{addr}/"));
    browser.wait_until("the pause button of mail", "!!document.querySelector('button[data-action=pause]')");
    browser.click("button[data-action=pause]");
    browser.wait_until(
        "the type shown paused, with a resume button",
        "!!document.querySelector('[data-paused]') && !!document.querySelector('button[data-action=resume]')",
    );
    let paused: bool = conn.exists("hourglass:{mail}:paused").unwrap();
    assert!(paused, "the pause button wrote no pause to Redis");
    // Paused: a due task waits in due and is not run.
    schedule(&mut conn, "mail", "held", "ok");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(stat(&mut conn, "mail", "succeeded"), 1, "a paused type ran a task");
    browser.click("button[data-action=resume]");
    browser.wait_until("the pause button back", "!!document.querySelector('button[data-action=pause]')");
    wait_for("the held task to run once resumed", LONG, || (stat(&mut conn, "mail", "succeeded") == 2).then_some(()));

    // A running task (30 s of sleep): found by id, cancelled from its page.
    schedule(&mut conn, "mail", "busy", "sleep:30000");
    wait_for("busy to run", LONG, || (crate::support::leases(&mut conn, "mail").len() == 1).then_some(()));
    browser.goto(&format!("http://{addr}/task?type=mail&id=busy"));
    browser.wait_until(
        "the running task with its cancel button",
        "!!document.querySelector('#task[data-state=running] button[data-action=cancel]')",
    );
    browser.click("#task-actions input[name=confirm]");
    browser.click("button[data-action=cancel]");
    browser.wait_until(
        "the message that it was cancelled while running",
        r#"(() => { const msg = document.getElementById('msg'); return !!msg && msg.innerText.includes('cancelled while running'); })()"#,
    );
    wait_for("the run to be stopped and counted cancelled", LONG, || {
        (stat(&mut conn, "mail", "cancelled") == 1).then_some(())
    });
    assert_eq!(crate::support::leases(&mut conn, "mail").len(), 0);
    assert_eq!(zcard(&mut conn, "hourglass:{mail}:due"), 0, "a cancelled task was retried");
}

/// A group's page on a host that did not run the callback: the callback is
/// gone from Redis and this host never settled it, so the page says it ended
/// on another host (succeeded or cancelled), not that it is unknown.
#[test]
fn a_group_page_says_when_another_host_ran_the_callback() {
    let redis = RedisServer::start();
    let mut c = redis.client();
    let viewer = Host::start(&redis, &[], ADMIN);
    let _runner = Host::start(&redis, &[("done", plugin("noop"))], "");
    for args in [&["group", "open", "done", "g-1", "--callback-id", "cb-1"][..], &["group", "seal", "done", "g-1"]] {
        let out = crate::support::hourglass_on(&redis, args);
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    wait_for("the other host to run the callback", LONG, || (stat(&mut c, "done", "succeeded") == 1).then_some(()));
    viewer.wait_log("admin server listening", LONG);
    let page = get(&admin_addr(&viewer), "/group?type=done&group=g-1");
    assert_eq!(page.status, 200);
    assert!(
        page.body.contains("id=callback-run data-state=ended") && page.body.contains("ended on another host"),
        "{}",
        page.body
    );
}
