//! Claim records: those older versions left, a damaged one, a deleted token counter, acks of part of a claim.

use std::time::Duration;

use crate::support::{RedisServer, ack, key, redis_now, store, ty};
use hourglass_store::CancelEffect;
use hourglass_store::ClaimLimits;
use hourglass_store::task::{Ended, Settlement};
use redis::Commands;

use super::{hget, ids, limits, wait_past};

/// An upgrade: hosts before claim leases leased each task in `leases` and
/// `tokens`. A host of this version adopts those leases once they expire
/// (attempt counted), leaves the ones still held alone and counts them as
/// in flight, and a cancel and `show` still find them.
#[tokio::test(flavor = "multi_thread")]
async fn leases_of_an_older_host_are_adopted_when_they_expire() {
    let server = RedisServer::start();
    let mut c = server.client();
    let s = store(&server).await;
    let t = ty("legacy");
    let now = redis_now(&mut c);
    // What an older host left: "gone" (its host died, lease expired) and "held" (its host still runs it).
    for (id, expiry, entry) in [("gone", now - 1, "41:2@old-1"), ("held", now + 2_000, "42:1@old-2")] {
        let _: () = c.zadd(key("legacy", "leases"), id, expiry).unwrap();
        let _: () = c.hset(key("legacy", "tokens"), id, entry).unwrap();
        let _: () = c.hset(key("legacy", "payload"), id, format!("body of {id}")).unwrap();
    }
    let _: () = c.set(key("legacy", "seq"), 42).unwrap();
    let _: () = c.zadd(key("legacy", "due"), "fresh", now - 1).unwrap();

    let first = s.claim(&t, &limits(10, Duration::from_secs(60))).await.unwrap();
    let mut got: Vec<(Vec<u8>, u32)> = first.tasks.iter().map(|t| (t.id.clone(), t.attempt)).collect();
    got.sort();
    assert_eq!(
        got,
        vec![(b"fresh".to_vec(), 1), (b"gone".to_vec(), 3)],
        "the expired lease is adopted, its attempt counted"
    );
    assert!(first.tasks.iter().all(|t| t.token > 42), "tokens go on from the older host's");
    assert_eq!(s.stats(&t).await.unwrap().in_flight, 3, "the held lease counts as in flight");
    let held = s.show(&t, b"held").await.unwrap().running.expect("still running on old-2");
    assert_eq!((held.host.as_str(), held.token, held.attempt), ("old-2", 42, 1));
    assert_eq!(s.cancel(&t, b"held").await.unwrap(), CancelEffect::Running { holder: "old-2".into() });

    let batch: Vec<Settlement> = first.tasks.iter().map(|t| ack(t, vec![])).collect();
    assert_eq!(s.settle(&t, &batch, None).await.unwrap().0, vec![Ended::Succeeded; 2]);

    // The older host dies too: its cancelled run is not run again once its lease expires.
    wait_past(&mut c, now + 2_000);
    let second = s.claim(&t, &limits(10, Duration::from_secs(60))).await.unwrap();
    assert!(second.tasks.is_empty(), "a run whose cancel was asked is not re-run: {:?}", second.tasks);
    assert_eq!(s.stats(&t).await.unwrap().cancelled, 1);
    for k in ["leases", "tokens", "due", "claims"] {
        let exists: bool = c.exists(key("legacy", k)).unwrap();
        assert!(!exists, "{k} is left behind");
    }
    assert_eq!(s.stats(&t).await.unwrap().in_flight, 0);
}

