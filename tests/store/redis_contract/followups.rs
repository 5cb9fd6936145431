//! Follow-ups: delivered through the outbox exactly once; create-only ones leave existing tasks alone.

use crate::support::{RedisServer, ack, key, redis_now, store, ty};
use hourglass_store::task::{Ended, FollowUp};
use hourglass_store::{ClaimLimits, encode_followup};
use redis::Commands;

use super::{hget, ids, zscore};

#[tokio::test(flavor = "multi_thread")]
async fn followups_land_in_the_target_type_exactly_once() {
    let server = RedisServer::start();
    let mut c = server.client();
    let s = store(&server).await;
    let (src, dst) = (ty("order"), ty("invoice"));
    let now = redis_now(&mut c);
    let _: () = c.zadd(key("order", "due"), "o1", now - 1).unwrap();
    let task = s.claim(&src, &ClaimLimits::default()).await.unwrap().tasks.remove(0);

    let with_payload = FollowUp {
        task_type: dst.clone(),
        id: vec![1, 0, 2],
        payload: vec![0, 1, 2, b'\n'],
        due_ms: now + 5000,
        replace: true,
    };
    let without = FollowUp { task_type: dst.clone(), id: b"i2".to_vec(), payload: vec![], due_ms: now, replace: true };
    let _: () = c.hset(key("invoice", "payload"), "i2", "stale").unwrap();
    let r = s.settle(&src, &[ack(&task, vec![with_payload.clone(), without.clone()])], None).await.unwrap().0;
    assert_eq!(r, vec![Ended::Succeeded]);
    // The host moves the outbox on right after a settle that committed follow-ups.
    assert_eq!(s.flush_outbox(&src).await.unwrap().moved, 2);

    let dst_due = key("invoice", "due");
    let dst_payload = key("invoice", "payload");
    assert_eq!(zscore(&mut c, &dst_due, &with_payload.id), Some(now + 5000));
    assert_eq!(hget(&mut c, &dst_payload, &with_payload.id), Some(with_payload.payload.clone()));
    assert_eq!(zscore(&mut c, &dst_due, b"i2"), Some(now));
    assert_eq!(hget(&mut c, &dst_payload, b"i2"), None, "an empty follow-up payload clears the old one");
    let outbox: usize = c.hlen(key("order", "outbox")).unwrap();
    assert_eq!(outbox, 0);
    assert_eq!(s.flush_outbox(&src).await.unwrap().moved, 0, "a second flush finds nothing");

    // Crash between deliver and the outbox HDEL: the entry is still there and runs again.
    let f3 =
        FollowUp { task_type: dst.clone(), id: b"i3".to_vec(), payload: b"x".to_vec(), due_ms: now, replace: true };
    let _: () = c.hset(key("order", "outbox"), "order:999:0", encode_followup(&f3)).unwrap();
    assert_eq!(s.flush_outbox(&src).await.unwrap().moved, 1);
    assert_eq!(zscore(&mut c, &dst_due, b"i3"), Some(now));
    let _: () = c.zrem(&dst_due, "i3").unwrap(); // it ran and finished meanwhile
    let _: () = c.hset(key("order", "outbox"), "order:999:0", encode_followup(&f3)).unwrap();
    assert_eq!(s.flush_outbox(&src).await.unwrap().moved, 1, "the leftover entry is cleared");
    assert_eq!(zscore(&mut c, &dst_due, b"i3"), None, "but not delivered twice");
    let outbox: usize = c.hlen(key("order", "outbox")).unwrap();
    assert_eq!(outbox, 0);
    let ttl: i64 = c.pttl("hourglass:{invoice}:delivered:order:999:0").unwrap();
    assert!(ttl > 0 && ttl <= 86_400_000, "marker expires: {ttl}");

    let claimed = s.claim(&dst, &ClaimLimits::default()).await.unwrap().tasks;
    assert_eq!(ids(&claimed), vec![b"i2".to_vec()]);
}

#[tokio::test(flavor = "multi_thread")]
async fn create_only_followups_leave_waiting_and_dead_tasks_alone() {
    let server = RedisServer::start();
    let mut c = server.client();
    let s = store(&server).await;
    let (src, dst) = (ty("intruder"), ty("victim"));
    let now = redis_now(&mut c);
    let _: () = c.zadd(key("intruder", "due"), "run", now - 1).unwrap();
    let _: () = c.zadd(key("victim", "due"), "waiting", now + 60_000).unwrap();
    let _: () = c.hset(key("victim", "payload"), "waiting", "original").unwrap();
    let _: () = c.zadd(key("victim", "dead"), "died", now - 5).unwrap();
    let _: () = c.hset(key("victim", "payload"), "died", "evidence").unwrap();
    let task = s.claim(&src, &ClaimLimits::default()).await.unwrap().tasks.remove(0);

    let create = |id: &str| FollowUp {
        task_type: dst.clone(),
        id: id.as_bytes().to_vec(),
        payload: b"crafted".to_vec(),
        due_ms: now + 1,
        replace: false,
    };
    let batch = [ack(&task, vec![create("waiting"), create("died"), create("fresh")])];
    assert_eq!(s.settle(&src, &batch, None).await.unwrap().0, vec![Ended::Succeeded]);
    // Create-only is in the entry id, so a host of an older version delivers
    // it (as a replace) rather than dropping it in a rolling upgrade.
    let mut entries: Vec<String> = c.hkeys(key("intruder", "outbox")).unwrap();
    entries.sort();
    assert_eq!(entries.len(), 3);
    assert!(entries.iter().all(|e| e.ends_with(":create")), "{entries:?}");

    let flushed = s.flush_outbox(&src).await.unwrap();
    assert_eq!(flushed.moved, 3, "every entry is handled once");
    let mut kept: Vec<Vec<u8>> = flushed.kept_existing.iter().map(|(_, id)| id.clone()).collect();
    kept.sort();
    assert_eq!(kept, vec![b"died".to_vec(), b"waiting".to_vec()]);
    let due = key("victim", "due");
    assert_eq!(zscore(&mut c, &due, b"waiting"), Some(now + 60_000), "the waiting task keeps its time");
    assert_eq!(hget(&mut c, &key("victim", "payload"), b"waiting"), Some(b"original".to_vec()));
    assert_eq!(zscore(&mut c, &due, b"died"), None, "the dead task is not revived");
    assert_eq!(zscore(&mut c, &key("victim", "dead"), b"died"), Some(now - 5));
    assert_eq!(hget(&mut c, &key("victim", "payload"), b"died"), Some(b"evidence".to_vec()));
    assert_eq!(zscore(&mut c, &due, b"fresh"), Some(now + 1), "a new id is created");
    assert_eq!(hget(&mut c, &key("victim", "payload"), b"fresh"), Some(b"crafted".to_vec()));
    assert_eq!(s.flush_outbox(&src).await.unwrap().moved, 0, "nothing is left to retry");
}
