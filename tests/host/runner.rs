//! End to end: a real `hourglass run` process, a real redis-server and real
//! compiled plugins; tasks are written with raw Redis commands as any client would.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use crate::support::{Host, RedisServer, leases, now_ms, payload, plugin, stat, test_plugin, wait_for, zadd, zcard};
use redis::Commands;

const LONG: Duration = Duration::from_secs(60);

#[test]
fn tasks_run_at_their_due_time_and_not_before() {
    let redis = RedisServer::start();
    let host = Host::start(&redis, &[("noop", plugin("noop"))], "");
    let mut conn = redis.client();
    let due = now_ms() + 1500;
    zadd(&mut conn, "noop", "later", due);
    // Watch it closely: the moment it is done must not come before its due time.
    let done_at = wait_for("task to run", LONG, || (stat(&mut conn, "noop", "succeeded") == 1).then(now_ms));
    assert!(done_at >= due, "ran {} ms early", due - done_at);
    assert_eq!(host.runs_of(&host.log(), "noop", "later"), 1);
}

#[test]
fn raw_zadd_postpones_and_zrem_cancels() {
    let redis = RedisServer::start();
    let host = Host::start(&redis, &[("noop", plugin("noop"))], "");
    let mut conn = redis.client();
    let soon = now_ms() + 1000;
    zadd(&mut conn, "noop", "postponed", soon);
    zadd(&mut conn, "noop", "cancelled", soon);
    let later = now_ms() + 2500;
    zadd(&mut conn, "noop", "postponed", later);
    let _: () = conn.zrem("hourglass:{noop}:due", "cancelled").unwrap();
    let done_at = wait_for("postponed task", LONG, || (stat(&mut conn, "noop", "succeeded") >= 1).then(now_ms));
    assert!(done_at >= later, "the postponed task ran at its old time");
    // Give a wrongly kept "cancelled" every chance to show up.
    zadd(&mut conn, "noop", "marker", now_ms());
    wait_for("marker", LONG, || (stat(&mut conn, "noop", "succeeded") == 2).then_some(()));
    let log = host.log();
    assert_eq!(host.runs_of(&log, "noop", "postponed"), 1);
    assert_eq!(host.runs_of(&log, "noop", "cancelled"), 0);
}