/// The claim-lease version before acks went as masks listed every task's
/// attempt in its claim records (this one leaves the list empty when all
/// are first attempts). Its expired claims are reaped by a host of this
/// version with those attempts counted, and the ones it still holds stay.
#[tokio::test(flavor = "multi_thread")]
async fn claims_of_the_previous_claim_lease_version_are_reaped_with_their_attempts() {
    let server = RedisServer::start();
    let mut c = server.client();
    let s = store(&server).await;
    let t = ty("prev");
    let now = redis_now(&mut c);
    // Claim 7 (expired): "x" on attempt 1, "y" on attempt 2, "z" already settled.
    // Claim 20 (held until now + 60 s): "w" on attempt 1.
    const WRITE: &str = r#"
        redis.call('HSET', KEYS[1], '7', cmsgpack.pack({ 'old-1', { 'x', 'y', 'z' }, { 1, 2, 1 } }), '7:live', '110',
                   '20', cmsgpack.pack({ 'old-2', { 'w' }, { 1 } }), '20:live', '1')
        redis.call('HINCRBY', KEYS[1], 'leased', 3)
        redis.call('ZADD', KEYS[2], ARGV[1], '7', ARGV[2], '20')
        redis.call('SET', KEYS[3], '20')"#;
    let _: () = redis::Script::new(WRITE)
        .key(key("prev", "claimed"))
        .key(key("prev", "claims"))
        .key(key("prev", "seq"))
        .arg(now - 1)
        .arg(now + 60_000)
        .invoke(&mut c)
        .unwrap();
    assert_eq!(s.stats(&t).await.unwrap().in_flight, 3);

    let claim = s.claim(&t, &limits(10, Duration::from_secs(60))).await.unwrap();
    let mut got: Vec<(Vec<u8>, u32)> = claim.tasks.iter().map(|t| (t.id.clone(), t.attempt)).collect();
    got.sort();
    assert_eq!(got, vec![(b"x".to_vec(), 2), (b"y".to_vec(), 3)], "the expired claim's live tasks, attempts counted");
    assert!(claim.tasks.iter().all(|t| t.claim > 20), "claim ids go on past the old ones");
    assert_eq!(s.stats(&t).await.unwrap().in_flight, 3, "w is still held by old-2");
    let held = s.show(&t, b"w").await.unwrap().running.expect("w still runs on old-2");
    assert_eq!((held.host.as_str(), held.token, held.attempt), ("old-2", 20, 1));

    let batch: Vec<Settlement> = claim.tasks.iter().map(|t| ack(t, vec![])).collect();
    assert_eq!(s.settle(&t, &batch, None).await.unwrap().0, vec![Ended::Succeeded; 2]);
    let fields: Vec<String> = c.hkeys(key("prev", "claimed")).unwrap();
    let mut fields: Vec<&str> = fields.iter().map(String::as_str).collect();
    fields.sort();
    assert_eq!(fields, ["20", "20:live", "leased"], "claim 7 is gone, claim 20 stays");
    assert_eq!(s.stats(&t).await.unwrap().in_flight, 1);
}

/// A claim record someone overwrote names no ids to bring back, but its
/// expiry still frees its count: `max_running` is not held short for good.
#[tokio::test(flavor = "multi_thread")]
async fn a_damaged_claim_record_still_frees_its_count_when_it_expires() {
    let server = RedisServer::start();
    let mut c = server.client();
    let s = store(&server).await;
    let t = ty("capped");
    let now = redis_now(&mut c);
    for id in ["a", "b"] {
        let _: () = c.zadd(key("capped", "due"), id, now - 1).unwrap();
    }
    let capped = |lease| ClaimLimits { max_running: 2, ..limits(2, lease) };
    let first = s.claim(&t, &capped(Duration::from_millis(200))).await.unwrap();
    assert_eq!(first.tasks.len(), 2);
    let _: () = c.hset(key("capped", "claimed"), first.tasks[0].claim, "not msgpack").unwrap();
    assert_eq!(s.stats(&t).await.unwrap().in_flight, 2);

    wait_past(&mut c, first.lease_expiry_ms);
    let _: () = c.zadd(key("capped", "due"), "c", now - 1).unwrap();
    let second = s.claim(&t, &capped(Duration::from_secs(60))).await.unwrap();
    assert_eq!(ids(&second.tasks), vec![b"c".to_vec()], "the freed slots take new work");
    assert_eq!(s.stats(&t).await.unwrap().in_flight, 1);
}

