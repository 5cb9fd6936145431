//! Recurring schedules and dedupe/debounce, against a real Redis: the claim
//! script's arming of occurrences directly through `Store`, then real hosts.
//! (The throttles all hosts share are `limits.rs`.)

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use crate::support::{Host, RedisServer, key, now_ms, plugin, redis_now, stat, store, ty, wait_for};
use hourglass::store::ClaimLimits;
use hourglass::task::ClaimedTask;
use hourglass::task::{Outcome, Settlement};
use redis::Commands;

const LONG: Duration = Duration::from_secs(120);

pub(super) fn limits() -> ClaimLimits {
    ClaimLimits { max_tasks: 100, lease: Duration::from_secs(60), ..ClaimLimits::default() }
}

pub(super) fn ids(tasks: &[ClaimedTask]) -> Vec<String> {
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

/// Every `(id, started_ms)` of the `succeeded` events of type `t`.
pub(super) fn succeeded_events(conn: &mut redis::Connection, t: &str) -> Vec<(String, i64)> {
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
