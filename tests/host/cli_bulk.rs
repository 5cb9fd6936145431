//! `hourglass schedule-many` against a real redis-server: a JSON Lines file written in batches, each mode kept, and a bad line writing nothing.

use std::io::Write;
use std::process::{Command, Output, Stdio};

use crate::support::{RedisServer, now_ms};
use redis::Commands;

fn schedule_many(redis: &RedisServer, file: &str, stdin: Option<&str>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hourglass"));
    cmd.env_remove("HOURGLASS_REDIS_URL").current_dir(std::env::temp_dir());
    cmd.arg("--redis").arg(redis.url()).args(["schedule-many", file]);
    cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.unwrap_or("").as_bytes()).unwrap();
    drop(input);
    child.wait_with_output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn a_file_of_tasks_is_scheduled_with_each_lines_time_payload_and_mode() {
    let redis = RedisServer::start();
    let mut conn = redis.client();
    let _: () = conn.zadd("hourglass:{order.timeout}:due", "kept", 5).unwrap();
    let _: () = conn.hset("hourglass:{order.timeout}:payload", "kept", "first").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tasks.jsonl");
    let mut lines = String::new();
    // 450 tasks of one type (three script calls), and the other forms once each.
    for i in 0..450 {
        lines += &format!(
            "{{\"task_type\": \"bulk.many\", \"id\": \"t{i}\", \"at_ms\": {}, \"payload\": \"p{i}\"}}\n",
            1000 + i
        );
    }
    lines += "\n";
    lines +=
        r#"{"task_type": "order.timeout", "id": "o-1", "delay": "15m", "payload": {"order": 1,  "lines": [2, 3]}}"#;
    lines += "\n";
    lines += r#"{"task_type": "order.timeout", "id": "kept", "at_ms": 9, "payload": "second", "mode": "if-absent"}"#;
    lines += "\n";
    lines +=
        r#"{"task_type": "blob.scan", "id_hex": "00ff", "at": "2026-12-01T07:00:00+01:00", "payload_hex": "0001fe"}"#;
    lines += "\n";
    std::fs::write(&file, lines).unwrap();
    let before = now_ms();
    let out = schedule_many(&redis, file.to_str().unwrap(), None);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("scheduled 452 of 453 tasks"), "{}", text(&out.stdout));
    assert!(text(&out.stdout).contains("kept 1 as they were"), "{}", text(&out.stdout));

    let n: usize = conn.zcard("hourglass:{bulk.many}:due").unwrap();
    assert_eq!(n, 450);
    let score: i64 = conn.zscore("hourglass:{bulk.many}:due", "t449").unwrap();
    assert_eq!(score, 1449);
    let body: String = conn.hget("hourglass:{bulk.many}:payload", "t17").unwrap();
    assert_eq!(body, "p17", "a string payload is its text");
    let due: i64 = conn.zscore("hourglass:{order.timeout}:due", "o-1").unwrap();
    assert!(due >= before + 15 * 60_000 && due <= now_ms() + 15 * 60_000, "{due}");
    let body: String = conn.hget("hourglass:{order.timeout}:payload", "o-1").unwrap();
    assert_eq!(body, r#"{"order": 1,  "lines": [2, 3]}"#, "JSON is written as the file spells it");
    let kept: i64 = conn.zscore("hourglass:{order.timeout}:due", "kept").unwrap();
    let body: String = conn.hget("hourglass:{order.timeout}:payload", "kept").unwrap();
    assert_eq!((kept, body.as_str()), (5, "first"), "if-absent keeps the first schedule and its payload");
    let at: i64 = conn.zscore("hourglass:{blob.scan}:due", &[0u8, 0xff][..]).unwrap();
    assert_eq!(at, 1_796_104_800_000);
    let body: Vec<u8> = conn.hget("hourglass:{blob.scan}:payload", &[0u8, 0xff][..]).unwrap();
    assert_eq!(body, vec![0, 1, 0xfe]);

    // Standard input, with `-`.
    let out = schedule_many(&redis, "-", Some("{\"task_type\": \"from.stdin\", \"id\": \"s\"}\n"));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("scheduled 1 tasks from standard input"), "{}", text(&out.stdout));
    let due: Option<i64> = conn.zscore("hourglass:{from.stdin}:due", "s").unwrap();
    assert!(due.is_some_and(|d| d <= now_ms()), "no time: due now");
}

#[test]
fn a_bad_line_is_named_by_file_and_number_and_nothing_is_written() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tasks.jsonl");
    let good = "{\"task_type\": \"bulk.bad\", \"id\": \"ok\"}\n";
    let cases = [
        ("{\"task_type\": \"bulk.bad\", \"id\": \"x\", \"typ\": 1}", "unknown field `typ`"),
        ("{\"task_type\": \"Bad Type\", \"id\": \"x\"}", "task_type"),
        ("{\"task_type\": \"bulk.bad\", \"id\": \"x\", \"delay\": \"soonish\"}", "soonish"),
        ("{\"task_type\": \"bulk.bad\", \"id\": \"x\", \"mode\": \"nx\"}", "unknown mode"),
        ("not json", "expected"),
    ];
    for (bad, culprit) in cases {
        std::fs::write(&file, format!("{good}{good}{bad}\n{good}")).unwrap();
        let out = schedule_many(&redis, file.to_str().unwrap(), None);
        let err = text(&out.stderr);
        assert!(!out.status.success(), "{bad}: succeeded");
        assert!(err.contains("tasks.jsonl:3: "), "{bad}: the error does not name the line: {err}");
        assert!(err.contains(culprit), "{bad}: the error does not name {culprit:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{bad}: not one line: {err}");
    }
    let out = schedule_many(&redis, "/nonexistent/tasks.jsonl", None);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("/nonexistent/tasks.jsonl"), "{}", text(&out.stderr));
    let keys: Vec<String> = redis.client().keys("*").unwrap();
    assert!(keys.is_empty(), "a refused file wrote {keys:?}");
}