#[test]
fn retries_then_succeeds_and_dead_letters_after_max_attempts() {
    let redis = RedisServer::start();
    let host = Host::start(
        &redis,
        &[("flaky", plugin("flaky")), ("chaos", test_plugin("chaos"))],
        "[defaults]\nbackoff_base = \"20ms\"\nbackoff_cap = \"100ms\"\n[types.chaos]\nmax_attempts = 3\n",
    );
    let mut conn = redis.client();
    payload(&mut conn, "flaky", "f1", r#"{"fail_times": 2}"#);
    zadd(&mut conn, "flaky", "f1", now_ms());
    payload(&mut conn, "chaos", "c1", "error:always broken");
    zadd(&mut conn, "chaos", "c1", now_ms());
    wait_for("flaky to succeed", LONG, || (stat(&mut conn, "flaky", "succeeded") == 1).then_some(()));
    assert_eq!(stat(&mut conn, "flaky", "retried"), 2);
    assert_eq!(stat(&mut conn, "flaky", "failed"), 2);
    wait_for("chaos to die", LONG, || (zcard(&mut conn, "hourglass:{chaos}:dead") == 1).then_some(()));
    assert_eq!(stat(&mut conn, "chaos", "failed"), 3);
    let error: String = conn.hget("hourglass:{chaos}:errors", "c1").unwrap();
    assert!(error.contains("always broken"), "{error}");
    assert!(host.log().contains("dead-lettered after 3 attempts"));
}

#[test]
fn per_type_concurrency_is_respected_and_a_flood_does_not_starve_others() {
    let redis = RedisServer::start();
    let _host = Host::start(
        &redis,
        &[("slow", test_plugin("chaos")), ("quick", plugin("noop"))],
        "[types.slow]\nconcurrency = 3\n",
    );
    let mut conn = redis.client();
    let now = now_ms();
    for i in 0..40 {
        payload(&mut conn, "slow", &format!("s{i}"), "sleep:100");
        zadd(&mut conn, "slow", &format!("s{i}"), now);
    }
    zadd(&mut conn, "quick", "q", now + 300);
    let mut most = 0;
    let mut quick_done_while_flooded = false;
    wait_for("the flood to drain", LONG, || {
        most = most.max(leases(&mut conn, "slow").len());
        if stat(&mut conn, "quick", "succeeded") == 1 && stat(&mut conn, "slow", "succeeded") < 35 {
            quick_done_while_flooded = true;
        }
        (stat(&mut conn, "slow", "succeeded") == 40).then_some(())
    });
    assert!(most <= 3, "{most} slow tasks were leased at once, limit is 3");
    assert!(most >= 2, "slow tasks never ran in parallel");
    assert!(quick_done_while_flooded, "the quick type waited for the flood");
}

#[test]
fn hot_reload_while_10000_tasks_flow_runs_each_exactly_once() {
    let redis = RedisServer::start();
    let host = Host::start(&redis, &[("bulk", plugin("noop"))], "");
    let mut conn = redis.client();
    let now = now_ms();
    let mut pipe = redis::pipe();
    for i in 0..10_000 {
        // Spread over ~2s so the swap lands mid-stream.
        pipe.zadd("hourglass:{bulk}:due", format!("t{i}"), now + i64::from(i) / 5).ignore();
    }
    let _: () = pipe.query(&mut conn).unwrap();
    wait_for("some tasks done", LONG, || (stat(&mut conn, "bulk", "succeeded") > 500).then_some(()));
    // Replace the plugin the way deploy tools do: write elsewhere, rename into place.
    host.drop_in("bulk", &test_plugin("chaos"));
    wait_for("all done", LONG, || (stat(&mut conn, "bulk", "succeeded") == 10_000).then_some(()));
    let log = host.log();
    assert!(log.contains("plugin replaced"), "no reload in the log");
    let mut runs: HashMap<String, usize> = HashMap::new();
    for line in log.lines().filter(|l| l.contains("succeeded") && l.contains("task_type=bulk ")) {
        let id = line.split("task_id=").nth(1).unwrap().split(' ').next().unwrap();
        *runs.entry(id.to_owned()).or_default() += 1;
    }
    assert_eq!(runs.len(), 10_000);
    assert!(runs.values().all(|&n| n == 1), "some task ran twice");
    assert_eq!(stat(&mut conn, "bulk", "failed"), 0);
}

#[test]
fn kill_9_mid_run_then_restart_completes_everything() {
    let redis = RedisServer::start();
    let mut host = Host::start(
        &redis,
        &[("work", test_plugin("chaos"))],
        "[runner]\nlease = \"1s\"\n[types.work]\nconcurrency = 8\n",
    );
    let mut conn = redis.client();
    let now = now_ms();
    for i in 0..200 {
        payload(&mut conn, "work", &format!("w{i}"), "sleep:20");
        zadd(&mut conn, "work", &format!("w{i}"), now);
    }
    wait_for("some done", LONG, || (stat(&mut conn, "work", "succeeded") >= 40).then_some(()));
    host.signal("KILL");
    host.wait_exit(LONG);
    let in_flight: HashSet<String> = leases(&mut conn, "work").into_keys().collect();
    host.spawn();
    wait_for("all done after restart", LONG, || {
        let left = zcard(&mut conn, "hourglass:{work}:due") + leases(&mut conn, "work").len();
        (left == 0).then_some(())
    });
    let log = host.log();
    for i in 0..200 {
        let id = format!("w{i}");
        let runs = host.runs_of(&log, "work", &id);
        assert!(runs >= 1, "{id} never ran");
        assert!(runs == 1 || in_flight.contains(&id), "{id} ran {runs} times but was not in flight at the kill");
    }
}

#[test]
fn sigterm_drains_running_tasks_and_hands_back_the_rest() {
    let redis = RedisServer::start();
    let mut host = Host::start(
        &redis,
        &[("quick", test_plugin("chaos")), ("stuck", test_plugin("chaos"))],
        "[runner]\ngrace_period = \"1500ms\"\n[types.stuck]\ntimeout = \"60s\"\n",
    );
    let mut conn = redis.client();
    payload(&mut conn, "quick", "q", "sleep:300");
    zadd(&mut conn, "quick", "q", now_ms());
    payload(&mut conn, "stuck", "s", "sleep:20000");
    zadd(&mut conn, "stuck", "s", now_ms());
    wait_for("both running", LONG, || {
        (leases(&mut conn, "quick").len() + leases(&mut conn, "stuck").len() == 2).then_some(())
    });
    host.signal("TERM");
    assert_eq!(host.wait_exit(LONG), Some(0));
    assert_eq!(stat(&mut conn, "quick", "succeeded"), 1, "the quick task was not allowed to finish");
    assert_eq!(leases(&mut conn, "stuck").len(), 0, "lease not handed back");
    let score: Option<i64> = conn.zscore("hourglass:{stuck}:due", "s").unwrap();
    assert!(score.is_some_and(|s| s <= now_ms()), "the unfinished task is not due again");
    assert!(host.log().contains("handed back"));
}

#[test]
fn redis_restart_mid_run_loses_nothing() {
    let persist = ["--appendonly", "yes", "--appendfsync", "always"];
    let mut redis = RedisServer::start_with(&persist);
    let host = Host::start(&redis, &[("durable", plugin("noop"))], "[runner]\npoll_interval = \"50ms\"\n");
    let mut conn = redis.client();
    let now = now_ms();
    let mut pipe = redis::pipe();
    for i in 0..2000 {
        pipe.zadd("hourglass:{durable}:due", format!("d{i}"), now + i64::from(i) * 2).ignore();
    }
    let _: () = pipe.query(&mut conn).unwrap();
    wait_for("some done", LONG, || (stat(&mut conn, "durable", "succeeded") > 100).then_some(()));
    redis.restart(&persist);
    let mut conn = redis.client();
    wait_for("all done after the restart", LONG, || {
        let left = zcard(&mut conn, "hourglass:{durable}:due") + leases(&mut conn, "durable").len();
        (left == 0).then_some(())
    });
    let log = host.log();
    for i in 0..2000 {
        assert!(host.runs_of(&log, "durable", &format!("d{i}")) >= 1, "d{i} never ran");
    }
    assert_eq!(log.matches("Redis is unreachable").count(), 1, "the outage was not logged exactly once");
}

#[test]
fn after_a_redis_restart_keyspace_notifications_are_turned_on_again() {
    // No persistence: a restarted server has forgotten the CONFIG SET, as a
    // managed or container Redis does.
    let mut redis = RedisServer::start();
    let host = Host::start(&redis, &[("idle", plugin("noop"))], "");
    host.wait_log("wake-up mode: keyspace notifications (enabled with CONFIG SET", LONG);
    let flags = |redis: &RedisServer| redis.cli(&["CONFIG", "GET", "notify-keyspace-events"]);
    assert!(flags(&redis).contains('K'), "{}", flags(&redis));
    redis.restart(&[]);
    host.wait_log("keyspace notifications re-subscribed after a reconnect (enabled with CONFIG SET", LONG);
    let now = flags(&redis);
    assert!(now.contains('K') && now.contains('z'), "notifications are off after the restart: {now}");
    // And tasks scheduled after the restart run.
    let mut conn = redis.client();
    zadd(&mut conn, "idle", "after-restart", now_ms());
    wait_for("the task after the restart", LONG, || (stat(&mut conn, "idle", "succeeded") == 1).then_some(()));
    assert_eq!(host.log().matches("re-subscribed after a reconnect").count(), 1, "one line per reconnect");
}

#[test]
fn a_first_start_serves_the_admin_server_first_and_logs_each_compile() {
    let redis = RedisServer::start();
    let plugins = [("noop", plugin("noop")), ("flaky", plugin("flaky")), ("chaos", test_plugin("chaos"))];
    let mut host = Host::start_cold(&redis, &plugins, "[admin]\nenabled = true\nlisten = \"127.0.0.1:0\"\n");
    let log = host.log();
    let admin = log.find("admin server listening").expect("admin server started");
    let first_compile = log.find("compiling ").expect("a compile was logged");
    assert!(admin < first_compile, "the admin server started after the compiles:\n{log}");
    for (name, _) in &plugins {
        assert!(log.contains(&format!("{name}.wasm (first start; cached afterwards)…")), "{name}:\n{log}");
    }
    assert_eq!(log.matches("compiled ").count(), 3, "{log}");
    // A restart maps the compiled plugins from the cache: no compile.
    host.signal("TERM");
    assert_eq!(host.wait_exit(LONG), Some(0));
    let before = host.log().len();
    host.spawn();
    let restarted = &host.log()[before..];
    assert!(!restarted.contains("compiling "), "compiled again after a restart:\n{restarted}");
}

#[test]
fn plugins_are_counted_while_they_load() {
    use hourglass::config::Config;
    use hourglass::registry::Registry;
    use hourglass::runtime::{Runtime, RuntimeOptions};
    let dir = tempfile::tempdir().unwrap();
    for name in ["noop", "flaky"] {
        std::fs::copy(plugin(name), dir.path().join(format!("{name}.wasm"))).unwrap();
    }
    let mut config = Config::default();
    config.runner.plugins_dir = dir.path().to_owned();
    let runtime = Runtime::new(RuntimeOptions::new(crate::support::compiler())).unwrap();
    let registry = Registry::new(runtime, config).unwrap();
    assert_eq!(registry.loading(), Some((0, 2)), "nothing loaded yet, two to go");
    assert!(registry.types().is_empty());
    registry.reload();
    assert_eq!(registry.loading(), None);
    assert_eq!(registry.types().len(), 2);
}

#[test]
fn garbage_in_plugins_folder_leaves_the_host_serving() {
    let redis = RedisServer::start();
    let host = Host::start(&redis, &[("keep", plugin("noop"))], "");
    std::fs::write(host.plugins().join("junk.wasm"), b"this is not wasm").unwrap();
    host.wait_log("junk.wasm", LONG);
    // A broken replacement of a working plugin must not replace it.
    let staged = host.dir.path().join("keep.wasm.new");
    std::fs::write(&staged, b"\0asm broken").unwrap();
    std::fs::rename(&staged, host.plugins().join("keep.wasm")).unwrap();
    host.wait_log("previous version keeps serving", LONG);
    let mut conn = redis.client();
    zadd(&mut conn, "keep", "k", now_ms());
    wait_for("task served by the old version", LONG, || (stat(&mut conn, "keep", "succeeded") == 1).then_some(()));
}

#[test]
fn removed_plugin_stops_claims_and_tasks_wait() {
    let redis = RedisServer::start();
    let host = Host::start(&redis, &[("gone", plugin("noop"))], "");
    std::fs::remove_file(host.plugins().join("gone.wasm")).unwrap();
    host.wait_log("claims stopped", LONG);
    let mut conn = redis.client();
    zadd(&mut conn, "gone", "g", now_ms());
    // A plugin dropped in later picks the waiting task up.
    std::fs::copy(plugin("noop"), host.dir.path().join("gone.tmp")).unwrap();
    assert_eq!(zcard(&mut conn, "hourglass:{gone}:due"), 1, "the task must wait in Redis");
    std::fs::rename(host.dir.path().join("gone.tmp"), host.plugins().join("gone.wasm")).unwrap();
    wait_for("served again", LONG, || (stat(&mut conn, "gone", "succeeded") == 1).then_some(()));
}

#[test]
fn handler_schedules_a_follow_up_into_another_type() {
    let redis = RedisServer::start();
    let _host = Host::start(
        &redis,
        &[("device.offline", plugin("device.offline")), ("device.alert", plugin("device.alert"))],
        crate::support::DEVICE_GRANTS,
    );
    let mut conn = redis.client();
    // Heartbeats postpone the offline check; the last one is allowed to lapse.
    for _ in 0..3 {
        zadd(&mut conn, "device.offline", "sensor-7", now_ms() + 60_000);
    }
    zadd(&mut conn, "device.offline", "sensor-7", now_ms());
    wait_for("the alert", LONG, || (stat(&mut conn, "device.alert", "succeeded") == 1).then_some(()));
    assert_eq!(stat(&mut conn, "device.offline", "succeeded"), 1);
}

#[test]
fn managed_redis_starts_when_nothing_answers_and_stops_on_exit() {
    let port = crate::support::free_port();
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("plugins")).unwrap();
    std::fs::copy(plugin("noop"), dir.path().join("plugins/noop.wasm")).unwrap();
    std::fs::write(
        dir.path().join("runner.toml"),
        format!("[redis]\nurl = \"redis://127.0.0.1:{port}\"\nmanaged = true\n"),
    )
    .unwrap();
    let log = dir.path().join("host.log");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_hourglass"))
        .arg("--config")
        .arg(dir.path().join("runner.toml"))
        .arg("run")
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let url = format!("redis://127.0.0.1:{port}");
    wait_for("the managed redis", LONG, || {
        let mut conn = redis::Client::open(url.as_str()).ok()?.get_connection().ok()?;
        redis::cmd("PING").query::<String>(&mut conn).ok()
    });
    let mut conn = redis::Client::open(url.as_str()).unwrap().get_connection().unwrap();
    zadd(&mut conn, "noop", "m", now_ms());
    wait_for("task run", LONG, || (stat(&mut conn, "noop", "succeeded") == 1).then_some(()));
    assert!(dir.path().join(".hourglass/redis/appendonlydir").exists(), "no append-only data");
    std::process::Command::new("kill").arg(child.id().to_string()).status().unwrap();
    let status = wait_for("exit", LONG, || child.try_wait().unwrap());
    assert!(status.success(), "{}", std::fs::read_to_string(&log).unwrap());
    assert!(redis::Client::open(url.as_str()).unwrap().get_connection().is_err(), "managed redis still running");
}

