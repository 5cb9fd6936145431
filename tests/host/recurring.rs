//! Recurring schedules, throttles shared by all hosts, and dedupe/debounce,
//! against a real Redis: the claim script's arming of occurrences and its
//! limits directly through `Store`, then real hosts.

use std::collections::{BTreeMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::{Host, RedisServer, key, now_ms, plugin, redis_now, stat, store, test_plugin, ty, wait_for};
use hourglass::config::Rate;
use hourglass::store::{CancelEffect, ClaimLimits, ScheduleMode, TaskState};
use hourglass::task::ClaimedTask;
use hourglass::task::{Outcome, Settlement};
use redis::Commands;

const LONG: Duration = Duration::from_secs(120);

fn limits() -> ClaimLimits {
    ClaimLimits { max_tasks: 100, lease: Duration::from_secs(60), ..ClaimLimits::default() }
}

fn ids(tasks: &[ClaimedTask]) -> Vec<String> {
    tasks.iter().map(|t| String::from_utf8_lossy(&t.id).into_owned()).collect()
}

fn armed(conn: &mut redis::Connection, t: &str, name: &str) -> Option<String> {
    conn.hget(key(t, "recur"), format!("{name}:armed")).unwrap()
}

fn due_ids(conn: &mut redis::Connection, t: &str) -> Vec<String> {
    conn.zrange(key(t, "due"), 0, -1).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_claimed_occurrence_arms_the_next_one_in_the_same_step_and_only_once() {
    let server = RedisServer::start();
    let mut c = server.client();
    let s = store(&server).await;
    let t = ty("digest");
    let now = redis_now(&mut c);
    let times = [now - 5, now + 60_000, now + 120_000];
    assert!(s.recur_put(&t, "daily", "{\"rule\":\"test\"}", "latest", b"hello", &times).await.unwrap());
    assert!(!s.recur_put(&t, "daily", "{\"rule\":\"test\"}", "latest", b"hello", &times).await.unwrap(), "idempotent");
    assert_eq!(due_ids(&mut c, "digest"), vec![format!("daily@{}", now - 5)]);

    // Sixteen claimers at once: one gets the occurrence, and the next is armed once.
    let mut claims = Vec::new();
    for _ in 0..16 {
        let s = s.clone();
        let t = t.clone();
        claims.push(tokio::spawn(async move { s.claim(&t, &limits()).await.unwrap().tasks }));
    }
    let mut got = Vec::new();
    for claim in claims {
        got.extend(claim.await.unwrap());
    }
    assert_eq!(ids(&got), vec![format!("daily@{}", now - 5)]);
    assert_eq!(got[0].payload, b"hello");
    assert_eq!(
        due_ids(&mut c, "digest"),
        vec![format!("daily@{}", now + 60_000)],
        "exactly the next occurrence is due"
    );
    assert_eq!(armed(&mut c, "digest", "daily"), Some(format!("daily@{}", now + 60_000)));
    let then: String = c.hget(key("digest", "recur"), "daily:then").unwrap();
    assert_eq!(then, (now + 120_000).to_string());
    let payload: Option<String> = c.hget(key("digest", "payload"), format!("daily@{}", now + 60_000)).unwrap();
    assert_eq!(payload.as_deref(), Some("hello"));

    // A dead-lettered occurrence does not stop the next one: it is already armed.
    let dead =
        Settlement { lease: got[0].lease(), outcome: Outcome::Dead { error: "boom".into() }, run: Default::default() };
    s.settle(&t, &[dead], None).await.unwrap();
    assert_eq!(due_ids(&mut c, "digest"), vec![format!("daily@{}", now + 60_000)]);

    // Removing the schedule takes its armed occurrence out of due.
    assert!(s.recur_remove(&t, "daily").await.unwrap());
    assert!(due_ids(&mut c, "digest").is_empty());
    assert!(!s.recur_remove(&t, "daily").await.unwrap());
}

#[tokio::test(flavor = "multi_thread")]
async fn missed_occurrences_follow_the_schedules_policy() {
    let server = RedisServer::start();
    let mut c = server.client();
    let s = store(&server).await;
    let now = redis_now(&mut c);
    let missed = [now - 300_000, now - 200_000, now - 100_000, now + 100_000, now + 200_000];

    // latest: the claimed occurrence runs once, as the latest missed one; then the next to come.
    let t = ty("latest");
    s.recur_put(&t, "job", "x", "latest", b"", &missed).await.unwrap();
    let claimed = s.claim(&t, &limits()).await.unwrap().tasks;
    assert_eq!(ids(&claimed), vec![format!("job@{}", now - 100_000)]);
    assert_eq!(claimed[0].due_ms, now - 100_000);
    assert_eq!(due_ids(&mut c, "latest"), vec![format!("job@{}", now + 100_000)]);

    // all: every missed one runs, one after another.
    let t = ty("all");
    s.recur_put(&t, "job", "x", "all", b"", &missed).await.unwrap();
    let mut ran = Vec::new();
    for _ in 0..4 {
        ran.extend(ids(&s.claim(&t, &limits()).await.unwrap().tasks));
    }
    let expected: Vec<String> = missed[..3].iter().map(|ms| format!("job@{ms}")).collect();
    assert_eq!(ran, expected);
    assert_eq!(due_ids(&mut c, "all"), vec![format!("job@{}", now + 100_000)]);

    // skip: a missed one (over a minute late) is dropped unrun.
    let t = ty("skip");
    s.recur_put(&t, "job", "x", "skip", b"", &missed).await.unwrap();
    assert!(s.claim(&t, &limits()).await.unwrap().tasks.is_empty(), "a missed occurrence ran under skip");
    assert_eq!(due_ids(&mut c, "skip"), vec![format!("job@{}", now + 100_000)]);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_sync_rearms_a_stopped_chain_and_never_twice() {
    let server = RedisServer::start();
    let mut c = server.client();
    let s = store(&server).await;
    let t = ty("chain");
    let now = redis_now(&mut c);
    // Only one time known: the claim hands it out and has nothing to arm.
    s.recur_put(&t, "job", "def", "latest", b"", &[now - 1]).await.unwrap();
    let claimed = s.claim(&t, &limits()).await.unwrap().tasks;
    assert_eq!(claimed.len(), 1);
    assert!(due_ids(&mut c, "chain").is_empty());
    let state = s.recur_list(&t).await.unwrap().remove(0);
    assert_eq!(state.armed.as_deref(), Some(format!("job@{}", now - 1).as_str()));
    assert!(!state.armed_due, "the armed occurrence was handed out");

    // A host that read a different armed id (a claim raced it) writes nothing.
    let stale = s.recur_sync(&t, "job", "def", Some("job@1"), &[now + 1000]).await.unwrap();
    assert_eq!(stale, hourglass::store::SyncOutcome::Stale);
    assert!(due_ids(&mut c, "chain").is_empty());
    // The host that read this state re-arms the next one; doing it again changes nothing.
    let seen = state.armed.clone();
    let first = s.recur_sync(&t, "job", "def", seen.as_deref(), &[now + 1000, now + 2000]).await.unwrap();
    assert_eq!(first, hourglass::store::SyncOutcome::Armed);
    let again = s.recur_sync(&t, "job", "def", seen.as_deref(), &[now + 1000, now + 2000]).await.unwrap();
    assert_eq!(again, hourglass::store::SyncOutcome::Stale);
    assert_eq!(due_ids(&mut c, "chain"), vec![format!("job@{}", now + 1000)]);
}

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

/// Every `(id, started_ms)` of the `succeeded` events of type `t`.
fn succeeded_events(conn: &mut redis::Connection, t: &str) -> Vec<(String, i64)> {
    let reply: redis::streams::StreamRangeReply = conn.xrange_all(key(t, "events")).unwrap();
    reply
        .ids
        .iter()
        .filter(|e| e.get::<String>("outcome").as_deref() == Some("succeeded"))
        .map(|e| (e.get::<String>("id").unwrap(), e.get::<String>("started_ms").unwrap().parse().unwrap()))
        .collect()
}

#[test]
fn a_schedule_fires_every_occurrence_exactly_once_across_three_hosts_and_a_restart() {
    let redis = RedisServer::start();
    let config = |i: usize| {
        format!(
            "[runner]\nhost_id = \"h{i}\"\n[types.tick]\nevents = true\nevents_maxlen = 100000\n\
             [schedules.heartbeat]\ntype = \"tick\"\nevery = \"1s\"\npayload = \"beat\"\n"
        )
    };
    let mut hosts: Vec<Host> = (1..=3).map(|i| Host::start(&redis, &[("tick", plugin("noop"))], &config(i))).collect();
    let mut conn = redis.client();
    wait_for("four occurrences", LONG, || (stat(&mut conn, "tick", "succeeded") >= 4).then_some(()));
    // A restart mid-way: stop one host and start it again.
    hosts[1].signal("TERM");
    assert_eq!(hosts[1].wait_exit(LONG), Some(0));
    hosts[1].spawn();
    let after_restart = stat(&mut conn, "tick", "succeeded");
    wait_for("four more occurrences", LONG, || {
        (stat(&mut conn, "tick", "succeeded") >= after_restart + 4).then_some(())
    });
    // Stop the hosts, then read what ran.
    for host in &mut hosts {
        host.signal("TERM");
    }
    for host in &mut hosts {
        assert_eq!(host.wait_exit(LONG), Some(0));
    }
    let events = succeeded_events(&mut conn, "tick");
    let mut occurrences: Vec<i64> = events
        .iter()
        .map(|(id, _)| {
            id.strip_prefix("heartbeat@").unwrap_or_else(|| panic!("not an occurrence: {id}")).parse().unwrap()
        })
        .collect();
    let unique: HashSet<i64> = occurrences.iter().copied().collect();
    assert_eq!(unique.len(), occurrences.len(), "an occurrence ran twice: {occurrences:?}");
    occurrences.sort();
    assert!(occurrences.len() >= 8, "{occurrences:?}");
    for pair in occurrences.windows(2) {
        assert_eq!(
            pair[1] - pair[0],
            1000,
            "an occurrence is missing between {} and {}: {occurrences:?}",
            pair[0],
            pair[1]
        );
    }
    let payload_seen = hosts.iter().any(|h| h.log().contains("task_type=tick"));
    assert!(payload_seen);
    // `hourglass schedules` lists it, from runner.toml, with its next time.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hourglass"))
        .args(["--redis", &redis.url(), "schedules", "--json"])
        .output()
        .unwrap();
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(listed[0]["name"], "heartbeat");
    assert_eq!(listed[0]["source"], "config");
    assert_eq!(listed[0]["rule"], "every 1s");
    assert!(listed[0]["next_ms"].as_i64().is_some());
}

#[test]
fn a_schedule_made_from_the_cli_runs_and_an_edit_or_removal_takes_effect_at_once() {
    let redis = RedisServer::start();
    let host = Host::start(
        &redis,
        &[("tick", plugin("noop"))],
        "[types.tick]\nevents = true\n[admin]\nenabled = true\nlisten = \"127.0.0.1:0\"\n",
    );
    let cli = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_hourglass"))
            .arg("--redis")
            .arg(redis.url())
            .args(args)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, out, err) = cli(&["every", "often", "tick", "1s", "--payload", "p"]);
    assert!(ok, "{err}");
    assert!(out.starts_with("scheduled tick/often every 1s, next at "), "{out}");
    let mut conn = redis.client();
    wait_for("two occurrences", LONG, || (stat(&mut conn, "tick", "succeeded") >= 2).then_some(()));
    // A change: a cron far in the future replaces the armed occurrence.
    let (ok, out, err) = cli(&["cron", "often", "tick", "0 7 1 1 *", "--timezone", "Europe/Paris"]);
    assert!(ok, "{err}");
    assert!(out.contains("cron \"0 7 1 1 *\" in Europe/Paris"), "{out}");
    let due: Vec<(String, f64)> = conn.zrange_withscores(key("tick", "due"), 0, -1).unwrap();
    assert_eq!(due.len(), 1, "{due:?}");
    assert!(due[0].1 > (now_ms() + 3_600_000) as f64, "the new rule's occurrence is armed: {due:?}");
    let (ok, out, _) = cli(&["schedules"]);
    assert!(ok && out.contains("often") && out.contains("cli"), "{out}");
    let page = crate::support::get(&crate::support::admin_addr(&host), "/").body;
    assert!(
        page.contains("Recurring schedules") && page.contains("data-schedule=\"often\""),
        "the dashboard does not list it"
    );
    // Bad input: one line, nothing written.
    let (ok, _, err) = cli(&["cron", "other", "tick", "0 7 * *"]);
    assert!(!ok && err.lines().count() == 1 && err.contains("invalid cron expression"), "{err}");
    let (ok, _, err) = cli(&["every", "Bad@Name", "tick", "1s"]);
    assert!(!ok && err.contains("invalid schedule name"), "{err}");
    // Removal.
    let (ok, _, err) = cli(&["unschedule", "tick", "often"]);
    assert!(ok, "{err}");
    assert_eq!(crate::support::zcard(&mut conn, &key("tick", "due")), 0);
    let (ok, _, err) = cli(&["unschedule", "tick", "often"]);
    assert!(!ok && err.contains("there is no recurring schedule tick/often"), "{err}");
    drop(host);
}

#[test]
fn a_schedule_removed_from_runner_toml_stops_without_a_restart() {
    let redis = RedisServer::start();
    let host = Host::start(&redis, &[("tick", plugin("noop"))], "[schedules.beat]\ntype = \"tick\"\nevery = \"1s\"\n");
    let mut conn = redis.client();
    wait_for("an occurrence", LONG, || (stat(&mut conn, "tick", "succeeded") >= 1).then_some(()));
    let path = host.dir.path().join("runner.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let edited = text.replace("[schedules.beat]\ntype = \"tick\"\nevery = \"1s\"\n", "");
    assert_ne!(edited, text);
    std::fs::write(&path, edited).unwrap();
    host.wait_log("recurring schedule removed: runner.toml no longer has it", LONG);
    let fields: BTreeMap<String, String> = conn.hgetall(key("tick", "recur")).unwrap();
    assert!(fields.is_empty(), "{fields:?}");
    assert_eq!(crate::support::zcard(&mut conn, &key("tick", "due")), 0, "the armed occurrence went with it");
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
