//! The `hourglass` command line against a real redis-server: happy paths and bad input.

use std::process::{Command, Output};

use crate::support::{RedisServer, now_ms};
use redis::Commands;

fn hourglass(redis: Option<&RedisServer>, args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hourglass"));
    cmd.env_remove("HOURGLASS_REDIS_URL").current_dir(std::env::temp_dir());
    if let Some(redis) = redis {
        cmd.arg("--redis").arg(redis.url());
    }
    cmd.args(args).output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Every key in the server, to prove a failed command wrote nothing.
fn all_keys(redis: &RedisServer) -> Vec<String> {
    redis.client().keys("*").unwrap()
}

#[test]
fn schedule_in_and_at_with_payloads() {
    let redis = RedisServer::start();
    let before = now_ms();
    let out =
        hourglass(Some(&redis), &["schedule", "order.timeout", "o-1", "--in", "15m", "--payload", "{\"order_id\":1}"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("scheduled order.timeout/o-1"));
    let mut conn = redis.client();
    let score: i64 = conn.zscore("hourglass:{order.timeout}:due", "o-1").unwrap();
    assert!(score >= before + 15 * 60_000 && score <= now_ms() + 15 * 60_000);
    let body: String = conn.hget("hourglass:{order.timeout}:payload", "o-1").unwrap();
    assert_eq!(body, "{\"order_id\":1}");

    let out = hourglass(Some(&redis), &["schedule", "article.publish", "a-9", "--at", "2030-01-01T07:00:00+01:00"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let score: i64 = conn.zscore("hourglass:{article.publish}:due", "a-9").unwrap();
    assert_eq!(score, 1_893_477_600_000);

    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), [0u8, 159, 146, 150]).unwrap();
    let path = file.path().to_str().unwrap();
    let out = hourglass(Some(&redis), &["schedule", "bin", "b", "--at", "1700000000000", "--payload-file", path]);
    assert!(out.status.success(), "{}", stderr(&out));
    let body: Vec<u8> = conn.hget("hourglass:{bin}:payload", "b").unwrap();
    assert_eq!(body, [0u8, 159, 146, 150]);
}

#[test]
fn schedule_dedupe_and_debounce_flags_keep_or_move_the_due_time() {
    let redis = RedisServer::start();
    let mut conn = redis.client();
    let at = |ms: &str, flag: &[&str], payload: &str| {
        let mut args = vec!["schedule", "alarm", "dev-1", "--at", ms, "--payload", payload];
        args.extend_from_slice(flag);
        let out = hourglass(Some(&redis), &args);
        assert!(out.status.success(), "{}", stderr(&out));
        stdout(&out)
    };
    let due = |conn: &mut redis::Connection| -> i64 { conn.zscore("hourglass:{alarm}:due", "dev-1").unwrap() };
    let body = |conn: &mut redis::Connection| -> String { conn.hget("hourglass:{alarm}:payload", "dev-1").unwrap() };
    assert!(at("2000000000000", &["--if-absent"], "first").starts_with("scheduled"));
    // --if-absent keeps the first schedule, payload included.
    assert!(at("2000000005000", &["--if-absent"], "second").starts_with("kept alarm/dev-1 as it was"));
    assert_eq!((due(&mut conn), body(&mut conn)), (2_000_000_000_000, "first".to_owned()));
    // --only-later: a heartbeat can only postpone the alarm.
    assert!(at("1999999999000", &["--only-later"], "earlier").starts_with("kept"));
    assert!(at("2000000009000", &["--only-later"], "later").starts_with("scheduled"));
    assert_eq!((due(&mut conn), body(&mut conn)), (2_000_000_009_000, "later".to_owned()));
    // --only-earlier: only brings it forward.
    assert!(at("2000000010000", &["--only-earlier"], "x").starts_with("kept"));
    assert!(at("2000000001000", &["--only-earlier"], "sooner").starts_with("scheduled"));
    assert_eq!(due(&mut conn), 2_000_000_001_000);
    // Without a flag it is an upsert; two flags at once are refused.
    at("2000000002000", &[], "upsert");
    assert_eq!(due(&mut conn), 2_000_000_002_000);
    let out = hourglass(Some(&redis), &["schedule", "alarm", "dev-1", "--in", "1s", "--if-absent", "--only-later"]);
    assert_eq!(out.status.code(), Some(2));
    // --wait-replicas on a server without replicas: fewer than asked acknowledge, exit 1.
    let out = hourglass(
        Some(&redis),
        &["schedule", "alarm", "dev-2", "--in", "1h", "--wait-replicas", "1", "--wait-timeout", "100ms"],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("only 0 of 1 replicas acknowledged the write within 100ms"), "{}", stderr(&out));
}

#[test]
fn cancel_stats_and_dead_commands() {
    let redis = RedisServer::start();
    assert!(hourglass(Some(&redis), &["schedule", "t", "a", "--in", "1h"]).status.success());
    assert!(hourglass(Some(&redis), &["schedule", "t", "b", "--at", "1000"]).status.success());
    let out = hourglass(Some(&redis), &["stats", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["t"]["due_now"], 1);
    assert_eq!(json["t"]["scheduled_later"], 1);
    let table = stdout(&hourglass(Some(&redis), &["stats"]));
    assert!(table.contains("DUE-NOW") && table.lines().any(|l| l.starts_with("t ")), "{table}");

    let out = hourglass(Some(&redis), &["cancel", "t", "a"]);
    assert!(out.status.success());
    let out = hourglass(Some(&redis), &["cancel", "t", "a"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("t/a is neither scheduled nor running"), "{}", stderr(&out));

    // Make a dead task the way the host does, then list, requeue and purge it.
    let mut conn = redis.client();
    let _: () = conn.zrem("hourglass:{t}:due", "b").unwrap();
    let _: () = conn.zadd("hourglass:{t}:dead", "b", now_ms()).unwrap();
    let _: () = conn.hset("hourglass:{t}:errors", "b", "boom").unwrap();
    let out = hourglass(Some(&redis), &["dead", "list", "t"]);
    assert!(stdout(&out).contains("boom"), "{}", stdout(&out));
    let out = hourglass(Some(&redis), &["dead", "requeue", "t", "b"]);
    assert!(stdout(&out).contains("re-queued 1"), "{}", stdout(&out));
    assert!(conn.zscore::<_, _, Option<i64>>("hourglass:{t}:due", "b").unwrap().is_some());
    let _: () = conn.zrem("hourglass:{t}:due", "b").unwrap();
    let _: () = conn.zadd("hourglass:{t}:dead", "b", now_ms()).unwrap();
    let out = hourglass(Some(&redis), &["dead", "purge", "t"]);
    assert!(stdout(&out).contains("purged 1"), "{}", stdout(&out));
    assert_eq!(conn.zcard::<_, usize>("hourglass:{t}:dead").unwrap(), 0);
}

#[test]
fn bad_input_gets_one_line_error_nonzero_exit_and_writes_nothing() {
    let redis = RedisServer::start();
    let cases: &[(&[&str], &str)] = &[
        (&["schedule", "t", "1", "--in", "1s", "--frobnicate"], "--frobnicate"),
        (&["schedule", "Bad Type", "1", "--in", "1s"], "invalid task type"),
        (&["schedule", "t", "1", "--at", "next tuesday"], "next tuesday"),
        (&["schedule", "t", "1", "--in", "soonish"], "soonish"),
        (&["schedule", "t", "1"], "--at"),
        (&["schedule", "t", "1", "--in", "1s", "--payload-file", "/nonexistent/p"], "/nonexistent/p"),
        (&["--config", "/nonexistent/runner.toml", "schedule", "t", "1", "--in", "1s"], "/nonexistent/runner.toml"),
        (&["dead", "list", "UPPER"], "invalid task type"),
        (&["plugin", "check", "/nonexistent/x.wasm"], "/nonexistent/x.wasm"),
    ];
    for (args, culprit) in cases {
        let out = hourglass(Some(&redis), args);
        let err = stderr(&out);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(err.contains(culprit), "{args:?}: error does not name {culprit:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: not one line: {err}");
    }
    assert!(all_keys(&redis).is_empty(), "a failed command wrote to Redis");
}

#[test]
fn unreachable_redis_is_a_clear_error() {
    let out = hourglass(None, &["--redis", "redis://127.0.0.1:1", "schedule", "t", "1", "--in", "1s"]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("redis://127.0.0.1:1"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
}

#[test]
fn bad_config_names_file_key_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runner.toml");
    std::fs::write(&path, "[runner]\nconcurency = 4\n").unwrap();
    let out = hourglass(None, &["--config", path.to_str().unwrap(), "stats"]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("runner.toml:2") && err.contains("concurency"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
}

#[test]
fn an_instance_pool_too_large_to_reserve_names_the_setting() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runner.toml");
    // 100,000 instances would reserve far more address space than a 64-bit process has.
    std::fs::write(&path, "[runner]\nconcurrency = 100000\n").unwrap();
    let plugins = dir.path().to_str().unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hourglass"));
    cmd.env_remove("HOURGLASS_REDIS_URL").env("HOURGLASS_LOG", "error").current_dir(dir.path());
    let out = cmd
        .args(["--redis", &redis.url(), "--config", path.to_str().unwrap(), "run", "--plugins", plugins])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("pool of 100000 instances") && err.contains("runner.concurrency"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
}

#[test]
fn env_redis_url_is_used_and_flag_wins() {
    let redis = RedisServer::start();
    let out = Command::new(env!("CARGO_BIN_EXE_hourglass"))
        .env("HOURGLASS_REDIS_URL", redis.url())
        .current_dir(std::env::temp_dir())
        .args(["schedule", "t", "env", "--in", "1h"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let mut conn = redis.client();
    assert!(conn.zscore::<_, _, Option<i64>>("hourglass:{t}:due", "env").unwrap().is_some());
    let out = Command::new(env!("CARGO_BIN_EXE_hourglass"))
        .env("HOURGLASS_REDIS_URL", "redis://127.0.0.1:1")
        .current_dir(std::env::temp_dir())
        .args(["--redis", &redis.url(), "cancel", "t", "env"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn show_tells_where_a_task_is() {
    let redis = RedisServer::start();
    let mut conn = redis.client();
    let show = |args: &[&str]| {
        let mut all = vec!["show"];
        all.extend_from_slice(args);
        hourglass(Some(&redis), &all)
    };

    // Scheduled, with a text payload.
    assert!(
        hourglass(Some(&redis), &["schedule", "t", "later", "--in", "1h", "--payload", "{\"order_id\": 42}"])
            .status
            .success()
    );
    let out = show(&["t", "later"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.starts_with("t/later: scheduled for 20") && text.contains(" (in "), "{text}");
    assert!(text.contains("payload: 16 bytes, text: {\"order_id\": 42}\n"), "{text}");
    assert!(text.contains("attempts so far: 0"), "{text}");

    // Due and waiting (no host serves t), with a long payload cut to 200 characters.
    let long = "x".repeat(1000);
    assert!(
        hourglass(Some(&redis), &["schedule", "t", "waiting", "--at", "1700000000000", "--payload", &long])
            .status
            .success()
    );
    let text = stdout(&show(&["t", "waiting"]));
    assert!(text.contains("due since 2023-11-14T22:13:20Z") && text.contains("waiting for a host"), "{text}");
    assert!(text.contains(&format!("1000 bytes, text: {} …", "x".repeat(200))), "{text}");

    // Running: leased as a claim leaves it (attempt 2 of a task that failed once), to host h-1.
    let until = now_ms() + 30_000;
    let _: () = conn.zadd("hourglass:{t}:leases", "busy", until).unwrap();
    let _: () = conn.hset("hourglass:{t}:tokens", "busy", "7:2@h-1").unwrap();
    let _: () = conn.hset("hourglass:{t}:attempts", "busy", 1).unwrap();
    let _: () = conn.hset("hourglass:{t}:errors", "busy", "smtp down").unwrap();
    let text = stdout(&show(&["t", "busy"]));
    assert!(text.starts_with("t/busy: running on host h-1, attempt 2, lease until "), "{text}");
    assert!(text.contains("attempts so far: 1 ended") && text.contains("last error: smtp down"), "{text}");
    assert!(text.contains("payload: none"), "{text}");
    let json: serde_json::Value = serde_json::from_slice(&show(&["t", "busy", "--json"]).stdout).unwrap();
    assert_eq!(json["state"], "running");
    assert_eq!(json["running"]["host"], "h-1");
    assert_eq!(json["running"]["attempt"], 2);
    assert_eq!(json["running"]["lease_until_ms"], until);
    assert_eq!(json["last_error"], "smtp down");

    // Dead, with a binary id and a binary payload: --id-hex finds it, the payload is shown as hex.
    let id: &[u8] = &[0xff, 0x00, b'k'];
    let _: () = conn.zadd("hourglass:{t}:dead", id, 1_700_000_000_000i64).unwrap();
    let _: () = conn.hset("hourglass:{t}:errors", id, "permanent: bad card").unwrap();
    let _: () = conn.hset("hourglass:{t}:attempts", id, 5).unwrap();
    let _: () = conn.hset("hourglass:{t}:payload", id, &[0u8, 1, 2, 250][..]).unwrap();
    let out = show(&["t", "--id-hex", "ff006b"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("dead since 2023-11-14T22:13:20Z"), "{text}");
    assert!(text.contains("attempts so far: 5") && text.contains("last error: permanent: bad card"), "{text}");
    assert!(text.contains("payload: 4 bytes, binary: 000102fa\n"), "{text}");
    let json: serde_json::Value = serde_json::from_slice(&show(&["t", "--id-hex", "ff006b", "--json"]).stdout).unwrap();
    assert_eq!(
        (json["state"].as_str(), json["id_hex"].as_str(), json["died_ms"].as_i64()),
        (Some("dead"), Some("ff006b"), Some(1_700_000_000_000))
    );
    assert_eq!(json["payload"]["hex"], "000102fa");

    // Unknown: says so, exits 1, and the JSON says so too.
    let out = show(&["t", "nowhere"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stdout(&out).contains("t/nowhere: unknown"), "{}", stdout(&out));
    let out = show(&["t", "nowhere", "--json"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()["state"], "unknown");

    // Bad input: one line naming the culprit; a key of the wrong type is named with its fix.
    let out = show(&["t", "--id-hex", "zz"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("zz"), "{}", stderr(&out));
    assert_eq!(show(&["t"]).status.code(), Some(2), "an id is needed");
    let _: () = conn.set("hourglass:{broken}:dead", "oops").unwrap();
    let out = show(&["broken", "x"]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("hourglass:{broken}:dead holds a string"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
}

/// The `runner.toml` block of a ConfigMap in a manifest: the lines under
/// `  runner.toml: |`, indented four spaces (a YAML literal block).
fn configmap_runner_toml(manifest: &str) -> String {
    let mut lines = manifest.lines().skip_while(|l| l.trim_end() != "  runner.toml: |").skip(1);
    let mut out = String::new();
    for line in lines.by_ref() {
        if !line.trim().is_empty() && !line.starts_with("    ") {
            break;
        }
        out.push_str(line.strip_prefix("    ").unwrap_or(""));
        out.push('\n');
    }
    out
}

#[test]
fn the_kubernetes_configmap_parses_with_the_hosts_own_parser() {
    let path = crate::support::workspace_root().join("deploy/hourglass.yaml");
    let manifest = std::fs::read_to_string(&path).unwrap();
    let text = configmap_runner_toml(&manifest);
    assert!(text.contains("[admin]"), "no runner.toml block found in {}", path.display());
    let config = hourglass::config::Config::parse(&text, "deploy/hourglass.yaml runner.toml")
        .unwrap_or_else(|e| panic!("{e:#}"));
    // What the Deployment relies on: probes and scrapes on 9090 of the pod IP, a
    // drain that ends before the kubelet's SIGKILL, folders on the mounted volumes.
    assert!(config.admin.enabled && config.admin.listen.port() == 9090 && !config.admin.listen.ip().is_loopback());
    assert!(manifest.contains("containerPort: 9090"));
    let kill_after: u64 = manifest
        .lines()
        .find_map(|l| l.trim().strip_prefix("terminationGracePeriodSeconds: "))
        .and_then(|v| v.parse().ok())
        .expect("terminationGracePeriodSeconds");
    assert!(
        config.runner.grace_period < std::time::Duration::from_secs(kill_after),
        "grace_period must end before SIGKILL"
    );
    assert!(!config.redis.managed);
    for dir in [&config.runner.plugins_dir, &config.runner.cache_dir] {
        assert!(
            manifest.contains(&format!("mountPath: {}", dir.display())),
            "{} is not a mounted volume",
            dir.display()
        );
    }
    // The parser is the one that refuses unknown keys: a typo in the block would fail here.
    let typo = text.replace("grace_period", "grace_periode");
    assert!(hourglass::config::Config::parse(&typo, "x").is_err());
}

#[test]
fn plugin_check_reports_what_compiling_took_and_refuses_what_the_limits_refuse() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("runner.toml");
    std::fs::write(
        &config,
        "[runner]\ncache_dir = \"cache\"\ncompile_memory_limit = \"256MiB\"\nmax_plugin_size = \"2MiB\"\n",
    )
    .unwrap();
    let config = config.to_str().unwrap();
    let noop = crate::support::plugin("noop");
    let check = |file: &str| hourglass(None, &["--config", config, "plugin", "check", file]);

    let out = check(noop.to_str().unwrap());
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let line = text.lines().find(|l| l.starts_with("compile:")).unwrap_or_else(|| panic!("no compile line:\n{text}"));
    assert!(line.contains("of CPU), peak ") && line.contains("limits 256 MiB (compile_memory_limit)"), "{line}");
    let again = stdout(&check(noop.to_str().unwrap()));
    assert!(again.contains("compile: from the cache (compiled before)"), "{again}");
    // What a run costs, reset, new and warm, measured (issue 51): three positive figures, no failures.
    let cost = again.lines().find(|l| l.starts_with("cost:")).unwrap_or_else(|| panic!("no cost line:\n{again}"));
    let figures: Vec<f64> = cost.split_whitespace().filter_map(|w| w.parse().ok()).collect();
    assert!(
        cost.contains("kept instance reset") && cost.contains("new instance") && cost.contains("warm one"),
        "{cost}"
    );
    assert!(!cost.contains("failed"), "{cost}");
    assert!(figures.len() >= 3 && figures.iter().take(3).all(|f| *f > 0.0), "{cost}");
    // A payload the plugin fails on is said, with the flag that changes it (a cache of its own:
    // the assertions below count this one's files).
    let other = tempfile::tempdir().unwrap();
    let other_config = other.path().join("runner.toml");
    std::fs::write(&other_config, "[runner]\ncache_dir = \"cache\"\n").unwrap();
    let chaos = crate::support::test_plugin("chaos");
    let args = ["--config", other_config.to_str().unwrap(), "plugin", "check", chaos.to_str().unwrap()];
    let out = hourglass(None, &[&args[..], &["--payload", "error:no"]].concat());
    assert!(stdout(&out).contains("600 of 600 runs failed with this payload (--payload sets it)"), "{}", stdout(&out));

    let bomb = dir.path().join("bomb.wasm");
    std::fs::write(&bomb, crate::support::compile_bomb(1, 20_000, 400, 300)).unwrap();
    let out = check(bomb.to_str().unwrap());
    assert!(!out.status.success());
    let err = stderr(&out);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("bomb.wasm: compile exceeded 256 MiB (compile_memory_limit)"), "{err}");

    let huge = dir.path().join("huge.wasm");
    std::fs::write(&huge, vec![0u8; 3 << 20]).unwrap();
    let err = stderr(&check(huge.to_str().unwrap()));
    assert!(err.contains("huge.wasm: plugin file of 3 MiB is over max_plugin_size = 2 MiB"), "{err}");
    let left: Vec<_> = dir.path().join("cache").read_dir().unwrap().flatten().map(|e| e.file_name()).collect();
    assert_eq!(left.len(), 1, "the refused compiles left files in the cache: {left:?}");
}

/// `hourglass bench ...` runs `hourglass-bench` from beside the binary, with the
/// config file and Redis URL it was given; without it, one line says how to build it.
#[test]
fn bench_runs_hourglass_bench_from_beside_the_binary() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let exe = dir.path().join("hourglass");
    std::fs::copy(env!("CARGO_BIN_EXE_hourglass"), &exe).unwrap();
    let config = dir.path().join("runner.toml");
    std::fs::write(&config, "").unwrap();
    // A file just written is "busy" to exec while a child that another test
    // thread forked meanwhile still holds its descriptor (until that child's
    // own exec, a moment later): try again then.
    let run = |args: &[&str]| {
        for _ in 0..100 {
            match Command::new(&exe).env_remove("HOURGLASS_REDIS_URL").current_dir(dir.path()).args(args).output() {
                Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy => {
                    std::thread::sleep(std::time::Duration::from_millis(20))
                }
                out => return out.unwrap(),
            }
        }
        panic!("{} stayed busy", exe.display())
    };

    let missing = run(&["bench", "burst"]);
    assert!(!missing.status.success());
    let err = stderr(&missing);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("cargo build --release -p hourglass-bench"), "{err}");

    let fake = dir.path().join("hourglass-bench");
    std::fs::write(&fake, "#!/bin/sh\necho \"forwarded: $*\"\n").unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out =
        run(&["--config", config.to_str().unwrap(), "--redis", "redis://127.0.0.1:1", "bench", "burst", "--help"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stdout(&out).trim(),
        format!("forwarded: --config {} --redis redis://127.0.0.1:1 burst --help", config.display())
    );
}

/// A master on a TCP port and one sentinel watching it (`requirepass` set
/// on the sentinel): the bad Sentinel settings are refused at start, one line each.
#[test]
fn bad_sentinel_settings_are_one_line_errors_at_start() {
    use hourglass::redis_server::{RedisServer as Spawned, ServerSpec};
    let dir = tempfile::tempdir().unwrap();
    let (master_port, sentinel_port, nobody) =
        (crate::support::free_port(), crate::support::free_port(), crate::support::free_port());
    let master = ServerSpec { dir: dir.path().to_owned(), port: Some(master_port), ..Default::default() };
    let _master = Spawned::spawn_ready(master, "the test", std::time::Duration::from_secs(10)).unwrap();
    let conf = dir.path().join("sentinel.conf");
    std::fs::write(
        &conf,
        format!(
            "port {sentinel_port}\nbind 127.0.0.1\ndir \"{}\"\nrequirepass s3cret-sentinel\n\
             sentinel monitor mymaster 127.0.0.1 {master_port} 1\n",
            dir.path().display()
        ),
    )
    .unwrap();
    let mut sentinel =
        Command::new("redis-server").arg(&conf).arg("--sentinel").stdout(std::process::Stdio::null()).spawn().unwrap();
    let url = |auth: &str, port: u16, name: &str| format!("redis+sentinel://{auth}127.0.0.1:{port}/{name}");
    // The good settings first: the sentinel answers (and names the master) once it is up.
    crate::support::wait_for("the sentinel to name the master", std::time::Duration::from_secs(30), || {
        let out = hourglass(None, &["--redis", &url(":s3cret-sentinel@", sentinel_port, "mymaster"), "stats"]);
        out.status.success().then_some(())
    });
    for (auth, port, name, says) in [
        (":s3cret-sentinel@", sentinel_port, "mymastr", "no sentinel names a reachable master 'mymastr'"),
        (":wrong-password@", sentinel_port, "mymaster", "a sentinel refused the credentials"),
        ("", nobody, "mymaster", "cannot find the Redis master 'mymaster' of Sentinel redis://127.0.0.1:"),
    ] {
        let out = hourglass(None, &["--redis", &url(auth, port, name), "stats"]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{name} {auth}: {err}");
        assert!(err.contains(says), "{name} {auth}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "not one line: {err}");
        assert!(!err.contains("s3cret") && !err.contains("wrong-password"), "a password shows: {err}");
    }
    // The runner refuses to start the same way, before it serves anything.
    let out = hourglass(None, &["--redis", &url(":wrong-password@", sentinel_port, "mymaster"), "run"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let _ = sentinel.kill();
    let _ = sentinel.wait();
}
