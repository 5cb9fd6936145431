//! The progress scripts against a real Redis: a report stored only while its lease holds, kept by a retry, dropped by every end.

use std::time::Duration;

use crate::support::{RedisServer, ack, key, redis_now, store, ty};
use hourglass_store::task::{ClaimedTask, Ended, Lease, Outcome, Progress, Settlement};
use hourglass_store::task_type::TaskType;
use hourglass_store::{ClaimLimits, ProgressReport, ProgressView, Store};
use redis::Commands;

fn report(task: &ClaimedTask, percent: u8) -> ProgressReport {
    ProgressReport {
        lease: task.lease(),
        attempt: task.attempt,
        progress: Progress { percent, detail: format!(r#"{{"done":{percent}}}"#) },
        at_ms: 1,
    }
}

fn stored(c: &mut redis::Connection, t: &str, id: &str) -> Option<ProgressView> {
    let raw: Option<Vec<u8>> = c.hget(key(t, "progress"), id).unwrap();
    raw.map(|r| ProgressView::parse(&r).expect("a stored value parses"))
}

async fn claim_one(s: &Store, t: &TaskType, c: &mut redis::Connection, id: &str) -> ClaimedTask {
    let now = redis_now(c);
    let _: () = c.zadd(key(t.as_str(), "due"), id, now - 1).unwrap();
    s.claim(t, &ClaimLimits::default()).await.unwrap().tasks.remove(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_report_is_stored_while_its_lease_holds_kept_by_a_retry_and_dropped_by_an_end() {
    let server = RedisServer::start();
    let mut c = server.client();
    let s = store(&server).await;
    let t = ty("job");

    let task = claim_one(&s, &t, &mut c, "a").await;
    assert_eq!(s.write_progress(&t, &[report(&task, 30)], Some(100)).await.unwrap(), 1);
    let view = stored(&mut c, "job", "a").unwrap();
    assert_eq!((view.percent, view.detail.as_deref(), view.attempt), (30, Some(r#"{"done":30}"#), 1));
    assert_eq!(s.show(&t, b"a").await.unwrap().progress, Some(view));
    let events: redis::streams::StreamRangeReply = c.xrange_all(key("job", "events")).unwrap();
    assert_eq!(events.ids.len(), 1);
    assert_eq!(events.ids[0].get::<String>("outcome").as_deref(), Some("progress"));

    // A report under a token that does not hold the task is fenced.
    let stale = ProgressReport { lease: Lease { token: task.token + 7, ..task.lease() }, ..report(&task, 90) };
    assert_eq!(s.write_progress(&t, &[stale], None).await.unwrap(), 0);
    assert_eq!(stored(&mut c, "job", "a").unwrap().percent, 30);

    // A retry keeps the task's progress, replaced by its run's last report.
    let last = Progress { percent: 55, detail: String::new() };
    let retry = Outcome::Retry { delay: Duration::ZERO, error: "e".into(), progress: Some(last) };
    let batch = [Settlement { lease: task.lease(), outcome: retry, run: Default::default() }];
    assert_eq!(s.settle(&t, &batch, None).await.unwrap().0, [Ended::Retried]);
    let view = stored(&mut c, "job", "a").unwrap();
    assert_eq!((view.percent, view.detail), (55, None));
    // A report the writer had not stored before the settle changes nothing now.
    assert_eq!(s.write_progress(&t, &[report(&task, 60)], None).await.unwrap(), 0);
    assert_eq!(stored(&mut c, "job", "a").unwrap().percent, 55);

    // The next attempt acks (a plain ack, sent as its claim's mask): the progress goes.
    let again = s.claim(&t, &ClaimLimits::default()).await.unwrap().tasks.remove(0);
    assert_eq!(again.attempt, 2);
    assert_eq!(s.write_progress(&t, &[report(&again, 80)], None).await.unwrap(), 1);
    assert_eq!(stored(&mut c, "job", "a").unwrap().attempt, 2);
    assert_eq!(s.settle(&t, &[ack(&again, vec![])], None).await.unwrap().0, [Ended::Succeeded]);
    assert_eq!(stored(&mut c, "job", "a"), None);

    // A dead letter drops it too, and so does an ack in full (with events).
    for (id, outcome) in [
        ("b", Outcome::Dead { error: "x".into() }),
        ("c", Outcome::Ack { followups: vec![], groups: vec![], graphs: vec![] }),
    ] {
        let task = claim_one(&s, &t, &mut c, id).await;
        assert_eq!(s.write_progress(&t, &[report(&task, 10)], None).await.unwrap(), 1);
        let batch = [Settlement { lease: task.lease(), outcome, run: Default::default() }];
        s.settle(&t, &batch, Some(100)).await.unwrap();
        assert_eq!(stored(&mut c, "job", id), None, "{id} kept its progress");
    }
    let left: usize = c.hlen(key("job", "progress")).unwrap();
    assert_eq!(left, 0);
}