#[test]
fn edited_runner_toml_changes_policy_without_restart() {
    let redis = RedisServer::start();
    let host = Host::start(
        &redis,
        &[("policy", test_plugin("chaos"))],
        "[defaults]\nbackoff_base = \"20ms\"\nbackoff_cap = \"50ms\"\n[types.policy]\nmax_attempts = 1\n",
    );
    let mut conn = redis.client();
    payload(&mut conn, "policy", "before", "error:nope");
    zadd(&mut conn, "policy", "before", now_ms());
    wait_for("dead after one attempt", LONG, || (stat(&mut conn, "policy", "dead") == 1).then_some(()));
    assert_eq!(stat(&mut conn, "policy", "retried"), 0);

    // The same edit maps new types to plugins never compiled before, whose
    // files sort ahead of policy.wasm: the reload compiles them (seconds)
    // before it reaches the edited type. The log line must wait for all of it.
    let staged = host.plugins().join("a-staged");
    std::fs::create_dir(&staged).unwrap();
    let chaos = std::fs::read(test_plugin("chaos")).unwrap();
    let mut slow_types = String::new();
    for n in 0..3 {
        let unique = with_custom_section(&chaos, "hourglass-test-nonce", format!("{n}:{}", now_ms()).as_bytes());
        std::fs::write(staged.join(format!("slow-{n}.wasm")), unique).unwrap();
        slow_types.push_str(&format!("[types.slow{n}]\nplugin = \"a-staged/slow-{n}.wasm\"\n"));
    }
    let path = host.dir.path().join("runner.toml");
    let text = std::fs::read_to_string(&path).unwrap().replace("max_attempts = 1", "max_attempts = 3");
    std::fs::write(&path, format!("{text}{slow_types}")).unwrap();
    host.wait_log("runner.toml reloaded", LONG);
    payload(&mut conn, "policy", "after", "error:nope");
    zadd(&mut conn, "policy", "after", now_ms());
    wait_for("dead after three attempts", LONG, || (stat(&mut conn, "policy", "dead") == 2).then_some(()));
    assert_eq!(stat(&mut conn, "policy", "retried"), 2, "the new max_attempts did not apply");
    // The line says what the reload changed.
    let line = host.log().lines().find(|l| l.contains("runner.toml reloaded")).unwrap().to_owned();
    assert!(line.contains(r#"policy_changed=["policy"]"#), "{line}");
    assert!(line.contains(r#"types_added=["slow0", "slow1", "slow2"]"#), "{line}");
    assert!(line.contains("types_removed=[]"), "{line}");

    // A broken edit is refused and the running config stays.
    std::fs::write(&path, "[runner]\nconcurency = 1\n").unwrap();
    host.wait_log("runner.toml not reloaded", LONG);
    payload(&mut conn, "policy", "still", "ok");
    zadd(&mut conn, "policy", "still", now_ms());
    wait_for("still serving", LONG, || (stat(&mut conn, "policy", "succeeded") == 1).then_some(()));
}

/// `wasm` (a module or component) with a custom section appended: the same
/// code under other bytes, so neither the host nor its compile cache knows it.
fn with_custom_section(wasm: &[u8], name: &str, data: &[u8]) -> Vec<u8> {
    fn leb(mut n: usize, out: &mut Vec<u8>) {
        loop {
            let byte = (n & 0x7f) as u8;
            n >>= 7;
            out.push(if n == 0 { byte } else { byte | 0x80 });
            if n == 0 {
                break;
            }
        }
    }
    let mut body = Vec::new();
    leb(name.len(), &mut body);
    body.extend_from_slice(name.as_bytes());
    body.extend_from_slice(data);
    let mut out = wasm.to_vec();
    out.push(0); // custom section id
    leb(body.len(), &mut out);
    out.extend_from_slice(&body);
    out
}

#[test]
fn an_edit_that_leaves_redis_alone_asks_for_no_restart() {
    // Started as an operator does: from its folder, `--config runner.toml`
    // (relative), `--redis` and `--plugins` given by flag.
    let redis = RedisServer::start();
    let host =
        Host::start_from_folder(&redis, &[("policy", test_plugin("chaos"))], "[types.policy]\nmax_attempts = 1\n");
    let path = host.dir.path().join("runner.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, text.replace("max_attempts = 1", "max_attempts = 2")).unwrap();
    host.wait_log("runner.toml reloaded", LONG);
    assert!(!host.log().contains("after a restart"), "a restart was asked for:\n{}", host.log());

    // A real change of what needs a restart is still named, and only it.
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, text.replace("[runner]\n", "[runner]\nconcurrency = 3\n")).unwrap();
    host.wait_log("the change to runner.concurrency takes effect after a restart", LONG);
    let restarts: Vec<_> = host.log().lines().filter(|l| l.contains("after a restart")).map(str::to_owned).collect();
    assert_eq!(restarts.len(), 1, "{restarts:#?}");
    // Tasks are served all along.
    let mut conn = redis.client();
    payload(&mut conn, "policy", "served", "ok");
    zadd(&mut conn, "policy", "served", now_ms());
    wait_for("served", LONG, || (stat(&mut conn, "policy", "succeeded") == 1).then_some(()));
}
