//! Scheduling in batches: `Store::schedule_many` (one `schedule_batch.lua` call per type and batch) writes each task as `schedule` would.

use super::{hget, zscore};
use crate::support::{RedisServer, key, store, ty};
use hourglass_store::{NewTask, ScheduleMode};
use redis::Commands;

fn task(t: &str, id: &str, due_ms: i64, payload: Option<&str>, mode: ScheduleMode) -> NewTask {
    NewTask { task_type: ty(t), id: id.into(), due_ms, payload: payload.map(|p| p.as_bytes().to_vec()), mode }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_batch_writes_each_task_as_schedule_would_in_order() {
    let server = RedisServer::start();
    let mut c = server.client();
    let s = store(&server).await;
    // More than one batch of one type, and a second type beside it.
    let mut tasks: Vec<NewTask> = (0..2500)
        .map(|i| task("bulk", &format!("t-{i}"), 1_000 + i, Some(&format!("p{i}")), ScheduleMode::Upsert))
        .collect();
    // Each mode against a task written earlier in the same call (t-1: the same batch; t-2400: the last batch).
    tasks.push(task("bulk", "t-1", 5, Some("new"), ScheduleMode::IfAbsent));
    tasks.push(task("bulk", "t-2", 9_000_000, Some("later"), ScheduleMode::OnlyLater));
    tasks.push(task("bulk", "t-3", 9_000_000, Some("x"), ScheduleMode::OnlyEarlier));
    tasks.push(task("bulk", "t-2400", 1, None, ScheduleMode::OnlyEarlier));
    tasks.push(task("bulk", "t-5", 3, Some("y"), ScheduleMode::OnlyLater));
    tasks.push(task("other", "o", 7, Some("o"), ScheduleMode::Upsert));
    tasks.push(task("other", "o", 8, None, ScheduleMode::Upsert));
    let written = s.schedule_many(&tasks).await.unwrap();
    assert_eq!(written.len(), 2507);
    assert!(written[..2500].iter().all(|w| *w), "every upsert is written");
    assert_eq!(&written[2500..], &[false, true, false, true, false, true, true]);
    let due = key("bulk", "due");
    let payload = key("bulk", "payload");
    let card: usize = c.zcard(&due).unwrap();
    assert_eq!(card, 2500);
    // if-absent kept the first schedule and its payload.
    assert_eq!((zscore(&mut c, &due, b"t-1"), hget(&mut c, &payload, b"t-1")), (Some(1_001), Some(b"p1".to_vec())));
    // only-later moved it, and its payload with it.
    assert_eq!(
        (zscore(&mut c, &due, b"t-2"), hget(&mut c, &payload, b"t-2")),
        (Some(9_000_000), Some(b"later".to_vec()))
    );
    // only-earlier kept a sooner one untouched.
    assert_eq!((zscore(&mut c, &due, b"t-3"), hget(&mut c, &payload, b"t-3")), (Some(1_003), Some(b"p3".to_vec())));
    // only-earlier written without a payload drops the stored one, as schedule does.
    assert_eq!((zscore(&mut c, &due, b"t-2400"), hget(&mut c, &payload, b"t-2400")), (Some(1), None));
    // only-later with a sooner time changes nothing.
    assert_eq!((zscore(&mut c, &due, b"t-5"), hget(&mut c, &payload, b"t-5")), (Some(1_005), Some(b"p5".to_vec())));
    // The same id twice in one batch ends as the second left it.
    assert_eq!(
        (zscore(&mut c, &key("other", "due"), b"o"), hget(&mut c, &key("other", "payload"), b"o")),
        (Some(8), None)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_batch_that_cannot_be_written_whole_writes_nothing() {
    let server = RedisServer::start();
    let mut c = server.client();
    let s = store(&server).await;
    // Bad data in the type's keys: the batch is refused with the fault, naming its first task.
    let _: () = c.set(key("broken", "due"), "oops").unwrap();
    let tasks =
        [task("broken", "a", 1, Some("x"), ScheduleMode::Upsert), task("broken", "b", 2, None, ScheduleMode::Upsert)];
    let err = format!("{:#}", s.schedule_many(&tasks).await.unwrap_err());
    assert!(err.contains("tasks[0]") && err.contains("holds a string, not a zset"), "{err}");
    let exists: bool = c.exists(key("broken", "payload")).unwrap();
    assert!(!exists, "nothing of the batch was written");
    // Bad arguments sent by hand (a client of its own): every task is checked before the first write.
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/scripts");
    let source = ["prelude.lua", "schedule_batch.lua"].map(|f| std::fs::read_to_string(root.join(f)).unwrap()).concat();
    let (due, payload) = (key("hand", "due"), key("hand", "payload"));
    for (args, why) in [
        (vec!["a", "5", "p", "upsert", "b", "5x", "p", "upsert"], "task 1: due time \"5x\" is not whole milliseconds"),
        (vec!["a", "5", "p", "upsert", "b", "6", "p", "sometimes"], "task 1: unknown mode \"sometimes\""),
        (vec!["a", "5", "p"], "four values per task"),
    ] {
        let err =
            redis::cmd("EVAL").arg(&source).arg(2).arg(&due).arg(&payload).arg(&args).query::<redis::Value>(&mut c);
        let err = err.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains(why), "{args:?}: {err}");
        let n: usize = c.exists(&[&due, &payload]).unwrap();
        assert_eq!(n, 0, "{args:?} wrote something");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn after_a_script_flush_the_batches_of_one_round_trip_are_sent_again_in_their_order() {
    let server = RedisServer::start();
    let mut c = server.client();
    let s = store(&server).await;
    s.schedule_many(&[task("warm", "w", 1, None, ScheduleMode::Upsert)]).await.unwrap();
    // Six batches of 200 (two round trips), every one refused NOSCRIPT at first.
    let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut c).unwrap();
    let mut tasks: Vec<NewTask> =
        (0..1199).map(|i| task("flushed", &format!("t-{i}"), 1_000 + i, None, ScheduleMode::Upsert)).collect();
    // In the fifth batch, against the first: run out of order, t-0 would end at 1000.
    tasks.insert(900, task("flushed", "t-0", 5, Some("sooner"), ScheduleMode::OnlyEarlier));
    let written = s.schedule_many(&tasks).await.unwrap();
    assert!(written.iter().all(|w| *w));
    let card: usize = c.zcard(key("flushed", "due")).unwrap();
    assert_eq!(card, 1199);
    assert_eq!(zscore(&mut c, &key("flushed", "due"), b"t-0"), Some(5));
    assert_eq!(hget(&mut c, &key("flushed", "payload"), b"t-0"), Some(b"sooner".to_vec()));
}
