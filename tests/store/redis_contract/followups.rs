//! Follow-ups: delivered by the settle itself on one server, through the outbox exactly once otherwise; create-only ones leave existing tasks alone.

use crate::support::{RedisServer, ack, key, redis_now, store, ty};
use hourglass_store::task::{Ended, FollowUp};
use hourglass_store::{ClaimLimits, encode_followup};
use redis::Commands;

use super::{hget, ids, zscore};

#[tokio::test(flavor = "multi_thread")]
async fn on_one_server_the_settle_delivers_followups_itself() {
    let server = RedisServer::start();
    let mut c = server.client();
    let s = store(&server).await;
    let (src, dst) = (ty("order"), ty("invoice"));
    let now = redis_now(&mut c);
    let _: () = c.zadd(key("order", "due"), "o1", now - 1).unwrap();
    let _: () = c.hset(key("order", "payload"), "o1", "first run").unwrap();
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
    // The run also schedules its own id again, as a heartbeat or a poll does: the settle drops
    // the finished run's payload first, so the new one stays.
    let again = FollowUp {
        task_type: src.clone(),
        id: b"o1".to_vec(),
        payload: b"second run".to_vec(),
        due_ms: now + 60_000,
        replace: true,
    };
    // The same id twice in one run: the second wins, as it would through the outbox.
    let twice = |payload: &str| FollowUp {
        task_type: dst.clone(),
        id: b"i3".to_vec(),
        payload: payload.into(),
        due_ms: now + 60_000,
        replace: true,
    };
    // A payload then none, and none then one: the last one's stands (the settle writes them batched).
    let then = |id: &[u8], payload: &str| FollowUp { id: id.to_vec(), ..twice(payload) };
    let followups = vec![
        with_payload.clone(),
        without,
        again,
        twice("first"),
        twice("second"),
        then(b"i4", "dropped"),
        then(b"i4", ""),
        then(b"i5", ""),
        then(b"i5", "kept"),
    ];
    let (r, committed) = s.settle(&src, &[ack(&task, followups)], None).await.unwrap();
    assert_eq!(r, vec![Ended::Succeeded]);
    assert_eq!(committed.outboxed, 0, "nothing left for the outbox to move");
    assert!(committed.kept_existing.is_empty());

    let dst_due = key("invoice", "due");
    let dst_payload = key("invoice", "payload");
    assert_eq!(zscore(&mut c, &dst_due, &with_payload.id), Some(now + 5000));
    assert_eq!(hget(&mut c, &dst_payload, &with_payload.id), Some(with_payload.payload.clone()));
    assert_eq!(zscore(&mut c, &dst_due, b"i2"), Some(now));
    assert_eq!(hget(&mut c, &dst_payload, b"i2"), None, "an empty follow-up payload clears the old one");
    assert_eq!(hget(&mut c, &dst_payload, b"i3"), Some(b"second".to_vec()));
    assert_eq!(hget(&mut c, &dst_payload, b"i4"), None, "a later follow-up without a payload clears an earlier one's");
    assert_eq!(hget(&mut c, &dst_payload, b"i5"), Some(b"kept".to_vec()));
    assert_eq!(zscore(&mut c, &key("order", "due"), b"o1"), Some(now + 60_000));
    assert_eq!(hget(&mut c, &key("order", "payload"), b"o1"), Some(b"second run".to_vec()));
    let outbox: bool = c.exists(key("order", "outbox")).unwrap();
    assert!(!outbox, "no outbox entry was written");
    let markers: Vec<String> = c.keys("hourglass:{invoice}:delivered:*").unwrap();
    assert!(markers.is_empty(), "one atomic step needs no delivery markers: {markers:?}");
    assert_eq!(s.flush_outbox(&src).await.unwrap().moved, 0, "a flush finds nothing");

    let claimed = s.claim(&dst, &ClaimLimits::default()).await.unwrap().tasks;
    assert_eq!(ids(&claimed), vec![b"i2".to_vec()]);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_outbox_entry_is_delivered_exactly_once_even_after_a_crash_before_its_hdel() {
    let server = RedisServer::start();
    let mut c = server.client();
    let s = store(&server).await;
    let (src, dst) = (ty("order"), ty("invoice"));
    let now = redis_now(&mut c);
    let dst_due = key("invoice", "due");
    // An entry as a cluster's settle (or a fallback) leaves it: a flush delivers it.
    let f3 =
        FollowUp { task_type: dst.clone(), id: b"i3".to_vec(), payload: b"x".to_vec(), due_ms: now, replace: true };
    let _: () = c.hset(key("order", "outbox"), "order:999:0", encode_followup(&f3)).unwrap();
    assert_eq!(s.flush_outbox(&src).await.unwrap().moved, 1);
    assert_eq!(zscore(&mut c, &dst_due, b"i3"), Some(now));
    assert_eq!(hget(&mut c, &key("invoice", "payload"), b"i3"), Some(b"x".to_vec()));
    // A crash between deliver and the outbox HDEL: the entry is still there and runs again.
    let _: () = c.zrem(&dst_due, "i3").unwrap(); // it ran and finished meanwhile
    let _: () = c.hset(key("order", "outbox"), "order:999:0", encode_followup(&f3)).unwrap();
    assert_eq!(s.flush_outbox(&src).await.unwrap().moved, 1, "the leftover entry is cleared");
    assert_eq!(zscore(&mut c, &dst_due, b"i3"), None, "but not delivered twice");
    let outbox: usize = c.hlen(key("order", "outbox")).unwrap();
    assert_eq!(outbox, 0);
    let ttl: i64 = c.pttl("hourglass:{invoice}:delivered:order:999:0").unwrap();
    assert!(ttl > 0 && ttl <= 86_400_000, "marker expires: {ttl}");
    assert_eq!(s.flush_outbox(&src).await.unwrap().moved, 0, "a second flush finds nothing");
}

/// The victim's keys: a waiting task and a dead-lettered one, each with its payload.
fn victims(c: &mut redis::Connection, now: i64) {
    let _: () = c.zadd(key("victim", "due"), "waiting", now + 60_000).unwrap();
    let _: () = c.hset(key("victim", "payload"), "waiting", "original").unwrap();
    let _: () = c.zadd(key("victim", "dead"), "died", now - 5).unwrap();
    let _: () = c.hset(key("victim", "payload"), "died", "evidence").unwrap();
}

/// What `victims` left is as it was, and "fresh" was created.
fn victims_untouched(c: &mut redis::Connection, now: i64) {
    let due = key("victim", "due");
    assert_eq!(zscore(c, &due, b"waiting"), Some(now + 60_000), "the waiting task keeps its time");
    assert_eq!(hget(c, &key("victim", "payload"), b"waiting"), Some(b"original".to_vec()));
    assert_eq!(zscore(c, &due, b"died"), None, "the dead task is not revived");
    assert_eq!(zscore(c, &key("victim", "dead"), b"died"), Some(now - 5));
    assert_eq!(hget(c, &key("victim", "payload"), b"died"), Some(b"evidence".to_vec()));
    assert_eq!(zscore(c, &due, b"fresh"), Some(now + 1), "a new id is created");
    assert_eq!(hget(c, &key("victim", "payload"), b"fresh"), Some(b"crafted".to_vec()));
}

fn create_only(id: &str, now: i64) -> FollowUp {
    FollowUp {
        task_type: ty("victim"),
        id: id.as_bytes().to_vec(),
        payload: b"crafted".to_vec(),
        due_ms: now + 1,
        replace: false,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn create_only_followups_leave_waiting_and_dead_tasks_alone() {
    let server = RedisServer::start();
    let mut c = server.client();
    let s = store(&server).await;
    let src = ty("intruder");
    let now = redis_now(&mut c);
    let _: () = c.zadd(key("intruder", "due"), "run", now - 1).unwrap();
    victims(&mut c, now);
    let task = s.claim(&src, &ClaimLimits::default()).await.unwrap().tasks.remove(0);

    // "fresh" twice: the second finds the id the first created in the same settle.
    let again = FollowUp { payload: b"second".to_vec(), due_ms: now + 9, ..create_only("fresh", now) };
    let batch =
        [ack(&task, vec![create_only("waiting", now), create_only("died", now), create_only("fresh", now), again])];
    let (r, committed) = s.settle(&src, &batch, None).await.unwrap();
    assert_eq!(r, vec![Ended::Succeeded]);
    assert_eq!(committed.outboxed, 0);
    let mut kept = committed.kept_existing.clone();
    kept.sort();
    assert_eq!(
        kept,
        vec![(ty("victim"), b"died".to_vec()), (ty("victim"), b"fresh".to_vec()), (ty("victim"), b"waiting".to_vec())]
    );
    victims_untouched(&mut c, now);
    assert_eq!(hget(&mut c, &key("victim", "payload"), b"fresh"), Some(b"crafted".to_vec()), "the first one's payload");
}

/// A follow-up's target with a broken key does not hold back the settle:
/// the batch is settled again through the outbox, where the entries wait
/// until the key is fixed, and create-only ones keep their mode there.
#[tokio::test(flavor = "multi_thread")]
async fn a_broken_target_sends_the_settle_through_the_outbox() {
    let server = RedisServer::start();
    let mut c = server.client();
    let s = store(&server).await;
    let src = ty("intruder");
    let now = redis_now(&mut c);
    let _: () = c.zadd(key("intruder", "due"), "run", now - 1).unwrap();
    victims(&mut c, now);
    let broken = key("victim", "dead");
    let _: () = c.rename(&broken, "saved").unwrap();
    let _: () = c.set(&broken, "not a sorted set").unwrap();
    let task = s.claim(&src, &ClaimLimits::default()).await.unwrap().tasks.remove(0);

    let batch = [ack(&task, vec![create_only("waiting", now), create_only("died", now), create_only("fresh", now)])];
    let (r, committed) = s.settle(&src, &batch, None).await.unwrap();
    assert_eq!(r, vec![Ended::Succeeded], "the run's outcome is stored all the same");
    assert_eq!(committed.outboxed, 3);
    assert_eq!(zscore(&mut c, &key("intruder", "due"), b"run"), None, "and the task is done");
    // Create-only is in the entry id, so a host of an older version delivers
    // it (as a replace) rather than dropping it in a rolling upgrade.
    let mut entries: Vec<String> = c.hkeys(key("intruder", "outbox")).unwrap();
    entries.sort();
    assert_eq!(entries.len(), 3);
    assert!(entries.iter().all(|e| e.ends_with(":create")), "{entries:?}");

    let flushed = s.flush_outbox(&src).await.unwrap();
    assert_eq!(flushed.moved, 0);
    assert_eq!(flushed.failed.len(), 3, "each entry waits: {:?}", flushed.failed);
    for (_, e) in &flushed.failed {
        assert!(format!("{e:#}").contains(&broken), "{e:#}");
    }
    let _: () = c.rename("saved", &broken).unwrap();

    let flushed = s.flush_outbox(&src).await.unwrap();
    assert_eq!(flushed.moved, 3, "every entry is handled once");
    let mut kept: Vec<Vec<u8>> = flushed.kept_existing.iter().map(|(_, id)| id.clone()).collect();
    kept.sort();
    assert_eq!(kept, vec![b"died".to_vec(), b"waiting".to_vec()]);
    victims_untouched(&mut c, now);
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

/// A Redis that refuses keys of several slots in one script (a one-node
/// cluster reached as one server, as a managed multi-shard endpoint's proxy
/// behaves): the first settle with follow-ups falls back to the outbox, and
/// the store stops trying, so later settles take one call, not two.
#[tokio::test(flavor = "multi_thread")]
async fn a_server_that_refuses_scripts_across_slots_gets_followups_through_the_outbox() {
    let server = RedisServer::start_with(&["--cluster-enabled", "yes"]);
    let mut c = server.client();
    let _: () = redis::cmd("CLUSTER").arg("ADDSLOTSRANGE").arg(0).arg(16383).query(&mut c).unwrap();
    crate::support::wait_for("the one-node cluster", std::time::Duration::from_secs(10), || {
        let info: String = redis::cmd("CLUSTER").arg("INFO").query(&mut c).unwrap();
        info.contains("cluster_state:ok").then_some(())
    });
    let s = store(&server).await;
    let (src, dst) = (ty("order"), ty("invoice"));
    let now = redis_now(&mut c);
    for id in ["o1", "o2"] {
        let _: () = c.zadd(key("order", "due"), id, now - 1).unwrap();
    }
    let tasks = s.claim(&src, &ClaimLimits::default()).await.unwrap().tasks;
    let followup = |id: &str| FollowUp {
        task_type: dst.clone(),
        id: id.into(),
        payload: b"p".to_vec(),
        due_ms: now,
        replace: true,
    };
    let crossslot_errors = |c: &mut redis::Connection| -> u64 {
        let info: String = redis::cmd("INFO").arg("errorstats").query(c).unwrap();
        let line = info.lines().find(|l| l.starts_with("errorstat_CROSSSLOT:")).unwrap_or("");
        line.split(['=', ',']).nth(1).map_or(0, |n| n.trim().parse().unwrap())
    };

    for (task, id) in tasks.iter().zip(["i1", "i2"]) {
        let (r, committed) = s.settle(&src, &[ack(task, vec![followup(id)])], None).await.unwrap();
        assert_eq!(r, vec![Ended::Succeeded]);
        assert_eq!(committed.outboxed, 1, "the follow-up waits in the outbox");
        assert_eq!(s.flush_outbox(&src).await.unwrap().moved, 1);
        assert_eq!(zscore(&mut c, &key("invoice", "due"), id.as_bytes()), Some(now));
    }
    assert_eq!(crossslot_errors(&mut c), 1, "only the first settle tried the direct way");
}

/// Acks whose only other write is follow-ups share their claim's mask: a task
/// settled already (fenced) has none of its follow-ups written, the others all.
#[tokio::test(flavor = "multi_thread")]
async fn a_fenced_tasks_followups_are_not_written() {
    let server = RedisServer::start();
    let mut c = server.client();
    let s = store(&server).await;
    let src = ty("order");
    let now = redis_now(&mut c);
    for (i, id) in ["o1", "o2", "o3"].iter().enumerate() {
        let _: () = c.zadd(key("order", "due"), id, now - 10 + i as i64).unwrap();
    }
    let tasks = s.claim(&src, &ClaimLimits::default()).await.unwrap().tasks;
    assert_eq!(tasks.len(), 3);
    let to = |id: &str| FollowUp {
        task_type: ty("invoice"),
        id: id.as_bytes().to_vec(),
        payload: id.as_bytes().to_vec(),
        due_ms: now + 1000,
        replace: true,
    };

    let (r, _) = s.settle(&src, &[ack(&tasks[0], vec![to("a")])], None).await.unwrap();
    assert_eq!(r, vec![Ended::Succeeded]);
    let batch = [ack(&tasks[0], vec![to("b")]), ack(&tasks[1], vec![to("c1"), to("c2")]), ack(&tasks[2], vec![])];
    let (r, committed) = s.settle(&src, &batch, None).await.unwrap();
    assert_eq!(r, vec![Ended::Fenced, Ended::Succeeded, Ended::Succeeded]);
    assert_eq!(committed.outboxed, 0);

    let due = key("invoice", "due");
    let mut written: Vec<Vec<u8>> = c.zrange(&due, 0, -1).unwrap();
    written.sort();
    assert_eq!(written, vec![b"a".to_vec(), b"c1".to_vec(), b"c2".to_vec()], "the fenced run's b is not written");
    assert_eq!(hget(&mut c, &key("invoice", "payload"), b"c2"), Some(b"c2".to_vec()));
    assert_eq!(s.stats(&src).await.unwrap().in_flight, 0, "every task left its claim");
}
