//! Workflow groups: the store's contract (open, add, seal, every way a child ends) and hosts running them
//! (in `hosts`), and the CLI and the Python and Node clients building them (in `clients`); and the
//! three clients writing the same bytes for random tasks (in `agree`).

mod agree;
mod clients;
mod graph_clients;
mod graphs;
mod handler_graphs;
mod hosts;

use std::time::Duration;

use crate::support::{RedisServer, ack, key, stat, store, ty};
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
        .settle(
            &ty("step"),
            &[ack(by_id(b"reserve"), vec![]), ended(by_id(b"charge"), Outcome::Dead { error: "card declined".into() })],
            None,
        )
        .await
        .unwrap();
    assert_eq!((results.len(), reports.outboxed), (2, 2));
    s.flush_outbox(&ty("step")).await.unwrap();
    assert!(summary(&mut c, "ship", "order-17").is_none(), "one child is still running");
    let view = s.group_show(&g).await.unwrap().unwrap();
    assert_eq!((view.state.as_str(), view.pending, view.succeeded, view.dead, view.cancelled), ("sealed", 1, 1, 1, 1));
    assert_eq!(view.pending_sample, vec!["step/mail".to_string()]);

    // A retry is not an end: the group keeps waiting.
    let mail = by_id(b"mail");
    let retry = Outcome::Retry { delay: Duration::from_millis(1), error: "smtp".into(), progress: None };
    assert_eq!(s.settle(&ty("step"), &[ended(mail, retry)], None).await.unwrap().1.outboxed, 0);
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
        let (_, reports) = s.settle(&ty(t), &acks, None).await.unwrap();
        assert_eq!(reports.outboxed, n);
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
        assert!(matches!(cancelled, hourglass::store::CancelEffect::Running { .. }), "{cancelled:?}");
    }
    // The first host stops its run and settles it as cancelled.
    let (_, reports) = s.settle(&ty("step"), &[ended(&stopped[0], Outcome::Cancelled)], None).await.unwrap();
    assert_eq!(reports.outboxed, 1);
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
