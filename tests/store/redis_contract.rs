//! The Redis contract: tasks written with raw commands, claimed and settled by `Store`, against a real Redis.

use std::collections::HashSet;
use std::time::Duration;

use crate::support::{RedisServer, ack, key, redis_now, store, ty, wait_for};
use hourglass_store::KeyPrefix;
use hourglass_store::task::{ClaimedTask, Ended, FollowUp, Lease, Outcome, Settlement};
use hourglass_store::{Cancelled, ClaimLimits, Extended, ScheduleMode, Store, encode_followup};
use redis::Commands;

const WAIT: Duration = Duration::from_secs(20);

fn limits(max_tasks: usize, lease: Duration) -> ClaimLimits {
    ClaimLimits { max_tasks, lease, ..ClaimLimits::default() }
}

/// Blocks until Redis time has passed `ms`.
fn wait_past(conn: &mut redis::Connection, ms: i64) {
    wait_for("redis time to pass the lease expiry", WAIT, || (redis_now(conn) > ms).then_some(()));
}

fn ids(tasks: &[ClaimedTask]) -> Vec<Vec<u8>> {
    tasks.iter().map(|t| t.id.clone()).collect()
}

fn zscore(conn: &mut redis::Connection, key: &str, id: &[u8]) -> Option<i64> {
    let s: Option<f64> = conn.zscore(key, id).unwrap();
    s.map(|s| s as i64)
}

