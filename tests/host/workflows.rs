//! Workflow groups: the store's contract (open, add, seal, every way a child ends) and hosts running them.

use std::process::Command;
use std::time::Duration;

use crate::support::{Host, RedisServer, ack, key, now_ms, stat, store, test_plugin, ty, wait_for};
use hourglass::group::{Callback, FireWhen, GroupRef};
use hourglass::store::{ClaimLimits, Fired, GroupRefusal, NewChild, Sealed, Store};
use hourglass::task::{ClaimedTask, Outcome, Settlement};
use redis::Commands;

const WAIT: Duration = Duration::from_secs(60);

fn group(callback_type: &str, id: &str) -> GroupRef {
    GroupRef { callback_type: ty(callback_type), id: id.parse().unwrap() }
}

fn callback(id: &str, when: FireWhen) -> Callback {
    Callback { id: id.into(), payload: "order 17".into(), when, replace: true }
}

fn children(task_type: &str, ids: &[&str]) -> Vec<NewChild> {
    ids.iter()
        .map(|id| NewChild { task_type: ty(task_type), id: (*id).into(), payload: b"p".to_vec(), due_ms: 0 })
        .collect()
}

async fn claim_all(s: &Store, t: &str) -> Vec<ClaimedTask> {
    let limits = ClaimLimits { max_tasks: 100, lease: Duration::from_secs(60), ..ClaimLimits::default() };
    s.claim(&ty(t), &limits).await.unwrap().tasks
}

fn ended(task: &ClaimedTask, outcome: Outcome) -> Settlement {
    Settlement { lease: task.lease(), outcome, run: Default::default() }
}

/// The callback's summary, when it is scheduled (in `due` with its payload).
fn summary(c: &mut redis::Connection, callback_type: &str, id: &str) -> Option<serde_json::Value> {
    let due: Option<f64> = c.zscore(key(callback_type, "due"), id).unwrap();
    due?;
    let body: Vec<u8> = c.hget(key(callback_type, "payload"), id).unwrap();
    Some(serde_json::from_slice(&body).unwrap())
}

