//! Throttles shared by every host and shard (`max_running`, `rate`, fairness), held by the claim
//! script directly through `Store`, then over real hosts; and how a sharded type's tasks are routed.

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::recurring::{ids, limits, succeeded_events};
use crate::support::{Host, RedisServer, key, now_ms, plugin, redis_now, stat, store, test_plugin, ty, wait_for};
use hourglass::config::Rate;
use hourglass::store::{CancelEffect, ClaimLimits, ScheduleMode, TaskState};
use hourglass::task::{Outcome, Settlement};
use redis::Commands;

const LONG: Duration = Duration::from_secs(120);

#[tokio::test(flavor = "multi_thread")]
async fn max_running_and_rate_hold_claims_back_over_every_claimer() {
    let server = RedisServer::start();
    let mut c = server.client();
    let s = store(&server).await;
    let t = ty("api");
    let now = redis_now(&mut c);
    for i in 0..50 {
        let _: () = c.zadd(key("api", "due"), format!("a{i:02}"), now - 1000 + i).unwrap();
    }
    let capped = ClaimLimits { max_running: 3, ..limits() };
    let first = s.claim(&t, &capped).await.unwrap();
    assert_eq!(ids(&first.tasks), vec!["a00", "a01", "a02"], "oldest first, up to max_running");
    let second = s.claim(&t, &capped).await.unwrap();
    assert!(second.tasks.is_empty(), "max_running counts every claimer's leases");
    assert!(second.throttled_ms.is_some());
    let ack = Settlement {
        lease: first.tasks[0].lease(),
        outcome: Outcome::Ack { followups: vec![], groups: vec![], graphs: vec![] },
        run: Default::default(),
    };
    s.settle(&t, &[ack], None).await.unwrap();
    assert_eq!(ids(&s.claim(&t, &capped).await.unwrap().tasks), vec!["a03"], "one slot freed, one taken");

    // 20/s with a burst of one: the bucket lets one out now, the next after ~50 ms of Redis time.
    let t = ty("rated");
    for i in 0..10 {
        let _: () = c.zadd(key("rated", "due"), format!("r{i}"), now - 1000 + i).unwrap();
    }
    let rated = ClaimLimits { rate: Some(Rate::try_from("20/s".to_owned()).unwrap()), ..limits() };
    let mut taken = 0;
    let mut throttled = 0;
    let started = redis_now(&mut c);
    while taken < 5 {
        let claim = s.claim(&t, &rated).await.unwrap();
        taken += claim.tasks.len();
        if let Some(wait) = claim.throttled_ms {
            throttled += 1;
            assert!((1..=50).contains(&wait), "{wait}");
            tokio::time::sleep(Duration::from_millis(wait as u64)).await;
        }
    }
    assert!(throttled > 0, "the rate never held a claim back");
    // Five at 20/s, the first from a full bucket: at least 4 × 50 ms of Redis time.
    assert!(redis_now(&mut c) - started >= 200, "the bucket let tasks out faster than its rate");
}

#[test]
fn max_running_holds_over_three_hosts() {
    let redis = RedisServer::start();
    let meter = ConcurrencyMeter::start(Duration::from_millis(200));
    let config = |i: usize| {
        format!(
            "[runner]\nhost_id = \"h{i}\"\n[types.partner]\nmax_running = 3\nconcurrency = 8\n\
             allowed_outbound_hosts = [\"http://127.0.0.1:{}\"]\n",
            meter.port
        )
    };
    let hosts: Vec<Host> =
        (1..=3).map(|i| Host::start(&redis, &[("partner", test_plugin("chaos"))], &config(i))).collect();
    let mut conn = redis.client();
    let now = now_ms();
    let mut pipe = redis::pipe();
    for i in 0..30 {
        pipe.hset(key("partner", "payload"), format!("p{i}"), format!("http-get:http://127.0.0.1:{}/x", meter.port))
            .ignore();
        pipe.zadd(key("partner", "due"), format!("p{i}"), now).ignore();
    }
    let _: () = pipe.query(&mut conn).unwrap();
    // The chaos plugin's http-get reports the answer as an error: every run "fails" once it was served.
    wait_for("all 30 served", LONG, || (meter.served.load(Ordering::SeqCst) >= 30).then_some(()));
    let peak = meter.peak.load(Ordering::SeqCst);
    assert!(peak <= 3, "{peak} requests in flight at once under max_running = 3");
    assert!(peak >= 2, "the hosts never ran two at once ({peak}): the limit, not the test, should be what holds them");
    drop(hosts);
}

