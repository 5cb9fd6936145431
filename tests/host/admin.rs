//! The admin server of a real `hourglass run`: health, readiness, the token,
//! the dashboard's pages and actions over HTTP; metrics, events, logs and
//! `stats --watch` in `observability`, the dashboard in a real headless
//! Chromium in `browser`, several hosts on one server in `several`.

mod browser;
mod observability;
mod several;

use std::process::{Child, Command};
use std::time::Duration;

use crate::support::{
    Host, RedisServer, admin_addr, get, http, now_ms, plugin, post, schedule_now as schedule, stat, test_plugin,
    wait_for, zcard,
};
use redis::Commands;

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
    let applied = |body: &str| body.lines().find_map(|l| l.strip_prefix("config: applied ")).map(str::to_owned);
    let started_with = applied(&r.body).unwrap_or_else(|| panic!("no config line: {}", r.body));
    // One server: the master in use is that server, since the start, never changed.
    let master = r.body.lines().find_map(|l| l.strip_prefix("redis master: ")).unwrap_or_default().to_owned();
    assert!(master.starts_with(&redis.socket().display().to_string()), "{}", r.body);
    assert!(master.ends_with("; 0 changes since start)") && !master.contains("Sentinel"), "{master}");
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
        // Which engine each plugin runs on (issue 67): mail.wasm is chaos, compiled Rust.
        "<th>engine</th>",
        "<td class=engine>none (compiled WebAssembly)</td>",
        // How a freed instance's memory is reset on this machine, and its swap (issue 50).
        "<p id=memory-reset>",
        "; swap: ",
        // How each type's runs get their instance, and what a run of each plugin costs (issue 51):
        // mail.wasm ran m-1 (which failed as a return, so its instance was kept and reset).
        "a kept instance reset after each task",
        "µs wall time per run, mean of 1 runs since it was loaded",
        "id=hosts",
        "(this one, admin at",
        "data-outcome-id=\"m-1\" data-outcome=dead",
    ] {
        assert!(page.body.contains(needle), "dashboard lacks {needle:?}:\n{}", page.body);
    }
    assert!(!page.body.contains("http://") && !page.body.contains("https://"), "the page loads outside resources");
    assert!(page.body.contains(&format!("config applied {started_with}")), "{}", page.body);
    assert!(page.body.contains("<span id=redis-master>redis master "), "{}", page.body);

    // An edit of runner.toml moves the time both show, once it applies.
    let path = host.dir.path().join("runner.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(5)); // a later millisecond than the start's
    std::fs::write(&path, text.replace("max_attempts = 1", "max_attempts = 1\ntimeout = \"20s\"")).unwrap();
    host.wait_log("runner.toml reloaded", LONG);
    let after = applied(&get(&addr, "/readyz").body).unwrap();
    assert_ne!(after, started_with, "the config time did not move");
    assert!(get(&addr, "/").body.contains(&format!("config applied {after}")));

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

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
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
