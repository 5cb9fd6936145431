//! The `hourglass` command line against a real redis-server: happy paths and bad input.

mod support;

use std::process::{Command, Output};

use redis::Commands;
use support::{RedisServer, now_ms};

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
    assert!(stderr(&out).contains("not scheduled"));

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
    let out = cmd.args(["--redis", &redis.url(), "--config", path.to_str().unwrap(), "run", "--plugins", plugins]).output().unwrap();
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