/// A sharded type's tasks are routed by id and found again by id: `schedule`
/// writes into the id's shard (`CLUSTER KEYSLOT` mod N, the server's own
/// hash); `show`, postpone, run-now and `cancel` reach it there, even for a
/// task a client put in another shard; `stats` sums the shards.
#[tokio::test(flavor = "multi_thread")]
async fn a_sharded_types_tasks_are_routed_and_found_by_id() {
    let server = RedisServer::start();
    let mut c = server.client();
    let config = hourglass::config::Config::parse("[types.hot]\nshards = 3\n", "runner.toml").unwrap();
    let s = store(&server).await.with_shards(config.sharded_types());
    let t = ty("hot");
    let tags = hourglass::task_type::shard_tags(&t, 3);
    let shard_key = |i: u16| key(tags[usize::from(i)].as_str(), "due");
    let far = redis_now(&mut c) + 3_600_000;
    let mut seen = HashSet::new();
    for i in 0..12 {
        let id = format!("o-{i}");
        assert!(s.schedule(&t, id.as_bytes(), far, Some(b"x"), ScheduleMode::Upsert).await.unwrap());
        let shard = hourglass::task_type::shard_of(id.as_bytes(), 3);
        seen.insert(shard);
        let score: Option<f64> = c.zscore(shard_key(shard), &id).unwrap();
        assert_eq!(score, Some(far as f64), "{id} is not in shard {shard}");
        let view = s.show(&t, id.as_bytes()).await.unwrap();
        assert_eq!((view.state, view.shard), (TaskState::Scheduled, Some(shard)), "{id}");
        assert_eq!(view.task_type, tags[usize::from(shard)], "{id}");
    }
    assert_eq!(seen.len(), 3, "the ids fall in every shard");
    assert_eq!(s.stats(&t).await.unwrap().scheduled_later, 12);
    // Postpone and run-now move the task in its shard.
    let later = s.reschedule(&t, b"o-1", Some(Duration::from_secs(60))).await.unwrap().unwrap();
    assert_eq!(later, far + 60_000);
    let now = s.reschedule(&t, b"o-2", None).await.unwrap().unwrap();
    let o2: Option<f64> = c.zscore(shard_key(hourglass::task_type::shard_of(b"o-2", 3)), "o-2").unwrap();
    assert_eq!(o2, Some(now as f64));
    // A client that wrote into the wrong shard: the task is still found, and cancelled.
    let wrong = (hourglass::task_type::shard_of(b"stray", 3) + 1) % 3;
    let _: () = c.zadd(shard_key(wrong), "stray", far).unwrap();
    assert_eq!(s.show(&t, b"stray").await.unwrap().state, TaskState::Scheduled);
    assert!(matches!(s.cancel(&t, b"stray").await.unwrap(), CancelEffect::Scheduled));
    // A task in a tag of the earlier layout (shard i in `hot#i`), none of the current ones.
    assert!(!tags.contains(&ty("hot").shard(1)), "{tags:?}");
    let _: () = c.zadd(key("hot#1", "due"), "old", far).unwrap();
    let view = s.show(&t, b"old").await.unwrap();
    assert_eq!((view.state, view.shard, view.task_type.as_str()), (TaskState::Scheduled, None, "hot#1"));
    assert!(matches!(s.cancel(&t, b"old").await.unwrap(), CancelEffect::Scheduled));
    for i in 0..12 {
        assert!(matches!(s.cancel(&t, format!("o-{i}").as_bytes()).await.unwrap(), CancelEffect::Scheduled));
    }
    assert!(matches!(s.cancel(&t, b"o-0").await.unwrap(), CancelEffect::Unknown));
    assert_eq!(s.stats(&t).await.unwrap().scheduled_later + s.stats(&t).await.unwrap().due_now, 0);
}