fn hget(conn: &mut redis::Connection, key: &str, field: &[u8]) -> Option<Vec<u8>> {
    conn.hget(key, field).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn claims_due_tasks_oldest_first_and_skips_future_ones() {
    let server = RedisServer::start();
    let mut c = server.client();
    let s = store(&server).await;
    let t = ty("email");
    let now = redis_now(&mut c);
    let due = key("email", "due");
    let _: () = c.zadd(&due, "b", now - 1000).unwrap();
    let _: () = c.zadd(&due, "a", now - 3000).unwrap();
    let _: () = c.zadd(&due, "c", now - 2000).unwrap();
    let _: () = c.zadd(&due, "later", now + 600_000).unwrap();
    let _: () = c.hset(key("email", "payload"), "a", "hello").unwrap();

    let first = s.claim(&t, &limits(2, Duration::from_secs(30))).await.unwrap();
    assert_eq!(ids(&first.tasks), vec![b"a".to_vec(), b"c".to_vec()]);
    let a = &first.tasks[0];
    assert_eq!(a.payload, b"hello");
    assert_eq!(a.attempt, 1);
    assert_eq!(a.due_ms, now - 3000);
    assert_eq!(a.task_type, t);
    assert_eq!(first.tasks[1].payload, b"", "a missing payload is empty");
    assert_ne!(a.token, first.tasks[1].token);
    // A full claim tells the caller nothing about what is next: it claims again at once.
    assert_eq!((first.next_due_ms, first.next_lease_expiry_ms), (None, None), "b is still due, but the claim was full");
    assert!(first.lease_expiry_ms >= first.now_ms + 30_000);

    let second = s.claim(&t, &limits(10, Duration::from_secs(30))).await.unwrap();
    assert_eq!(ids(&second.tasks), vec![b"b".to_vec()]);
    assert_eq!(second.next_due_ms, Some(now + 600_000));
    assert_eq!(second.next_lease_expiry_ms, Some(first.lease_expiry_ms), "the earliest lease, the first claim's");

    let third = s.claim(&t, &limits(10, Duration::from_secs(30))).await.unwrap();
    assert!(third.tasks.is_empty(), "the future task is not claimed");
    let later: Option<i64> = zscore(&mut c, &due, b"later");
    assert_eq!(later, Some(now + 600_000));
}

#[tokio::test(flavor = "multi_thread")]
async fn postpone_and_cancel_with_raw_commands_and_the_api() {
    let server = RedisServer::start();
    let mut c = server.client();
    let s = store(&server).await;
    let t = ty("reminder");
    let due = key("reminder", "due");
    let now = redis_now(&mut c);
    let _: () = c.zadd(&due, "postponed", now - 1000).unwrap();
    let _: () = c.zadd(&due, "postponed", now + 600_000).unwrap();
    let _: () = c.zadd(&due, "cancelled", now - 1000).unwrap();
    let _: () = c.zrem(&due, "cancelled").unwrap();
    assert!(s.claim(&t, &ClaimLimits::default()).await.unwrap().tasks.is_empty());

    s.schedule(&t, b"api", now - 5, Some(b"p"), ScheduleMode::Upsert).await.unwrap();
    assert_eq!(hget(&mut c, &key("reminder", "payload"), b"api"), Some(b"p".to_vec()));
    assert_eq!(s.cancel(&t, b"api").await.unwrap(), Cancelled::Scheduled);
    assert_eq!(s.cancel(&t, b"api").await.unwrap(), Cancelled::Unknown);
    assert_eq!(hget(&mut c, &key("reminder", "payload"), b"api"), None);
    assert!(s.claim(&t, &ClaimLimits::default()).await.unwrap().tasks.is_empty());

    s.schedule(&t, b"api2", now - 5, None, ScheduleMode::Upsert).await.unwrap();
    let claim = s.claim(&t, &ClaimLimits::default()).await.unwrap();
    assert_eq!(ids(&claim.tasks), vec![b"api2".to_vec()]);
}

#[tokio::test(flavor = "multi_thread")]
async fn sixteen_concurrent_claimers_take_each_task_exactly_once() {
    let server = RedisServer::start();
    let mut c = server.client();
    let t = ty("bulk");
    let now = redis_now(&mut c);
    let total = 10_000;
    let mut pipe = redis::pipe();
    for i in 0..total {
        pipe.zadd(key("bulk", "due"), format!("task-{i}"), now - 20_000 + i as i64).ignore();
    }
    let () = pipe.query(&mut c).unwrap();

    let mut workers = Vec::new();
    for _ in 0..16 {
        let s = store(&server).await;
        let t = t.clone();
        workers.push(tokio::spawn(async move {
            let mut got = Vec::new();
            loop {
                let claim = s.claim(&t, &limits(50, Duration::from_secs(60))).await.unwrap();
                if claim.tasks.is_empty() {
                    return got;
                }
                got.extend(claim.tasks.into_iter().map(|t| t.id));
            }
        }));
    }
    let mut all = Vec::new();
    for w in workers {
        all.extend(w.await.unwrap());
    }
    assert_eq!(all.len(), total, "every task claimed once");
    let unique: HashSet<_> = all.iter().collect();
    assert_eq!(unique.len(), total, "no task claimed twice");
    assert_eq!(crate::support::leases(&mut c, "bulk").len(), total);
}

#[tokio::test(flavor = "multi_thread")]
async fn expired_lease_is_redelivered_and_the_old_token_is_fenced() {
    let server = RedisServer::start();
    let mut c = server.client();
    let s = store(&server).await;
    let t = ty("flaky");
    let now = redis_now(&mut c);
    let _: () = c.zadd(key("flaky", "due"), "x", now - 1).unwrap();
    let _: () = c.hset(key("flaky", "payload"), "x", "data").unwrap();

    let first = s.claim(&t, &limits(10, Duration::from_secs(1))).await.unwrap();
    assert_eq!(first.tasks.len(), 1);
    let old = first.tasks[0].clone();
    wait_past(&mut c, first.lease_expiry_ms);

    let second = s.claim(&t, &limits(10, Duration::from_secs(60))).await.unwrap();
    assert_eq!(second.tasks.len(), 1, "the expired lease is re-delivered");
    let new = second.tasks[0].clone();
    assert_eq!(new.id, b"x");
    assert_eq!(new.payload, b"data");
    assert_eq!(new.attempt, 2, "attempts are kept across lost leases");
    assert_eq!(new.due_ms, now - 1, "a lost task goes back at its claim's earliest due time, not behind later ones");
    assert_ne!(new.token, old.token);

    // The old holder finishes late: its ack (with a follow-up) must change nothing.
    let followup =
        FollowUp { task_type: ty("next"), id: b"f".to_vec(), payload: b"p".to_vec(), due_ms: now, replace: true };
    let r = s.settle(&t, &[ack(&old, vec![followup.clone()])], None).await.unwrap();
    assert_eq!(r, vec![Ended::Fenced]);
    let outbox: usize = c.hlen(key("flaky", "outbox")).unwrap();
    assert_eq!(outbox, 0, "a fenced ack writes no follow-ups");
    let next_due: usize = c.zcard(key("next", "due")).unwrap();
    assert_eq!(next_due, 0);
    assert!(s.leased(&t, b"x").await.unwrap(), "the new lease stands");
    assert_eq!(hget(&mut c, &key("flaky", "payload"), b"x"), Some(b"data".to_vec()));
    assert_eq!(s.stats(&t).await.unwrap().succeeded, 0);
    // So is its plain ack (sent as its claim's mask): that claim is gone.
    assert_eq!(s.settle(&t, &[ack(&old, vec![])], None).await.unwrap(), vec![Ended::Fenced]);
    assert!(s.leased(&t, b"x").await.unwrap(), "the new lease stands");

    let r = s.settle(&t, &[ack(&new, vec![])], None).await.unwrap();
    assert_eq!(r, vec![Ended::Succeeded]);
    assert!(!s.leased(&t, b"x").await.unwrap());
    assert_eq!(hget(&mut c, &key("flaky", "payload"), b"x"), None);
    assert_eq!(hget(&mut c, &key("flaky", "attempts"), b"x"), None);
    assert!(crate::support::leases(&mut c, "flaky").is_empty());
    let claims: usize = c.zcard(key("flaky", "claims")).unwrap();
    assert_eq!(claims, 0, "a claim's lease goes with its last task");
    assert_eq!(s.stats(&t).await.unwrap().succeeded, 1);

    // A second ack with the same token is fenced too (the token is gone).
    assert_eq!(s.settle(&t, &[ack(&new, vec![])], None).await.unwrap(), vec![Ended::Fenced]);
}

#[tokio::test(flavor = "multi_thread")]
async fn extend_keeps_the_lease_past_its_original_expiry() {
    let server = RedisServer::start();
    let mut c = server.client();
    let s = store(&server).await;
    let t = ty("slow");
    let now = redis_now(&mut c);
    let _: () = c.zadd(key("slow", "due"), "x", now - 1).unwrap();
    let claim = s.claim(&t, &limits(10, Duration::from_secs(1))).await.unwrap();
    let task = claim.tasks[0].clone();

    let ok = s.extend(&t, &[task.lease()], 60_000).await.unwrap();
    assert_eq!(ok, vec![Extended::Extended]);
    let stale = s
        .extend(&t, &[Lease { id: task.id.clone(), token: task.token + 1000, claim: task.claim }], 60_000)
        .await
        .unwrap();
    assert_eq!(stale, vec![Extended::Lost], "a wrong token cannot extend");
    let unknown = s.extend(&t, &[Lease { id: b"nope".to_vec(), token: 1, claim: 1 }], 60_000).await.unwrap();
    assert_eq!(unknown, vec![Extended::Lost]);

    wait_past(&mut c, claim.lease_expiry_ms);
    let again = s.claim(&t, &limits(10, Duration::from_secs(1))).await.unwrap();
    assert!(again.tasks.is_empty(), "an extended lease is not reaped");
    assert_eq!(s.settle(&t, &[ack(&task, vec![])], None).await.unwrap(), vec![Ended::Succeeded]);
}

#[tokio::test(flavor = "multi_thread")]
async fn retry_reschedules_at_now_plus_delay_with_error_and_counters() {
    let server = RedisServer::start();
    let mut c = server.client();
    let s = store(&server).await;
    let t = ty("retry");
    let now = redis_now(&mut c);
    let _: () = c.zadd(key("retry", "due"), "x", now - 1).unwrap();
    let _: () = c.hset(key("retry", "payload"), "x", "keep").unwrap();
    let task = s.claim(&t, &ClaimLimits::default()).await.unwrap().tasks.remove(0);
    // While it runs, its attempt lives with its token; the attempts hash is written
    // only when an attempt ends without an ack (here: the retry below).
    let running = s.show(&t, b"x").await.unwrap().running.expect("leased");
    assert_eq!((running.token, running.attempt), (task.token, 1));
    assert_eq!(hget(&mut c, &key("retry", "attempts"), b"x"), None);

    let before = redis_now(&mut c);
    let retry = Outcome::Retry { delay: Duration::from_secs(60), error: "boom".into() };
    let batch = [Settlement { lease: task.lease(), outcome: retry, run: Default::default() }];
    assert_eq!(s.settle(&t, &batch, None).await.unwrap(), vec![Ended::Retried]);
    let after = redis_now(&mut c);
    let score = zscore(&mut c, &key("retry", "due"), b"x").expect("due again");
    assert!(score >= before + 60_000 && score <= after + 60_000, "{score} vs {before}..{after}");
    assert_eq!(hget(&mut c, &key("retry", "errors"), b"x"), Some(b"boom".to_vec()));
    assert_eq!(hget(&mut c, &key("retry", "attempts"), b"x"), Some(b"1".to_vec()));
    assert_eq!(hget(&mut c, &key("retry", "payload"), b"x"), Some(b"keep".to_vec()));
    assert!(!s.leased(&t, b"x").await.unwrap());
    let stats = s.stats(&t).await.unwrap();
    assert_eq!((stats.failed, stats.retried, stats.succeeded), (1, 1, 0));
    assert_eq!((stats.scheduled_later, stats.in_flight), (1, 0));

    // Retry right away: the next claim is attempt 2 with the same payload.
    let _: () = c.zadd(key("retry", "due"), "x", now - 1).unwrap();
    let again = s.claim(&t, &ClaimLimits::default()).await.unwrap().tasks.remove(0);
    assert_eq!((again.attempt, again.payload.as_slice()), (2, b"keep".as_slice()));
    let zero = Outcome::Retry { delay: Duration::ZERO, error: "again".into() };
    let batch = [Settlement { lease: again.lease(), outcome: zero, run: Default::default() }];
    assert_eq!(s.settle(&t, &batch, None).await.unwrap(), vec![Ended::Retried]);
    let third = s.claim(&t, &ClaimLimits::default()).await.unwrap().tasks.remove(0);
    assert_eq!(third.attempt, 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn dead_letter_list_requeue_and_purge() {
    let server = RedisServer::start();
    let mut c = server.client();
    let s = store(&server).await;
    let t = ty("doomed");
    let now = redis_now(&mut c);
    for (i, id) in ["a", "b", "c"].iter().enumerate() {
        let _: () = c.zadd(key("doomed", "due"), *id, now - 10 + i as i64).unwrap();
        let _: () = c.hset(key("doomed", "payload"), *id, "12345").unwrap();
    }
    let tasks = s.claim(&t, &ClaimLimits::default()).await.unwrap().tasks;
    let batch: Vec<Settlement> = tasks
        .iter()
        .map(|task| Settlement {
            lease: task.lease(),
            outcome: Outcome::Dead { error: format!("bad {}", String::from_utf8_lossy(&task.id)) },
            run: Default::default(),
        })
        .collect();
    let r = s.settle(&t, &batch, None).await.unwrap();
    assert_eq!(r, vec![Ended::Dead; 3]);

    let stats = s.stats(&t).await.unwrap();
    assert_eq!((stats.dead, stats.dead_total, stats.failed, stats.in_flight), (3, 3, 3, 0));
    let dead = s.dead_list(&t, 10).await.unwrap();
    assert_eq!(dead.len(), 3);
    assert_eq!(dead[0].id, b"a");
    assert_eq!(dead[0].error, "bad a");
    assert_eq!(dead[0].attempts, 1);
    assert_eq!(dead[0].payload_len, 5);
    assert!(dead[0].died_ms >= now);
    assert_eq!(s.dead_list(&t, 1).await.unwrap().len(), 1);
    assert!(s.claim(&t, &ClaimLimits::default()).await.unwrap().tasks.is_empty());

    // Requeue one: due now, attempts reset, payload kept.
    assert_eq!(s.dead_requeue(&t, Some(&[b"a".to_vec(), b"nope".to_vec()])).await.unwrap(), 1);
    let again = s.claim(&t, &ClaimLimits::default()).await.unwrap().tasks;
    assert_eq!(ids(&again), vec![b"a".to_vec()]);
    assert_eq!((again[0].attempt, again[0].payload.as_slice()), (1, b"12345".as_slice()));
    assert_eq!(hget(&mut c, &key("doomed", "errors"), b"a"), None);

    // Purge one by id, then the rest.
    assert_eq!(s.dead_purge(&t, Some(&[b"b".to_vec()])).await.unwrap(), 1);
    assert_eq!(hget(&mut c, &key("doomed", "payload"), b"b"), None);
    assert_eq!(hget(&mut c, &key("doomed", "errors"), b"b"), None);
    assert_eq!(s.dead_purge(&t, None).await.unwrap(), 1);
    assert!(s.dead_list(&t, 10).await.unwrap().is_empty());
    assert_eq!(hget(&mut c, &key("doomed", "payload"), b"c"), None);
    assert_eq!(s.dead_purge(&t, None).await.unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn requeue_all_moves_more_than_one_batch() {
    let server = RedisServer::start();
    let mut c = server.client();
    let s = store(&server).await;
    let t = ty("many");
    let mut pipe = redis::pipe();
    for i in 0..2500 {
        pipe.zadd(key("many", "dead"), format!("d{i}"), i).ignore();
        pipe.hset(key("many", "attempts"), format!("d{i}"), 5).ignore();
    }
    let () = pipe.query(&mut c).unwrap();
    assert_eq!(s.dead_requeue(&t, None).await.unwrap(), 2500);
    let due: usize = c.zcard(key("many", "due")).unwrap();
    let attempts: usize = c.hlen(key("many", "attempts")).unwrap();
    assert_eq!((due, attempts), (2500, 0));
    assert_eq!(s.stats(&t).await.unwrap().dead, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn client_reschedule_during_a_run_wins() {
    let server = RedisServer::start();
    let mut c = server.client();
    let s = store(&server).await;
    let t = ty("race");
    let (due, payload) = (key("race", "due"), key("race", "payload"));
    let now = redis_now(&mut c);
    for id in ["acked", "retried", "dead"] {
        let _: () = c.zadd(&due, id, now - 1).unwrap();
        let _: () = c.hset(&payload, id, "old").unwrap();
    }
    let tasks = s.claim(&t, &ClaimLimits::default()).await.unwrap().tasks;
    assert_eq!(tasks.len(), 3);
    let later = now + 600_000;
    for id in ["acked", "retried", "dead"] {
        let _: () = c.zadd(&due, id, later).unwrap();
        let _: () = c.hset(&payload, id, "new").unwrap();
    }
    let by_id = |id: &[u8]| tasks.iter().find(|t| t.id == id).unwrap().clone();
    let (a, r, d) = (by_id(b"acked"), by_id(b"retried"), by_id(b"dead"));
    let batch = [
        ack(&a, vec![]),
        Settlement {
            lease: r.lease(),
            outcome: Outcome::Retry { delay: Duration::ZERO, error: "e".into() },
            run: Default::default(),
        },
        Settlement { lease: d.lease(), outcome: Outcome::Dead { error: "e".into() }, run: Default::default() },
    ];
    // The dead letter gave way to the client's schedule: the script says so, and counts no death.
    assert_eq!(s.settle(&t, &batch, None).await.unwrap(), vec![Ended::Succeeded, Ended::Retried, Ended::Rescheduled]);
    for id in ["acked", "retried", "dead"] {
        assert_eq!(zscore(&mut c, &due, id.as_bytes()), Some(later), "{id}: the client's schedule stays");
        assert_eq!(hget(&mut c, &payload, id.as_bytes()), Some(b"new".to_vec()), "{id}: new payload stays");
    }
    assert!(zscore(&mut c, &key("race", "dead"), b"dead").is_none(), "not dead-lettered");
    let stats = s.stats(&t).await.unwrap();
    assert_eq!((stats.succeeded, stats.failed, stats.retried, stats.dead_total), (1, 2, 1, 0));
}

#[tokio::test(flavor = "multi_thread")]
async fn client_schedule_of_a_dead_id_revives_it_fresh() {
    let server = RedisServer::start();
    let mut c = server.client();
    let s = store(&server).await;
    let t = ty("phoenix");
    let now = redis_now(&mut c);
    let _: () = c.zadd(key("phoenix", "dead"), "x", now - 100).unwrap();
    let _: () = c.hset(key("phoenix", "attempts"), "x", 5).unwrap();
    let _: () = c.hset(key("phoenix", "errors"), "x", "old failure").unwrap();
    let _: () = c.zadd(key("phoenix", "due"), "x", now - 1).unwrap();
    let task = s.claim(&t, &ClaimLimits::default()).await.unwrap().tasks.remove(0);
    assert_eq!(task.attempt, 1);
    assert!(zscore(&mut c, &key("phoenix", "dead"), b"x").is_none());
    assert_eq!(hget(&mut c, &key("phoenix", "errors"), b"x"), None);
}

#[tokio::test(flavor = "multi_thread")]
async fn oversize_payload_and_long_id_are_dead_lettered_at_claim() {
    let server = RedisServer::start();
    let mut c = server.client();
    let s = store(&server).await;
    let t = ty("big");
    let now = redis_now(&mut c);
    let long_id = vec![b'i'; 1025];
    let _: () = c.zadd(key("big", "due"), "fat", now - 3).unwrap();
    let _: () = c.hset(key("big", "payload"), "fat", vec![7u8; 2000]).unwrap();
    let _: () = c.zadd(key("big", "due"), &long_id, now - 2).unwrap();
    let _: () = c.zadd(key("big", "due"), "fine", now - 1).unwrap();
    let _: () = c.hset(key("big", "payload"), "fine", vec![7u8; 1000]).unwrap();

    let claim = s.claim(&t, &ClaimLimits { max_payload_bytes: 1000, ..ClaimLimits::default() }).await.unwrap();
    assert_eq!(ids(&claim.tasks), vec![b"fine".to_vec()]);
    assert_eq!(claim.dead_lettered.len(), 2);
    assert_eq!(claim.dead_lettered[0].0, b"fat");
    assert_eq!(claim.dead_lettered[0].1, "payload of 2000 bytes is over the 1000-byte limit");
    assert_eq!(claim.dead_lettered[1].0, long_id);
    assert_eq!(claim.dead_lettered[1].1, "id of 1025 bytes is over the 1024-byte limit");

    let dead = s.dead_list(&t, 10).await.unwrap();
    assert_eq!(dead.len(), 2);
    let fat = dead.iter().find(|d| d.id == b"fat").unwrap();
    assert!(fat.error.contains("2000 bytes"), "{}", fat.error);
    assert_eq!(fat.payload_len, 2000);
    let stats = s.stats(&t).await.unwrap();
    assert_eq!((stats.dead, stats.dead_total, stats.in_flight, stats.due_now), (2, 2, 1, 0));
}

#[tokio::test(flavor = "multi_thread")]
async fn binary_ids_and_payloads_round_trip() {
    let server = RedisServer::start();
    let mut c = server.client();
    let s = store(&server).await;
    let t = ty("bin");
    let id = vec![0u8, 0xff, b'\n', b'{', b'}', 0xc3, 0x28];
    let payload = vec![0u8, 0x9f, 0x92, 0x96, 0, b'\r'];
    let now = redis_now(&mut c);
    let _: () = c.zadd(key("bin", "due"), &id, now - 1).unwrap();
    let _: () = c.hset(key("bin", "payload"), &id, &payload).unwrap();
    let task = s.claim(&t, &ClaimLimits::default()).await.unwrap().tasks.remove(0);
    assert_eq!((task.id.clone(), task.payload.clone()), (id.clone(), payload.clone()));
    let dead = Outcome::Dead { error: "no".into() };
    let batch = [Settlement { lease: task.lease(), outcome: dead, run: Default::default() }];
    assert_eq!(s.settle(&t, &batch, None).await.unwrap(), vec![Ended::Dead]);
    let listed = s.dead_list(&t, 10).await.unwrap();
    assert_eq!(listed[0].id, id);
    assert_eq!(listed[0].id_hex, hex::encode(&id));
    assert_eq!(s.dead_requeue(&t, Some(std::slice::from_ref(&id))).await.unwrap(), 1);
    let again = s.claim(&t, &ClaimLimits::default()).await.unwrap().tasks.remove(0);
    assert_eq!((again.id, again.payload), (id, payload));
}

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
    let r = s.settle(&src, &[ack(&task, vec![with_payload.clone(), without.clone()])], None).await.unwrap();
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
    assert_eq!(s.settle(&src, &batch, None).await.unwrap(), vec![Ended::Succeeded]);
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

#[tokio::test(flavor = "multi_thread")]
async fn release_hands_tasks_back_at_once() {
    let server = RedisServer::start();
    let mut c = server.client();
    let s = store(&server).await;
    let t = ty("shutdown");
    let now = redis_now(&mut c);
    let _: () = c.zadd(key("shutdown", "due"), "x", now - 1).unwrap();
    let _: () = c.zadd(key("shutdown", "due"), "y", now - 1).unwrap();
    let tasks = s.claim(&t, &limits(10, Duration::from_secs(600))).await.unwrap().tasks;
    assert_eq!(tasks.len(), 2);
    let leases: Vec<Lease> = tasks.iter().map(ClaimedTask::lease).collect();
    let stale = vec![Lease { id: tasks[0].id.clone(), token: tasks[0].token + 1000, claim: tasks[0].claim }];
    assert_eq!(s.release(&t, &stale).await.unwrap(), 0, "a stale token releases nothing");
    assert_eq!(s.release(&t, &leases).await.unwrap(), 2);
    assert_eq!(s.stats(&t).await.unwrap().in_flight, 0);

    let again = s.claim(&t, &limits(10, Duration::from_secs(600))).await.unwrap().tasks;
    assert_eq!(again.len(), 2, "due again at once");
    assert!(again.iter().all(|t| t.attempt == 1), "the released attempt does not count");
    let stale_ack = s.settle(&t, &[ack(&tasks[0], vec![])], None).await.unwrap();
    assert_eq!(stale_ack, vec![Ended::Fenced]);
}

#[tokio::test(flavor = "multi_thread")]
async fn stats_count_every_state() {
    let server = RedisServer::start();
    let mut c = server.client();
    let s = store(&server).await;
    let t = ty("counted");
    let now = redis_now(&mut c);
    let due = key("counted", "due");
    for i in 0..5 {
        let _: () = c.zadd(&due, format!("now{i}"), now - 100 + i).unwrap();
    }
    for i in 0..3 {
        let _: () = c.zadd(&due, format!("later{i}"), now + 600_000).unwrap();
    }
    assert_eq!(s.stats(&t).await.unwrap().due_now, 5);
    let tasks = s.claim(&t, &limits(3, Duration::from_secs(60))).await.unwrap().tasks;
    s.settle(&t, &[ack(&tasks[0], vec![])], None).await.unwrap();
    let st = s.stats(&t).await.unwrap();
    assert_eq!((st.due_now, st.scheduled_later, st.in_flight, st.dead, st.succeeded, st.failed), (2, 3, 2, 0, 1, 0));
    let json = serde_json::to_value(&st).unwrap();
    assert_eq!(json["scheduled_later"], 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn known_types_lists_valid_type_names_under_the_prefix() {
    let server = RedisServer::start();
    let mut c = server.client();
    let s = store(&server).await;
    assert!(s.known_types().await.unwrap().is_empty());
    let _: () = c.zadd(key("b.type", "due"), "x", 1).unwrap();
    let _: () = c.zadd(key("a", "dead"), "x", 1).unwrap();
    let _: () = c.hset(key("a", "stats"), "succeeded", 1).unwrap();
    let _: () = c.zadd("hourglass:{Bad Name}:due", "x", 1).unwrap();
    let _: () = c.zadd("other:{c}:due", "x", 1).unwrap();
    let _: () = c.set("hourglass:{d}", "no suffix").unwrap();
    assert_eq!(s.known_types().await.unwrap(), vec![ty("a"), ty("b.type")]);
}

#[tokio::test(flavor = "multi_thread")]
async fn connect_fails_fast_and_hides_credentials() {
    let prefix: KeyPrefix = "hourglass".parse().unwrap();
    let err = Store::connect("redis://user:hunter2@127.0.0.1:1/0", &prefix).await.unwrap_err();
    let msg = format!("{err:#}");
    assert!(msg.starts_with("cannot connect to Redis at redis://127.0.0.1:1/0"), "{msg}");
    assert!(!msg.contains("hunter2"), "{msg}");

    let dir = tempfile::tempdir().unwrap();
    let url = format!("redis+unix://{}/none.sock", dir.path().display());
    let msg = format!("{:#}", Store::connect(&url, &prefix).await.unwrap_err());
    assert!(msg.contains("cannot connect to Redis at"), "{msg}");

    let server = RedisServer::start();
    let s = Store::connect(&server.url(), &prefix).await.unwrap();
    s.ping().await.unwrap();
}

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
    assert_eq!(s.cancel(&t, b"held").await.unwrap(), Cancelled::Running { holder: "old-2".into() });

    let batch: Vec<Settlement> = first.tasks.iter().map(|t| ack(t, vec![])).collect();
    assert_eq!(s.settle(&t, &batch, None).await.unwrap(), vec![Ended::Succeeded; 2]);

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
    assert_eq!(s.settle(&t, &batch, None).await.unwrap(), vec![Ended::Succeeded; 2]);
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

    let r = s.settle(&t, &[ack(&tasks[2], vec![]), ack(&tasks[0], vec![])], None).await.unwrap();
    assert_eq!(r, [Ended::Succeeded, Ended::Succeeded]);
    assert_eq!(hget(&mut c, &key("parts", "payload"), b"p3"), None, "an acked task's payload goes");
    assert_eq!(s.stats(&t).await.unwrap().in_flight, 2);
    assert!(s.leased(&t, b"p2").await.unwrap() && s.leased(&t, b"p4").await.unwrap());
    assert!(!s.leased(&t, b"p1").await.unwrap());

    // p1 again (already settled) beside the two still leased.
    let r =
        s.settle(&t, &[ack(&tasks[1], vec![]), ack(&tasks[0], vec![]), ack(&tasks[3], vec![])], None).await.unwrap();
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
    assert_eq!(s.settle(&t, &batch, None).await.unwrap(), [Ended::Succeeded; 3]);
    assert!(s.leased(&t, b"b1").await.unwrap() && s.leased(&t, b"b2").await.unwrap(), "the second claim stands");
    assert_eq!(s.stats(&t).await.unwrap().in_flight, 2);
    let batch: Vec<Settlement> = second.iter().map(|task| ack(task, vec![])).collect();
    assert_eq!(s.settle(&t, &batch, None).await.unwrap(), [Ended::Succeeded; 2]);
    assert_eq!(s.stats(&t).await.unwrap().succeeded, 5);
}
