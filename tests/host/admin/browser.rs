//! The dashboard driven by a real headless Chromium: re-queueing a dead task, following a workflow group to its callback, finding a task and running it now, pausing a type and cancelling a running task.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::{ADMIN, KillOnDrop, LONG};
use crate::support::{
    Host, RedisServer, admin_addr, now_ms, plugin, schedule_now as schedule, stat, test_plugin, wait_for, zcard,
};
use redis::Commands;
use serde_json::{Value, json};

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

/// A workflow graph's page in a browser (issue 54): listed with its progress among its home type's
/// running graphs; drawn with a box per node coloured by its state and an edge per parent link,
/// the bar counting what a running node reported; a running node's box leads to its task page,
/// which links back; cancelled, the graph ends done with what waited skipped.
#[test]
fn dashboard_in_a_real_browser_draws_a_workflow_graph() {
    let redis = RedisServer::start();
    let host = Host::start(
        &redis,
        &[("work", test_plugin("chaos")), ("flow", test_plugin("chaos"))],
        &format!("{ADMIN}[types.work]\nmax_attempts = 1\n"),
    );
    let addr = admin_addr(&host);
    let mut conn = redis.client();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("graph.json");
    std::fs::write(
        &file,
        r#"{"nodes": [
            {"name": "a", "type": "work"},
            {"name": "b", "type": "work", "payload": "permanent:card declined"},
            {"name": "c", "type": "work", "parents": ["a", "b"], "when": "success"},
            {"name": "d", "type": "work", "parents": ["a"], "payload": "progress:50:60000"},
            {"name": "e", "type": "work", "parents": ["a", "d"]}
        ]}"#,
    )
    .unwrap();
    let out = crate::support::hourglass_on(&redis, &["graph", "submit", "flow", "g-1", file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    wait_for("d to report its progress", LONG, || {
        let reported: Option<String> = conn.hget("hourglass:{work}:progress", "g-1/d").unwrap();
        reported.map(|_| ())
    });

    let mut browser = Browser::launch();
    browser.goto(&format!("http://{addr}/?type=flow"));
    browser.wait_until(
        "the running graph with its progress",
        r#"!!document.querySelector('#graphs tr[data-graph="g-1"] .progress .reported')"#,
    );
    browser.click(r#"#graphs tr[data-graph="g-1"] a"#);
    browser.wait_until(
        "the graph drawn, each node coloured by its state, and the bar",
        r#"(() => { const node = (n, s) => !!document.querySelector(`#drawing g.node[data-node="${n}"][data-state=${s}]`);
                    return !!document.querySelector('#graph[data-state=running]')
                        && node('a', 'succeeded') && node('b', 'dead') && node('c', 'skipped')
                        && node('d', 'scheduled') && node('e', 'waiting')
                        && document.querySelectorAll('#drawing path.edge').length === 5
                        && document.querySelector('#drawing g[data-node="e"] text').getBBox().width > 0
                        && !!document.querySelector('#drawing path.edge[data-from="d"][data-to="e"]')
                        && !!document.querySelector('#graph .progress[data-nodes="5"] .succeeded[data-succeeded="1"]')
                        && !!document.querySelector('#graph .progress .skipped[data-skipped="1"]')
                        && !!document.querySelector('#graph .progress .reported[data-reported="0.50"]')
                        && document.querySelector('#done').innerText.startsWith('70% done')
                        && document.querySelector('#nodes tr[data-node="c"]').innerText.includes('parent b dead'); })()"#,
    );
    // The boxes are where the layers put them: a root left of its children, and e right of d.
    let x = |b: &mut Browser, n: &str| {
        b.eval(&format!(r#"document.querySelector('#drawing g[data-node="{n}"] rect').getBoundingClientRect().x"#))
            .as_f64()
            .unwrap()
    };
    let (xa, xd, xe) = (x(&mut browser, "a"), x(&mut browser, "d"), x(&mut browser, "e"));
    assert!(xa < xd && xd < xe, "layers: a {xa}, d {xd}, e {xe}");
    if let Some(path) = std::env::var_os("HOURGLASS_SCREENSHOT") {
        browser.screenshot(Path::new(&format!("{}-graph.png", path.to_string_lossy())));
    }
    browser.click(r#"#drawing g[data-node="d"] rect"#);
    browser.wait_until(
        "d's task page, running, linking back to its graph",
        r#"(() => location.pathname === '/task' && !!document.querySelector('#task[data-state=running]')
                  && !!document.querySelector('#task-details a[href^="/graph?type="]'))()"#,
    );

    // Back on the graph's page, cancelled: d is stopped, e skipped, and the page (refreshing itself) shows the graph done.
    browser.click(r#"#task-details a[href^="/graph?type="]"#);
    browser.wait_until("the graph's page again", r#"!!document.querySelector('#graph[data-state=running]')"#);
    let out = crate::support::hourglass_on(&redis, &["graph", "cancel", "flow", "g-1"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    browser.wait_until(
        "the graph done, d cancelled and e skipped",
        r#"(() => !!document.querySelector('#graph[data-state=done]')
                  && !!document.querySelector('#drawing g.node[data-node="d"][data-state=cancelled]')
                  && !!document.querySelector('#drawing g.node[data-node="e"][data-state=skipped]')
                  && document.querySelector('#nodes tr[data-node="e"]').innerText.includes('graph cancelled'))()"#,
    );
    if let Some(path) = std::env::var_os("HOURGLASS_SCREENSHOT") {
        browser.screenshot(Path::new(&format!("{}-graph-cancelled.png", path.to_string_lossy())));
    }
    assert_eq!(stat(&mut conn, "flow", "graphs_failed"), 1);
}