/// A sharded type's `max_running` holds over its shards together: each of
/// the 3 shards claims at most its part (1 of 3), while all three run at once.
#[test]
fn max_running_holds_over_the_shards_of_a_type() {
    let redis = RedisServer::start();
    let meter = ConcurrencyMeter::start(Duration::from_millis(200));
    let config = |i: usize| {
        format!(
            "[runner]\nhost_id = \"h{i}\"\n[types.partner]\nshards = 3\nmax_running = 3\nconcurrency = 8\n\
             allowed_outbound_hosts = [\"http://127.0.0.1:{}\"]\n",
            meter.port
        )
    };
    let hosts: Vec<Host> =
        (1..=2).map(|i| Host::start(&redis, &[("partner", test_plugin("chaos"))], &config(i))).collect();
    let mut conn = redis.client();
    let now = now_ms();
    let mut pipe = redis::pipe();
    let mut shards_used = HashSet::new();
    for i in 0..30 {
        let id = format!("p{i}");
        let shard = hourglass::task_type::shard_of(id.as_bytes(), 3);
        shards_used.insert(shard);
        let t = hourglass::task_type::shard_tag(&ty("partner"), id.as_bytes(), 3).to_string();
        pipe.hset(key(&t, "payload"), &id, format!("http-get:http://127.0.0.1:{}/x", meter.port)).ignore();
        pipe.zadd(key(&t, "due"), &id, now).ignore();
    }
    assert_eq!(shards_used.len(), 3, "the ids fall in every shard");
    let _: () = pipe.query(&mut conn).unwrap();
    wait_for("all 30 served", LONG, || (meter.served.load(Ordering::SeqCst) >= 30).then_some(()));
    let peak = meter.peak.load(Ordering::SeqCst);
    assert!(peak <= 3, "{peak} requests in flight at once under max_running = 3 over 3 shards");
    assert!(peak >= 2, "the shards never ran two at once ({peak}): the limit, not the test, should be what holds them");
    drop(hosts);
}

/// Checks the start times of `n` tasks run under `rate` per second with
/// `burst` tokens at most (over every claimer): a rate limit can only slow
/// things down, so these bounds hold on any machine, however loaded.
fn assert_rate_held(mut starts: Vec<i64>, n: usize, rate: f64, burst: f64) {
    starts.sort();
    assert_eq!(starts.len(), n);
    // The first `burst` from a full bucket, the rest at the rate (5% for the gap between a claim and its start).
    let least = ((n as f64 - burst) / rate * 1000.0 * 0.95) as i64;
    let span = starts[n - 1] - starts[0];
    assert!(span >= least, "{n} tasks started within {span} ms: faster than {rate}/s");
    // No one-second window holds more than the rate plus the burst, with 5% for that gap.
    let most = ((rate + burst) * 1.05) as usize;
    for (i, &start) in starts.iter().enumerate() {
        let in_window = starts[i..].iter().take_while(|&&s| s < start + 1000).count();
        assert!(in_window <= most, "{in_window} tasks started in the second after {start}");
    }
}

/// A sharded type's rate holds over its shards together: each claims a third.
#[test]
fn a_rate_holds_over_the_shards_of_a_type() {
    let redis = RedisServer::start();
    let config = "[types.rated]\nshards = 3\nrate = \"90/s\"\nevents = true\nevents_maxlen = 100000\n";
    let hosts: Vec<Host> = (1..=2).map(|_| Host::start(&redis, &[("rated", plugin("noop"))], config)).collect();
    let mut conn = redis.client();
    let now = now_ms();
    let mut pipe = redis::pipe();
    let tags = hourglass::task_type::shard_tags(&"rated".parse().unwrap(), 3);
    let shard = |i: u16| tags[usize::from(i)].to_string();
    for i in 0..450 {
        let id = format!("r{i:04}");
        pipe.zadd(key(&shard(hourglass::task_type::shard_of(id.as_bytes(), 3)), "due"), id, now).ignore();
    }
    let _: () = pipe.query(&mut conn).unwrap();
    let done = |conn: &mut redis::Connection| -> i64 { (0..3).map(|i| stat(conn, &shard(i), "succeeded")).sum() };
    wait_for("all 450 done", LONG, || (done(&mut conn) == 450).then_some(()));
    let starts: Vec<i64> =
        (0..3).flat_map(|i| succeeded_events(&mut conn, &shard(i))).map(|(_, started)| started).collect();
    // Each shard's bucket holds 1.5 (its 30/s over 20): 4.5 at once over the three.
    assert_rate_held(starts, 450, 90.0, 4.5);
    drop(hosts);
}

