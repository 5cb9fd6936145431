//! The Redis contract: tasks written with raw commands, claimed and settled by `Store`, against a real Redis.
//!
//! Here: claims and leases, fencing, extend, retry, release, client schedules, stats, type names, connecting;
//! the child modules hold claim records, dead letters and follow-ups.

// Scheduling many tasks in one script call per type and batch.
mod batches;
// Claim records left by older versions, damaged or outliving their token counter, and acks of part of a claim.
mod claim_records;
// The dead-letter set: requeue, purge, revival, and dead letters at claim.
mod dead_letters;
// Follow-ups through the outbox into their target type.
mod followups;

use std::collections::HashSet;
use std::time::Duration;

use crate::support::{RedisServer, ack, key, redis_now, store, ty, wait_for};
use hourglass_store::KeyPrefix;
use hourglass_store::task::{ClaimedTask, Ended, FollowUp, Lease, Outcome, Settlement};
use hourglass_store::{CancelEffect, ClaimLimits, Extended, ScheduleMode, Store};
use redis::Commands;

const WAIT: Duration = Duration::from_secs(20);

pub(super) fn limits(max_tasks: usize, lease: Duration) -> ClaimLimits {
    ClaimLimits { max_tasks, lease, ..ClaimLimits::default() }
}

/// Blocks until Redis time has passed `ms`.
pub(super) fn wait_past(conn: &mut redis::Connection, ms: i64) {
    wait_for("redis time to pass the lease expiry", WAIT, || (redis_now(conn) > ms).then_some(()));
}

pub(super) fn ids(tasks: &[ClaimedTask]) -> Vec<Vec<u8>> {
    tasks.iter().map(|t| t.id.clone()).collect()
}

pub(super) fn zscore(conn: &mut redis::Connection, key: &str, id: &[u8]) -> Option<i64> {
    let s: Option<f64> = conn.zscore(key, id).unwrap();
    s.map(|s| s as i64)
}

pub(super) fn hget(conn: &mut redis::Connection, key: &str, field: &[u8]) -> Option<Vec<u8>> {
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
    assert_eq!(s.cancel(&t, b"api").await.unwrap(), CancelEffect::Scheduled);
    assert_eq!(s.cancel(&t, b"api").await.unwrap(), CancelEffect::Unknown);
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
    let r = s.settle(&t, &[ack(&old, vec![followup.clone()])], None).await.unwrap().0;
    assert_eq!(r, vec![Ended::Fenced]);
    let outbox: usize = c.hlen(key("flaky", "outbox")).unwrap();
    assert_eq!(outbox, 0, "a fenced ack writes no follow-ups");
    let next_due: usize = c.zcard(key("next", "due")).unwrap();
    assert_eq!(next_due, 0);
    assert!(s.leased(&t, b"x").await.unwrap(), "the new lease stands");
    assert_eq!(hget(&mut c, &key("flaky", "payload"), b"x"), Some(b"data".to_vec()));
    assert_eq!(s.stats(&t).await.unwrap().succeeded, 0);
    // So is its plain ack (sent as its claim's mask): that claim is gone.
    assert_eq!(s.settle(&t, &[ack(&old, vec![])], None).await.unwrap().0, vec![Ended::Fenced]);
    assert!(s.leased(&t, b"x").await.unwrap(), "the new lease stands");

    let r = s.settle(&t, &[ack(&new, vec![])], None).await.unwrap().0;
    assert_eq!(r, vec![Ended::Succeeded]);
    assert!(!s.leased(&t, b"x").await.unwrap());
    assert_eq!(hget(&mut c, &key("flaky", "payload"), b"x"), None);
    assert_eq!(hget(&mut c, &key("flaky", "attempts"), b"x"), None);
    assert!(crate::support::leases(&mut c, "flaky").is_empty());
    let claims: usize = c.zcard(key("flaky", "claims")).unwrap();
    assert_eq!(claims, 0, "a claim's lease goes with its last task");
    assert_eq!(s.stats(&t).await.unwrap().succeeded, 1);

    // A second ack with the same token is fenced too (the token is gone).
    assert_eq!(s.settle(&t, &[ack(&new, vec![])], None).await.unwrap().0, vec![Ended::Fenced]);
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
    assert_eq!(s.settle(&t, &[ack(&task, vec![])], None).await.unwrap().0, vec![Ended::Succeeded]);
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
    let retry = Outcome::Retry { delay: Duration::from_secs(60), error: "boom".into(), progress: None };
    let batch = [Settlement { lease: task.lease(), outcome: retry, run: Default::default() }];
    assert_eq!(s.settle(&t, &batch, None).await.unwrap().0, vec![Ended::Retried]);
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
    let zero = Outcome::Retry { delay: Duration::ZERO, error: "again".into(), progress: None };
    let batch = [Settlement { lease: again.lease(), outcome: zero, run: Default::default() }];
    assert_eq!(s.settle(&t, &batch, None).await.unwrap().0, vec![Ended::Retried]);
    let third = s.claim(&t, &ClaimLimits::default()).await.unwrap().tasks.remove(0);
    assert_eq!(third.attempt, 3);
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
            outcome: Outcome::Retry { delay: Duration::ZERO, error: "e".into(), progress: None },
            run: Default::default(),
        },
        Settlement { lease: d.lease(), outcome: Outcome::Dead { error: "e".into() }, run: Default::default() },
    ];
    // The dead letter gave way to the client's schedule: the script says so, and counts no death.
    assert_eq!(s.settle(&t, &batch, None).await.unwrap().0, vec![Ended::Succeeded, Ended::Retried, Ended::Rescheduled]);
    for id in ["acked", "retried", "dead"] {
        assert_eq!(zscore(&mut c, &due, id.as_bytes()), Some(later), "{id}: the client's schedule stays");
        assert_eq!(hget(&mut c, &payload, id.as_bytes()), Some(b"new".to_vec()), "{id}: new payload stays");
    }
    assert!(zscore(&mut c, &key("race", "dead"), b"dead").is_none(), "not dead-lettered");
    let stats = s.stats(&t).await.unwrap();
    assert_eq!((stats.succeeded, stats.failed, stats.retried, stats.dead_total), (1, 2, 1, 0));
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
    assert_eq!(s.settle(&t, &batch, None).await.unwrap().0, vec![Ended::Dead]);
    let listed = s.dead_list(&t, 10).await.unwrap();
    assert_eq!(listed[0].id, id);
    assert_eq!(listed[0].id_hex, hex::encode(&id));
    assert_eq!(s.dead_requeue(&t, Some(std::slice::from_ref(&id))).await.unwrap(), 1);
    let again = s.claim(&t, &ClaimLimits::default()).await.unwrap().tasks.remove(0);
    assert_eq!((again.id, again.payload), (id, payload));
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
    let stale_ack = s.settle(&t, &[ack(&tasks[0], vec![])], None).await.unwrap().0;
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
