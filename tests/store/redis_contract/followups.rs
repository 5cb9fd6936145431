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

/// `cmdstat_evalsha`'s calls since the last `CONFIG RESETSTAT`.
fn evalsha_calls(c: &mut redis::Connection) -> u64 {
    let info: String = redis::cmd("INFO").arg("commandstats").query(c).unwrap();
    let line = info.lines().find(|l| l.starts_with("cmdstat_evalsha:")).unwrap_or("");
    line.split([':', ',']).find_map(|part| part.strip_prefix("calls=").map(|n| n.parse().unwrap())).unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn followups_are_delivered_a_batch_per_target_and_a_broken_marker_holds_back_only_its_entry() {
    let server = RedisServer::start();
    let mut c = server.client();
    let s = store(&server).await;
    let src = ty("fan");
    let now = redis_now(&mut c);
    let outbox = key("fan", "outbox");
    let followup = |target: &str, id: String, replace: bool| FollowUp {
        task_type: ty(target),
        payload: format!("body of {id}").into_bytes(),
        id: id.into_bytes(),
        due_ms: now + 1000,
        replace,
    };
    // 450 follow-ups into one type and 10 create-only ones into another, one of which finds its id waiting.
    for i in 0..450 {
        let f = followup("inv", format!("i{i}"), true);
        let _: () = c.hset(&outbox, format!("fan:1:{i}"), encode_followup(&f)).unwrap();
    }
    for i in 0..10 {
        let f = followup("mail", format!("m{i}"), false);
        let _: () = c.hset(&outbox, format!("fan:2:{i}:create"), encode_followup(&f)).unwrap();
    }
    let _: () = c.zadd(key("mail", "due"), "m3", now + 60_000).unwrap();
    let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query(&mut c).unwrap();

    let flushed = s.flush_outbox(&src).await.unwrap();
    assert_eq!(flushed.moved, 460);
    assert!(flushed.failed.is_empty(), "{:?}", flushed.failed);
    assert_eq!(flushed.kept_existing, vec![(ty("mail"), b"m3".to_vec())]);
    // 450 entries cut at 200 per call, and one call for the 10 of the other type: 4, and a few
    // more where HSCAN's pages cut a batch (a call per entry would be 460).
    let calls = evalsha_calls(&mut c);
    assert!((4..=8).contains(&calls), "{calls} deliver.lua calls: one per target, batch and page");
    for i in 0..450 {
        let id = format!("i{i}");
        assert_eq!(zscore(&mut c, &key("inv", "due"), id.as_bytes()), Some(now + 1000), "{id}");
        assert_eq!(hget(&mut c, &key("inv", "payload"), id.as_bytes()), Some(format!("body of {id}").into_bytes()));
    }
    assert_eq!(zscore(&mut c, &key("mail", "due"), b"m3"), Some(now + 60_000), "create-only kept the waiting one");
    assert_eq!(zscore(&mut c, &key("mail", "due"), b"m4"), Some(now + 1000));
    let left: usize = c.hlen(&outbox).unwrap();
    assert_eq!(left, 0);

    // One entry's marker holds the wrong type: its batch is refused whole, then tried entry by
    // entry, so only that entry waits in the outbox; fixed, it is delivered at the next pass.
    for i in 0..20 {
        let f = followup("inv", format!("j{i}"), true);
        let _: () = c.hset(&outbox, format!("fan:3:{i}"), encode_followup(&f)).unwrap();
    }
    let bad_marker = "hourglass:{inv}:delivered:fan:3:7";
    let _: () = c.hset(bad_marker, "x", "y").unwrap();
    let flushed = s.flush_outbox(&src).await.unwrap();
    assert_eq!(flushed.moved, 19);
    assert_eq!(flushed.failed.len(), 1, "{:?}", flushed.failed);
    assert!(format!("{:#}", flushed.failed[0].1).contains(bad_marker), "{:#}", flushed.failed[0].1);
    let waiting: Vec<String> = c.hkeys(&outbox).unwrap();
    assert_eq!(waiting, vec!["fan:3:7".to_string()]);
    assert_eq!(zscore(&mut c, &key("inv", "due"), b"j7"), None);
    assert_eq!(zscore(&mut c, &key("inv", "due"), b"j8"), Some(now + 1000));
    let _: () = c.del(bad_marker).unwrap();
    assert_eq!(s.flush_outbox(&src).await.unwrap().moved, 1);
    assert_eq!(zscore(&mut c, &key("inv", "due"), b"j7"), Some(now + 1000));
}