#[test]
fn a_rate_shared_by_three_hosts_is_never_exceeded() {
    let redis = RedisServer::start();
    let config = |i: usize| {
        format!(
            "[runner]\nhost_id = \"h{i}\"\n[types.rated]\nrate = \"200/s\"\nevents = true\nevents_maxlen = 100000\n"
        )
    };
    let hosts: Vec<Host> = (1..=3).map(|i| Host::start(&redis, &[("rated", plugin("noop"))], &config(i))).collect();
    let mut conn = redis.client();
    let now = now_ms();
    let mut pipe = redis::pipe();
    for i in 0..2000 {
        pipe.zadd(key("rated", "due"), format!("r{i:04}"), now).ignore();
    }
    let _: () = pipe.query(&mut conn).unwrap();
    wait_for("all 2000 done", LONG, || (stat(&mut conn, "rated", "succeeded") == 2000).then_some(()));
    let starts: Vec<i64> = succeeded_events(&mut conn, "rated").into_iter().map(|(_, started)| started).collect();
    assert_rate_held(starts, 2000, 200.0, 10.0);
    let ran: Vec<usize> = hosts.iter().map(|h| h.log().matches("task_type=rated").count()).collect();
    assert!(ran.iter().filter(|n| **n > 0).count() >= 2, "one host did all the work: {ran:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn with_fairness_a_tenant_with_a_backlog_holds_another_back_by_one_claim_at_most() {
    let server = RedisServer::start();
    let mut c = server.client();
    let s = store(&server).await;
    let t = ty("orders");
    let now = redis_now(&mut c);
    // Tenant a: 20,000 tasks due for a while; tenant b: one task due now.
    let mut pipe = redis::pipe();
    for i in 0..20_000 {
        pipe.zadd(key("orders", "due"), format!("a:{i:05}"), now - 60_000 + i64::from(i) / 10).ignore();
    }
    pipe.zadd(key("orders", "due"), "b:1", now - 1).ignore();
    let _: () = pipe.query(&mut c).unwrap();

    // Without fairness, b waits behind a's whole backlog.
    let plain = s.claim(&t, &ClaimLimits { max_tasks: 64, ..limits() }).await.unwrap();
    assert!(!ids(&plain.tasks).contains(&"b:1".to_owned()));
    // With it, the very next claim takes b's task, and a's keep their order.
    let fair = ClaimLimits { max_tasks: 64, fair_by: Some(":".into()), ..limits() };
    let claimed = ids(&s.claim(&t, &fair).await.unwrap().tasks);
    assert!(claimed.contains(&"b:1".to_owned()), "{claimed:?}");
    assert_eq!(claimed.len(), 64);
    let a: Vec<&String> = claimed.iter().filter(|id| id.starts_with("a:")).collect();
    assert_eq!(a[0], "a:00064", "a's tasks continue oldest first after the 64 the plain claim took");
    assert!(a.windows(2).all(|w| w[0] < w[1]));
}

/// An HTTP server that holds every request `hold` before answering 200, and
/// records the most requests it had in flight at once.
struct ConcurrencyMeter {
    port: u16,
    peak: Arc<AtomicUsize>,
    served: Arc<AtomicUsize>,
}

impl ConcurrencyMeter {
    fn start(hold: Duration) -> ConcurrencyMeter {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let (peak, served) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let now = Arc::new(Mutex::new(0usize));
        let (p, s) = (peak.clone(), served.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                let (now, p, s) = (now.clone(), p.clone(), s.clone());
                std::thread::spawn(move || {
                    let mut reader = BufReader::new(stream.try_clone().unwrap());
                    let mut line = String::new();
                    while reader.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
                        line.clear();
                    }
                    {
                        let mut n = now.lock().unwrap();
                        *n += 1;
                        p.fetch_max(*n, Ordering::SeqCst);
                    }
                    std::thread::sleep(hold);
                    *now.lock().unwrap() -= 1;
                    s.fetch_add(1, Ordering::SeqCst);
                    let _ = stream.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
                });
            }
        });
        ConcurrencyMeter { port, peak, served }
    }
}