/// Plain acks go as one mask per claim: part of a claim settles and the rest
/// stays leased; an ack of a task that already left its claim is fenced.
#[tokio::test(flavor = "multi_thread")]
async fn acks_of_part_of_a_claim_leave_the_rest_leased() {
    let server = RedisServer::start();
    let mut c = server.client();
    let s = store(&server).await;
    let t = ty("parts");
    let now = redis_now(&mut c);
    for (i, id) in ["p1", "p2", "p3", "p4"].iter().enumerate() {
        let _: () = c.zadd(key("parts", "due"), id, now - 10 + i as i64).unwrap();
    }
    let _: () = c.hset(key("parts", "payload"), "p3", "body").unwrap();
    let claim = s.claim(&t, &limits(10, Duration::from_secs(60))).await.unwrap();
    let tasks = claim.tasks;
    assert_eq!(ids(&tasks), [b"p1".to_vec(), b"p2".to_vec(), b"p3".to_vec(), b"p4".to_vec()]);

    let r = s.settle(&t, &[ack(&tasks[2], vec![]), ack(&tasks[0], vec![])], None).await.unwrap().0;
    assert_eq!(r, [Ended::Succeeded, Ended::Succeeded]);
    assert_eq!(hget(&mut c, &key("parts", "payload"), b"p3"), None, "an acked task's payload goes");
    assert_eq!(s.stats(&t).await.unwrap().in_flight, 2);
    assert!(s.leased(&t, b"p2").await.unwrap() && s.leased(&t, b"p4").await.unwrap());
    assert!(!s.leased(&t, b"p1").await.unwrap());

    // p1 again (already settled) beside the two still leased.
    let r =
        s.settle(&t, &[ack(&tasks[1], vec![]), ack(&tasks[0], vec![]), ack(&tasks[3], vec![])], None).await.unwrap().0;
    assert_eq!(r, [Ended::Succeeded, Ended::Fenced, Ended::Succeeded]);
    let stats = s.stats(&t).await.unwrap();
    assert_eq!((stats.succeeded, stats.in_flight), (4, 0));
    let claims: usize = c.zcard(key("parts", "claims")).unwrap();
    assert_eq!(claims, 0, "the claim's lease goes with its last task");
    let fields: Vec<String> = c.hkeys(key("parts", "claimed")).unwrap();
    assert_eq!(fields, ["leased"], "the claim's record goes with its last task");
}

/// Acks name a task by its claim id and index, so a claim id still in flight
/// is never handed out again, even when someone deletes the token counter.
#[tokio::test(flavor = "multi_thread")]
async fn a_deleted_token_counter_never_reuses_a_claim_in_flight() {
    let server = RedisServer::start();
    let mut c = server.client();
    let s = store(&server).await;
    let t = ty("reset");
    let now = redis_now(&mut c);
    for id in ["a1", "a2", "a3"] {
        let _: () = c.zadd(key("reset", "due"), id, now - 1).unwrap();
    }
    let first = s.claim(&t, &limits(10, Duration::from_secs(60))).await.unwrap().tasks;
    assert_eq!(first.len(), 3);
    let _: () = c.del(key("reset", "seq")).unwrap();
    for id in ["b1", "b2"] {
        let _: () = c.zadd(key("reset", "due"), id, now - 1).unwrap();
    }
    let second = s.claim(&t, &limits(10, Duration::from_secs(60))).await.unwrap().tasks;
    assert_eq!(ids(&second), [b"b1".to_vec(), b"b2".to_vec()]);
    assert!(second[0].claim > first[2].token, "claim {} reuses a token in flight", second[0].claim);

    let batch: Vec<Settlement> = first.iter().map(|task| ack(task, vec![])).collect();
    assert_eq!(s.settle(&t, &batch, None).await.unwrap().0, [Ended::Succeeded; 3]);
    assert!(s.leased(&t, b"b1").await.unwrap() && s.leased(&t, b"b2").await.unwrap(), "the second claim stands");
    assert_eq!(s.stats(&t).await.unwrap().in_flight, 2);
    let batch: Vec<Settlement> = second.iter().map(|task| ack(task, vec![])).collect();
    assert_eq!(s.settle(&t, &batch, None).await.unwrap().0, [Ended::Succeeded; 2]);
    assert_eq!(s.stats(&t).await.unwrap().succeeded, 5);
}