#[tokio::test(flavor = "multi_thread")]
async fn the_callback_fires_once_after_the_last_child_ends_and_learns_how_each_ended() {
    let server = RedisServer::start();
    let mut c = server.client();
    let s = store(&server).await;
    let g = group("ship", "order-17");
    assert!(s.group_open(&g, &callback("order-17", FireWhen::AllEnded)).await.unwrap());
    assert!(!s.group_open(&g, &callback("order-17", FireWhen::AllEnded)).await.unwrap(), "opening again joins");
    let added = s.group_add(&g, &children("step", &["reserve", "charge", "mail", "track"])).await.unwrap();
    assert_eq!(added.joined, 4);
    assert_eq!(s.group_add(&g, &children("step", &["mail"])).await.unwrap().joined, 0, "a child counts once");
    assert_eq!(s.group_seal(&g).await.unwrap(), Sealed::Sealed);

    // "track" is cancelled while it waits; the others run and end three ways.
    s.cancel(&ty("step"), b"track").await.unwrap();
    let tasks = claim_all(&s, "step").await;
    assert_eq!(tasks.len(), 3);
    let by_id = |id: &[u8]| tasks.iter().find(|t| t.id == id).unwrap();
    let (results, reports) = s
        .settle_reporting(
            &ty("step"),
            &[ack(by_id(b"reserve"), vec![]), ended(by_id(b"charge"), Outcome::Dead { error: "card declined".into() })],
            None,
        )
        .await
        .unwrap();
    assert_eq!((results.len(), reports), (2, 2));
    s.flush_outbox(&ty("step")).await.unwrap();
    assert!(summary(&mut c, "ship", "order-17").is_none(), "one child is still running");
    let view = s.group_show(&g).await.unwrap().unwrap();
    assert_eq!((view.state.as_str(), view.pending, view.succeeded, view.dead, view.cancelled), ("sealed", 1, 1, 1, 1));
    assert_eq!(view.pending_sample, vec!["step/mail".to_string()]);

    // A retry is not an end: the group keeps waiting.
    let mail = by_id(b"mail");
    let retry = Outcome::Retry { delay: Duration::from_millis(1), error: "smtp".into() };
    assert_eq!(s.settle_reporting(&ty("step"), &[ended(mail, retry)], None).await.unwrap().1, 0);
    std::thread::sleep(Duration::from_millis(5));
    let again = claim_all(&s, "step").await;
    assert_eq!(again.len(), 1);
    let flushed_before = stat(&mut c, "ship", "groups_completed");
    assert_eq!(flushed_before, 0);
    s.settle(&ty("step"), &[ack(&again[0], vec![])], None).await.unwrap();
    let flush = s.flush_outbox(&ty("step")).await.unwrap();
    assert_eq!(flush.groups.completed.len(), 1);
    assert_eq!(flush.groups.completed[0].1, Fired::Callback);

    let sum = summary(&mut c, "ship", "order-17").expect("the callback is scheduled");
    assert_eq!(sum["group"], "order-17");
    assert_eq!(sum["payload"], "order 17");
    assert_eq!((sum["added"].as_u64(), sum["succeeded"].as_u64()), (Some(4), Some(2)));
    assert_eq!((sum["dead"].as_u64(), sum["cancelled"].as_u64()), (Some(1), Some(1)));
    let mut failed: Vec<String> =
        sum["failed"].as_array().unwrap().iter().map(|f| format!("{}/{}", f["id"], f["outcome"])).collect();
    failed.sort();
    assert_eq!(failed, vec![r#""charge"/"dead""#, r#""track"/"cancelled""#]);
    assert_eq!(sum["failed_listed_all"], true);
    assert_eq!(stat(&mut c, "ship", "groups_completed"), 1);
    assert_eq!(stat(&mut c, "ship", "groups_opened"), 1);
    let stats = s.stats(&ty("ship")).await.unwrap();
    assert_eq!((stats.groups_open, stats.groups_completed, stats.groups_failed), (0, 1, 0));

    // Delivering the same reports again (a host that died before clearing its
    // outbox) changes nothing: every step runs once.
    let view = s.group_show(&g).await.unwrap().unwrap();
    assert_eq!((view.state.as_str(), view.fired.as_deref()), ("done", Some("callback")));
    let _: () = c.zrem(key("ship", "due"), "order-17").unwrap();
    assert_eq!(s.group_seal(&g).await.unwrap(), Sealed::Already);
    assert!(summary(&mut c, "ship", "order-17").is_none(), "a done group never fires again");
    let err = s.group_add(&g, &children("step", &["late"])).await.unwrap_err();
    assert!(format!("{err:#}").contains("is done"), "{err:#}");
    let err = s.group_open(&g, &callback("order-17", FireWhen::AllEnded)).await.unwrap_err();
    assert!(format!("{err:#}").contains("already completed"), "{err:#}");
    let no_member: Option<Vec<u8>> = c.hget(key("step", "member"), "mail").unwrap();
    assert!(no_member.is_none(), "an ended child leaves its group");
}

/// Children with nothing but their due entry (no payload, no attempts, no
/// errors: the cheapest acks the settle takes) still report to their group.
#[tokio::test(flavor = "multi_thread")]
async fn children_without_payloads_report_their_plain_acks() {
    let server = RedisServer::start();
    let mut c = server.client();
    let s = store(&server).await;
    let g = group("done", "bare-1");
    s.group_open(&g, &callback("bare-1", FireWhen::AllSucceeded)).await.unwrap();
    // Two types, interleaved: each run of one type is scheduled by its own call.
    let kinds = ["bare", "bare", "other", "bare", "other"];
    let kids: Vec<NewChild> = (0..5)
        .map(|i| NewChild { task_type: ty(kinds[i]), id: format!("k{i}"), payload: Vec::new(), due_ms: 0 })
        .collect();
    assert_eq!(s.group_add(&g, &kids).await.unwrap().joined, 5);
    assert_eq!(s.group_seal(&g).await.unwrap(), Sealed::Sealed);
    let present: bool = c.exists(key("bare", "payload")).unwrap();
    assert!(!present, "the children have no payload entry");
    for (t, n) in [("bare", 3), ("other", 2)] {
        let tasks = claim_all(&s, t).await;
        assert_eq!(tasks.len(), n, "{t}");
        let acks: Vec<Settlement> = tasks.iter().map(|t| ack(t, vec![])).collect();
        let (_, reports) = s.settle_reporting(&ty(t), &acks, None).await.unwrap();
        assert_eq!(reports, n);
        s.flush_outbox(&ty(t)).await.unwrap();
    }
    let sum = summary(&mut c, "done", "bare-1").expect("the callback is scheduled");
    assert_eq!((sum["added"].as_u64(), sum["succeeded"].as_u64()), (Some(5), Some(5)), "{sum}");
}

#[tokio::test(flavor = "multi_thread")]
async fn sealing_an_empty_group_fires_at_once_and_a_chain_stops_at_a_failure() {
    let server = RedisServer::start();
    let mut c = server.client();
    let s = store(&server).await;
    let empty = group("report", "nightly");
    s.group_open(&empty, &callback("nightly", FireWhen::AllEnded)).await.unwrap();
    assert_eq!(s.group_seal(&empty).await.unwrap(), Sealed::Completed(Fired::Callback));
    assert_eq!(summary(&mut c, "report", "nightly").unwrap()["added"], 0);

    // A chain: the next step only after this one succeeded.
    let chain = group("publish", "article-9");
    s.group_open(&chain, &callback("article-9", FireWhen::AllSucceeded)).await.unwrap();
    s.group_add(&chain, &children("render", &["article-9"])).await.unwrap();
    s.group_seal(&chain).await.unwrap();
    let tasks = claim_all(&s, "render").await;
    s.settle(&ty("render"), &[ended(&tasks[0], Outcome::Dead { error: "bad markdown".into() })], None).await.unwrap();
    let flush = s.flush_outbox(&ty("render")).await.unwrap();
    assert_eq!(flush.groups.completed[0].1, Fired::Skipped);
    assert!(summary(&mut c, "publish", "article-9").is_none());
    assert_eq!(stat(&mut c, "publish", "groups_failed"), 1);
    let view = s.group_show(&chain).await.unwrap().unwrap();
    assert_eq!((view.state.as_str(), view.dead, view.failed_sample.len()), ("done", 1, 1));
}

/// A report delivered twice (its host died after delivering it, before
/// clearing it from the outbox) counts once, even when the child has joined
/// the group again in between: the end counts only for the join it ended.
#[tokio::test(flavor = "multi_thread")]
async fn a_report_delivered_again_counts_once_even_after_the_child_joined_again() {
    let server = RedisServer::start();
    let mut c = server.client();
    let s = store(&server).await;
    let g = group("done", "again");
    s.group_open(&g, &callback("again", FireWhen::AllEnded)).await.unwrap();
    s.group_add(&g, &children("step", &["a"])).await.unwrap();
    let first = claim_all(&s, "step").await;
    s.settle(&ty("step"), &[ack(&first[0], vec![])], None).await.unwrap();
    let outbox: Vec<(Vec<u8>, Vec<u8>)> = c.hgetall(key("step", "outbox")).unwrap();
    assert_eq!(outbox.len(), 1, "the end's report waits in the outbox");
    s.flush_outbox(&ty("step")).await.unwrap();

    // The same child joins again and is pending; then the old report comes back.
    assert_eq!(s.group_add(&g, &children("step", &["a"])).await.unwrap().joined, 1);
    let _: () = c.hset(key("step", "outbox"), &outbox[0].0, &outbox[0].1).unwrap();
    s.flush_outbox(&ty("step")).await.unwrap();
    let view = s.group_show(&g).await.unwrap().unwrap();
    assert_eq!((view.added, view.pending, view.succeeded), (2, 1, 1), "the late duplicate changed nothing");

    // The second run's own end counts, and the group completes.
    s.group_seal(&g).await.unwrap();
    let second = claim_all(&s, "step").await;
    s.settle(&ty("step"), &[ack(&second[0], vec![])], None).await.unwrap();
    s.flush_outbox(&ty("step")).await.unwrap();
    let sum = summary(&mut c, "done", "again").expect("the callback is scheduled");
    assert_eq!((sum["added"].as_u64(), sum["succeeded"].as_u64()), (Some(2), Some(2)), "{sum}");
}

/// A running child that `hourglass cancel` stops counts as cancelled, both
/// when its host settles the stopped run and when its host died after the
/// cancel (the next claim reaps the lease and does not run it again).
#[tokio::test(flavor = "multi_thread")]
async fn a_running_child_cancelled_counts_as_cancelled_even_when_its_host_died() {
    let server = RedisServer::start();
    let mut c = server.client();
    let s = store(&server).await;
    let g = group("done", "run-cancel");
    s.group_open(&g, &callback("run-cancel", FireWhen::AllEnded)).await.unwrap();
    s.group_add(&g, &children("step", &["stopped", "orphaned"])).await.unwrap();
    s.group_seal(&g).await.unwrap();
    let short = ClaimLimits { max_tasks: 1, lease: Duration::from_secs(60), ..ClaimLimits::default() };
    let stopped = s.claim(&ty("step"), &short).await.unwrap().tasks;
    let brief = ClaimLimits { max_tasks: 1, lease: Duration::from_millis(1), ..ClaimLimits::default() };
    let orphaned = s.claim(&ty("step"), &brief).await.unwrap().tasks;
    assert_eq!((stopped.len(), orphaned.len()), (1, 1));
    for t in [&stopped[0], &orphaned[0]] {
        let cancelled = s.cancel(&ty("step"), &t.id).await.unwrap();
        assert!(matches!(cancelled, hourglass::store::Cancelled::Running { .. }), "{cancelled:?}");
    }
    // The first host stops its run and settles it as cancelled.
    let (_, reports) = s.settle_reporting(&ty("step"), &[ended(&stopped[0], Outcome::Cancelled)], None).await.unwrap();
    assert_eq!(reports, 1);
    // The second host died: its lease runs out, and the next claim reaps it.
    std::thread::sleep(Duration::from_millis(20));
    assert!(claim_all(&s, "step").await.is_empty(), "a cancelled run is not run again");
    s.flush_outbox(&ty("step")).await.unwrap();
    let sum = summary(&mut c, "done", "run-cancel").expect("the callback is scheduled");
    assert_eq!((sum["added"].as_u64(), sum["cancelled"].as_u64()), (Some(2), Some(2)), "{sum}");

    // A child dead-lettered by the claim itself (its payload is over max_payload) counts as dead.
    let g = group("done", "oversize");
    s.group_open(&g, &callback("oversize", FireWhen::AllEnded)).await.unwrap();
    s.group_add(&g, &children("step", &["big"])).await.unwrap();
    s.group_seal(&g).await.unwrap();
    let tight = ClaimLimits { max_payload_bytes: 0, ..ClaimLimits::default() };
    let claim = s.claim(&ty("step"), &tight).await.unwrap();
    assert!(claim.tasks.is_empty(), "an oversize child is never handed out");
    s.flush_outbox(&ty("step")).await.unwrap();
    let sum = summary(&mut c, "done", "oversize").expect("the callback is scheduled");
    assert_eq!(sum["failed"][0]["outcome"], "dead", "{sum}");
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_group_requests_are_refused_whole() {
    let server = RedisServer::start();
    let mut c = server.client();
    let s = store(&server).await;
    let g = group("ship", "g1");
    let err = s.group_add(&g, &children("step", &["a"])).await.unwrap_err();
    assert!(format!("{err:#}").contains("no group \"g1\""), "{err:#}");
    assert!(matches!(GroupRefusal::of(&err), Some(GroupRefusal::NoSuchGroup(_))), "{err:#}");
    assert_eq!(crate::support::zcard(&mut c, &key("step", "due")), 0, "nothing scheduled for a group that is not open");
    let err = s.group_seal(&g).await.unwrap_err();
    assert!(format!("{err:#}").contains("open it first"), "{err:#}");

    s.group_open(&g, &callback("cb-1", FireWhen::AllEnded)).await.unwrap();
    let err = s.group_open(&g, &callback("cb-2", FireWhen::AllEnded)).await.unwrap_err();
    assert!(format!("{err:#}").contains("is open with callback id \"cb-1\""), "{err:#}");
    assert!(matches!(GroupRefusal::of(&err), Some(GroupRefusal::Conflict(_))), "{err:#}");
    s.group_seal(&g).await.unwrap();
    let err = s.group_add(&g, &children("step", &["late"])).await.unwrap_err();
    assert!(matches!(GroupRefusal::of(&err), Some(GroupRefusal::Closed(_))), "{err:#}");

    // A task can be the child of one group at a time: another group's add
    // leaves it alone and counts it as cancelled there.
    let first = group("ship", "first");
    let second = group("ship", "second");
    for g in [&first, &second] {
        s.group_open(g, &callback(g.id.as_str(), FireWhen::AllEnded)).await.unwrap();
    }
    s.group_add(&first, &children("step", &["shared"])).await.unwrap();
    let added = s.group_add(&second, &children("step", &["shared"])).await.unwrap();
    assert_eq!(added.refused, vec![(ty("step"), "shared".to_string())]);
    let member: String = c.hget(key("step", "member"), "shared").unwrap();
    assert_eq!(member, "ship\nfirst\n1", "its group, and its join number there");
    s.group_seal(&second).await.unwrap();
    assert_eq!(summary(&mut c, "ship", "second").unwrap()["cancelled"], 1);

    // A wrong-typed group key: the whole step fails, nothing half-written.
    let _: () = c.set(key("ship", "group:broken"), "x").unwrap();
    let broken = group("ship", "broken");
    let err = s.group_open(&broken, &callback("b", FireWhen::AllEnded)).await.unwrap_err();
    assert!(format!("{err:#}").contains("holds a string, not a hash"), "{err:#}");
    assert_eq!(stat(&mut c, "ship", "groups_opened"), 3);
}

/// Three hosts run 10,000 children of one group; one host is killed mid-way.
/// A child adds a sibling at run time, a few children are dead-lettered, and
/// the callback type is served by no host, so its one scheduling stays visible.
#[test]
fn ten_thousand_children_over_three_hosts_one_killed_fire_the_callback_once() {
    const N: usize = 10_000;
    let server = RedisServer::start();
    let mut c = server.client();
    let config = "[runner]\nlease = \"2s\"\n[types.work]\nmay_schedule = [\"work\", \"done\"]\n";
    let plugins = [("work", test_plugin("chaos"))];
    let hosts: Vec<Host> = (0..3).map(|_| Host::start(&server, &plugins, config)).collect();
    let rt = crate::support::tokio_runtime();
    let s = rt.block_on(store(&server));
    let g = group("done", "big");
    rt.block_on(s.group_open(&g, &callback("big", FireWhen::AllEnded))).unwrap();
    // The children fall due once the group is sealed (the joiner runs first),
    // so the group completes at a child's end, not at the seal.
    let later = now_ms() + 4_000;
    let ok: Vec<String> = (0..N - 5).map(|i| format!("w-{i}")).collect();
    let mut kids: Vec<NewChild> = ok
        .iter()
        .map(|id| NewChild { task_type: ty("work"), id: id.clone(), payload: b"sleep:1".to_vec(), due_ms: later })
        .collect();
    for i in 0..4 {
        kids.push(NewChild {
            task_type: ty("work"),
            id: format!("doomed-{i}"),
            payload: b"permanent:no".to_vec(),
            due_ms: later,
        });
    }
    kids.push(NewChild {
        task_type: ty("work"),
        id: "joiner".into(),
        payload: b"join:done:big:work:late:ok".to_vec(),
        due_ms: now_ms(),
    });
    rt.block_on(s.group_add(&g, &kids)).unwrap();

    // The child added at run time must be waited for: seal only once it joined.
    wait_for("the joiner to add its sibling", WAIT, || {
        rt.block_on(s.group_show(&g)).unwrap().filter(|v| v.added == N as u64 + 1).map(|_| ())
    });
    assert_eq!(rt.block_on(s.group_seal(&g)).unwrap(), Sealed::Sealed);
    wait_for("a third of the children to end", WAIT, || {
        (stat(&mut c, "work", "succeeded") > (N / 3) as i64).then_some(())
    });
    hosts[1].signal("KILL");
    assert!(summary(&mut c, "done", "big").is_none(), "the callback waits for the children still running");

    let sum = wait_for("the callback", Duration::from_secs(180), || summary(&mut c, "done", "big"));
    assert_eq!(sum["added"].as_u64(), Some(N as u64 + 1));
    assert_eq!(sum["succeeded"].as_u64(), Some(N as u64 + 1 - 4), "every child but the doomed ones, the late one too");
    assert_eq!(sum["dead"].as_u64(), Some(4));
    assert_eq!(sum["cancelled"].as_u64(), Some(0));
    assert_eq!(stat(&mut c, "done", "groups_completed"), 1, "completed exactly once");
    let view = rt.block_on(s.group_show(&g)).unwrap().unwrap();
    assert_eq!((view.state.as_str(), view.pending), ("done", 0));
    let members: usize = redis::cmd("HLEN").arg(key("work", "member")).query(&mut c).unwrap();
    assert_eq!(members, 0, "every child left its group");
    drop(hosts);
}

/// Redis restarts (from its append-only file) while a group's children run:
/// nothing is lost, and the callback fires once with every child counted.
#[test]
fn a_redis_restart_mid_group_loses_no_child_and_no_callback() {
    let mut server = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let mut c = server.client();
    let config = "[runner]\nlease = \"2s\"\n";
    let host = Host::start(&server, &[("work", test_plugin("chaos"))], config);
    let rt = crate::support::tokio_runtime();
    let s = rt.block_on(store(&server));
    let g = group("done", "restart");
    rt.block_on(s.group_open(&g, &callback("restart", FireWhen::AllEnded))).unwrap();
    let kids: Vec<NewChild> = (0..400)
        .map(|i| NewChild {
            task_type: ty("work"),
            id: format!("r-{i}"),
            payload: b"sleep:20".to_vec(),
            due_ms: now_ms(),
        })
        .collect();
    rt.block_on(s.group_add(&g, &kids)).unwrap();
    rt.block_on(s.group_seal(&g)).unwrap();
    wait_for("some children to end", WAIT, || (stat(&mut c, "work", "succeeded") > 20).then_some(()));
    server.restart(&["--appendonly", "yes", "--appendfsync", "always"]);
    let mut c = server.client();
    let sum = wait_for("the callback", Duration::from_secs(180), || summary(&mut c, "done", "restart"));
    assert_eq!((sum["added"].as_u64(), sum["succeeded"].as_u64()), (Some(400), Some(400)));
    assert_eq!(stat(&mut c, "done", "groups_completed"), 1);
    drop(host);
}

/// A handler fans out through the SDK: opens a group, adds children, seals
/// it; all committed with its ack, and only where runner.toml grants it.
#[test]
fn a_handler_fans_out_and_the_grants_bound_it() {
    let server = RedisServer::start();
    let mut c = server.client();
    let config = "[admin]\nenabled = true\nlisten = \"127.0.0.1:0\"\n[types.fan]\nmay_schedule = [\"done\", \"work\"]\n\
                  [types.rogue]\nmay_schedule = [\"work\"]\n[types.work]\nevents = true\n";
    let plugins = [("fan", test_plugin("chaos")), ("work", test_plugin("chaos")), ("rogue", test_plugin("chaos"))];
    let host = Host::start(&server, &plugins, config);
    crate::support::schedule_now(&mut c, "fan", "f1", "fanout:done:g1:work:5:ok");
    let sum = wait_for("the callback", WAIT, || summary(&mut c, "done", "g1"));
    assert_eq!((sum["added"].as_u64(), sum["succeeded"].as_u64()), (Some(5), Some(5)));
    assert_eq!(sum["payload"], "from chaos");
    assert_eq!(stat(&mut c, "work", "succeeded"), 5);
    // Each child's completion event names its group.
    let events: redis::streams::StreamRangeReply = c.xrange_all(key("work", "events")).unwrap();
    assert_eq!(events.ids.len(), 5);
    for e in &events.ids {
        assert_eq!(e.get::<String>("group").as_deref(), Some("g1"), "{:?}", e.map);
    }

    // Without a grant for the callback's type the run fails, and nothing is opened.
    crate::support::schedule_now(&mut c, "rogue", "r1", "fanout:done:g2:work:5:ok");
    host.wait_log("may not schedule \"done\" tasks", WAIT);
    let rt = crate::support::tokio_runtime();
    let s = rt.block_on(store(&server));
    assert!(rt.block_on(s.group_show(&group("done", "g2"))).unwrap().is_none());
    let metrics = crate::support::get(&crate::support::admin_addr(&host), "/metrics").body;
    assert!(
        crate::support::sample(&metrics, "hourglass_groups_opened_total", &["type=\"done\""]).is_some_and(|v| v >= 1.0)
    );
    assert!(
        crate::support::sample(
            &metrics,
            "hourglass_groups_completed_total",
            &["type=\"done\"", "callback=\"callback\""]
        )
        .is_some_and(|v| v >= 1.0),
        "{metrics}"
    );

    // The dashboard: a group's page, and the open groups of its callback's type.
    let addr = crate::support::admin_addr(&host);
    let page = crate::support::get(&addr, "/group?type=done&group=g1");
    assert_eq!(page.status, 200);
    assert!(
        page.body.contains("data-state=done")
            && page.body.contains("5 succeeded · 0 dead · 0 cancelled · 0 pending, of 5 added")
            && page.body.contains("data-succeeded=5 style=\"width:100.00%\""),
        "{}",
        page.body
    );
    assert_eq!(crate::support::get(&addr, "/group?type=done&group=nope").status, 404);
    assert_eq!(crate::support::get(&addr, "/group?type=Bad&group=g1").status, 400);
    rt.block_on(s.group_open(&group("done", "still-open"), &callback("x", FireWhen::AllEnded))).unwrap();
    let listing = crate::support::get(&addr, "/?type=done").body;
    assert!(listing.contains("Open workflow groups") && listing.contains("still-open"), "{listing}");
    wait_for("the sampled gauge of open groups", WAIT, || {
        let metrics = crate::support::get(&addr, "/metrics").body;
        (crate::support::sample(&metrics, "hourglass_groups_open", &["type=\"done\""]) == Some(1.0)).then_some(())
    });
}

/// A client with nothing but the CLI: open, add, seal, show, cancel a child;
/// refusals and bad arguments are one line and a non-zero exit, and write nothing.
#[test]
fn the_cli_runs_a_group_and_refuses_bad_steps_in_one_line() {
    let redis = RedisServer::start();
    let mut c = redis.client();
    let ok = |args: &[&str]| {
        let out = crate::support::hourglass_on(&redis, args);
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    ok(&["group", "open", "order.ship", "o-17", "--payload", r#"{"order":"o-17"}"#]);
    ok(&["group", "add", "order.ship", "o-17", "order.reserve", "o-17"]);
    ok(&["group", "add", "order.ship", "o-17", "order.charge", "o-17", "--payload", r#"{"amount":4200}"#]);
    let sealed = ok(&["group", "seal", "order.ship", "o-17"]);
    assert!(sealed.contains("completes when its last pending child ends"), "{sealed}");
    let charge: Vec<u8> = c.hget(key("order.charge", "payload"), "o-17").unwrap();
    assert_eq!(charge, br#"{"amount":4200}"#, "the child is an ordinary task with its payload");

    // Cancelling a waiting child tells its group.
    ok(&["cancel", "order.charge", "o-17"]);
    let stats = ok(&["stats"]);
    assert!(stats.contains("GROUPS order.ship: 1 open, 0 completed"), "{stats}");
    let shown = ok(&["group", "show", "order.ship", "o-17", "--json"]);
    let view: serde_json::Value = serde_json::from_str(&shown).unwrap();
    assert_eq!((view["pending"].as_u64(), view["cancelled"].as_u64()), (Some(1), Some(1)), "{view}");

    // Refusals and bad arguments: one line naming the group, non-zero, nothing written.
    let before: Vec<(String, f64)> = c.zrange_withscores(key("order.mail", "due"), 0, -1).unwrap();
    let out = crate::support::hourglass_on(&redis, &["group", "add", "order.ship", "o-17", "order.mail", "late"]);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success());
    assert_eq!(err.trim(), r#"error: group order.ship/o-17: group "o-17" is sealed: no children can be added"#);
    let after: Vec<(String, f64)> = c.zrange_withscores(key("order.mail", "due"), 0, -1).unwrap();
    assert_eq!(before, after, "a refused add schedules nothing");
    let out = crate::support::hourglass_on(&redis, &["group", "show", "order.ship", "nope"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no group order.ship/nope"));
    for bad in [
        &["group", "open", "Bad", "g"][..],
        &["group", "open", "ship", "a\u{1}b"],
        &["group", "open", "ship", "g", "--when", "sometimes"],
        &["group", "add", "ship", "g", "step"],
    ] {
        let out = crate::support::hourglass_on(&redis, bad);
        assert!(!out.status.success(), "{bad:?} succeeded");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.trim().lines().count() <= 3 && err.contains("error"), "{bad:?}: {err}");
    }
    let keys: Vec<String> = c.keys("hourglass:{ship}:*").unwrap();
    assert!(keys.is_empty(), "bad arguments wrote {keys:?}");
}

/// Runs a Python program with the Python client (clients/python), the socket of `redis` as `sys.argv[1]`; its stdout.
fn python(redis: &RedisServer, program: &str) -> String {
    let dir = crate::support::workspace_root().join("clients/python");
    let python = dir.join(".venv/bin/python");
    assert!(python.exists(), "no {}: run 'bash clients/test.sh --install-only'", python.display());
    let program = format!(
        "import sys, redis, hourglass_client as hg\nc = hg.Hourglass(redis.Redis(unix_socket_path=sys.argv[1]), shards={{'work': 3}})\n{program}"
    );
    client_output("python", Command::new(python).arg("-c").arg(program).arg(redis.socket()).env("PYTHONPATH", dir))
}

/// Runs a Node program with the Node client (clients/node), the socket of `redis` as `process.argv[1]`; its stdout.
fn node(redis: &RedisServer, program: &str) -> String {
    let dir = crate::support::workspace_root().join("clients/node");
    assert!(
        dir.join("node_modules/ioredis").exists(),
        "no ioredis in {}: run 'bash clients/test.sh --install-only'",
        dir.display()
    );
    let program = format!(
        "const Redis = require('ioredis'); const hg = require('./index.js');\n\
         const r = new Redis({{ path: process.argv[1] }}); const c = new hg.Hourglass(r, {{ shards: {{ work: 3 }} }});\n\
         (async () => {{ {program} }})().then(() => r.disconnect(), (e) => {{ console.error(e); process.exit(1); }});"
    );
    client_output("node", Command::new("node").arg("-e").arg(program).arg(redis.socket()).current_dir(dir))
}

fn client_output(what: &str, command: &mut Command) -> String {
    let out = command.output().unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    assert!(out.status.success(), "{what}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// One group built by four clients, each running the host's own scripts:
/// Python opens it, Node, the CLI and the Rust API add children of a sharded
/// type (each routing them itself), Python adds more and seals it; a host
/// runs every child, and the callback is scheduled exactly once, counting all
/// of them. All route a sharded type's ids as the host does, a running task
/// cancelled from Node is stopped by its host, and a refusal reaches Python
/// and Node as their typed errors.
#[test]
fn python_node_the_cli_and_rust_build_one_group_and_its_callback_fires_once() {
    let server = RedisServer::start();
    let mut c = server.client();
    let host = Host::start(&server, &[("work", test_plugin("chaos"))], "[types.work]\nshards = 3\n");
    let config = host.dir.path().join("runner.toml");
    let cli = |args: &[&str]| {
        let mut all = vec!["--config", config.to_str().unwrap()];
        all.extend_from_slice(args);
        let out = crate::support::hourglass_on(&server, &all);
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };

    // Routing: ids the CLI schedules an hour out are where both clients look first.
    let ids: Vec<String> = (0..12).map(|i| format!("route-{i}")).collect();
    for id in &ids {
        cli(&["schedule", "work", id, "--in", "1h"]);
    }
    let listed = format!("{ids:?}");
    let py = python(
        &server,
        &format!(
            "for i in {listed}:\n  v = c.show('work', i)\n  assert v.state == 'scheduled' and v.task_type == c.shard_for('work', i), (i, v)\n  print(v.shard)"
        ),
    );
    let js = node(
        &server,
        &format!(
            "for (const i of {listed}) {{ const v = await c.show('work', i); if (v.state !== 'scheduled' || v.taskType !== c.shardFor('work', i)) throw new Error(i); console.log(v.shard); }}"
        ),
    );
    assert_eq!(py, js, "both clients name the same shards");
    let rt = crate::support::tokio_runtime();
    let s = rt.block_on(store(&server)).with_type_shards(&ty("work"), 3);
    let work = ty("work");
    let rust: Vec<String> =
        ids.iter().map(|id| s.shard_index(&s.shard_for(&work, id.as_bytes())).unwrap().to_string()).collect();
    assert_eq!(py, rust.join("\n"), "the clients route as the host does");
    let shards: std::collections::BTreeSet<&str> = py.lines().collect();
    assert_eq!(shards.len(), 3, "12 ids spread over the 3 shards: {py}");
    for id in &ids {
        cli(&["cancel", "work", id]);
    }

    // A running task cancelled from Node: its host stops the run, and Python sees it gone and counted.
    python(&server, "assert c.schedule('work', 'long-1', payload='sleep:30000')");
    wait_for("the long task to run", WAIT, || {
        (python(&server, "print(c.show('work', 'long-1').state)") == "running").then_some(())
    });
    let cancelled = node(&server, "const r = await c.cancel('work', 'long-1'); console.log(r.state, r.holder !== '');");
    assert_eq!(cancelled, "running true", "the cancel reached the run, and named its host");
    wait_for("its host to stop it", WAIT, || {
        let seen = python(&server, "print(c.show('work', 'long-1').state, c.stats('work').cancelled)");
        (seen == "unknown 1").then_some(())
    });

    // The children fall due a few seconds out, so none ends before every client added its own.
    let later = now_ms() + 3_000;
    python(&server, "assert c.group_open('done', 'mixed', callback_id='cb', payload='from python')");
    node(
        &server,
        &format!(
            "const a = await c.groupAdd('done', 'mixed', Array.from({{ length: 10 }}, (_, i) => ({{ taskType: 'work', id: `js-${{i}}`, payload: 'ok', dueMs: {later} }}))); if (a.joined !== 10) throw new Error(JSON.stringify(a));"
        ),
    );
    let cli_ids: Vec<String> = (0..10).map(|i| format!("cli-{i}")).collect();
    let mut add = vec!["group", "add", "done", "mixed", "work"];
    add.extend(cli_ids.iter().map(String::as_str));
    let at = later.to_string();
    add.extend(["--at", &at, "--payload", "ok"]);
    cli(&add);
    let rust_kids: Vec<NewChild> = (0..10)
        .map(|i| NewChild { task_type: work.clone(), id: format!("rs-{i}"), payload: b"ok".to_vec(), due_ms: later })
        .collect();
    assert_eq!(rt.block_on(s.group_add(&group("done", "mixed"), &rust_kids)).unwrap().joined, 10);
    python(
        &server,
        &format!(
            "a = c.group_add('done', 'mixed', [hg.Child('work', f'py-{{i}}', payload='ok', due_ms={later}) for i in range(10)])\nassert a.joined == 10, a\nassert c.group_seal('done', 'mixed') == 'sealed'"
        ),
    );
    // Refusals are typed in both.
    python(
        &server,
        "try:\n  c.group_add('done', 'mixed', [hg.Child('work', 'late')])\n  raise SystemExit('added to a sealed group')\nexcept hg.GroupClosed:\n  pass",
    );
    node(
        &server,
        "try { await c.groupAdd('done', 'mixed', [{ taskType: 'work', id: 'late' }]); throw new Error('added'); } catch (e) { if (!(e instanceof hg.GroupClosed)) throw e; }",
    );

    let sum = wait_for("the callback", WAIT, || summary(&mut c, "done", "cb"));
    assert_eq!((sum["added"].as_u64(), sum["succeeded"].as_u64()), (Some(40), Some(40)), "{sum}");
    assert_eq!(sum["payload"], "from python");
    assert_eq!(stat(&mut c, "done", "groups_completed"), 1, "completed exactly once");
    let seen = python(&server, "v = c.group_show('done', 'mixed')\nprint(v.state, v.added, v.succeeded, v.fired)");
    assert_eq!(seen, "done 40 40 callback");
    let counted =
        python(&server, "s = c.stats('work')\nprint(s.succeeded, s.dead_total, s.due_now + s.scheduled_later)");
    assert_eq!(counted, "40 0 0", "every child succeeded, over the 3 shards, and nothing is left");
}
