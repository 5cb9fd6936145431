//! Every task script (schedule, one or in a batch, cancel, claim, settle, extend, release, the outbox's delivery, the dead letters, stats, pause and resume) with each of its keys broken fails cleanly, loses no task, and completes once the key is fixed.

use std::time::Duration;

use super::{Bad, IDS, KINDS, limits, plant, snapshot};
use crate::support::{RedisServer, ack, key, ty};
use hourglass::config::KeyPrefix;
use hourglass::observe::health::{Trouble, classify};
use hourglass::store::{ClaimLimits, ScheduleMode, Store};
use hourglass::task::{ClaimedTask, FollowUp};
use hourglass::task::{Outcome, Settlement};
use redis::Commands;

fn fail(task: &ClaimedTask, dead: bool) -> Settlement {
    let outcome = if dead {
        Outcome::Dead { error: "boom".into() }
    } else {
        Outcome::Retry { delay: Duration::ZERO, error: "again".into(), progress: None }
    };
    Settlement { lease: task.lease(), outcome, run: Default::default() }
}

/// The scripts, each with the keys it touches and how to run it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Script {
    Schedule,
    /// Many tasks in one call (`schedule_batch.lua`).
    ScheduleBatch,
    Cancel,
    Claim,
    Settle,
    /// Settle with acks only (no follow-ups, no events): the per-claim mask path.
    SettleAcks,
    Extend,
    Release,
    Deliver,
    DeadRequeue,
    DeadPurge,
    DeadList,
    Stats,
    Pause,
    Resume,
}

impl Script {
    /// `(key suffix of type "wt" or "next", expected kind)`; "next:" marks the follow-up target.
    fn keys(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Script::Schedule | Script::ScheduleBatch => &[("due", "zset"), ("payload", "hash")],
            Script::Cancel => &[
                ("due", "zset"),
                ("payload", "hash"),
                ("tokens", "hash"),
                ("claimed", "hash"),
                ("cancels", "hash"),
                ("member", "hash"),
                ("outbox", "hash"),
                ("progress", "hash"),
            ],
            Script::Claim => &[
                ("due", "zset"),
                ("payload", "hash"),
                ("leases", "zset"),
                ("tokens", "hash"),
                ("attempts", "hash"),
                ("errors", "hash"),
                ("dead", "zset"),
                ("seq", "string"),
                ("stats", "hash"),
                ("recur", "hash"),
                ("throttle", "hash"),
                ("paused", "string"),
                ("cancels", "hash"),
                ("claims", "zset"),
                ("claimed", "hash"),
                ("member", "hash"),
            ],
            Script::Settle => &[
                ("due", "zset"),
                ("payload", "hash"),
                ("claims", "zset"),
                ("claimed", "hash"),
                ("attempts", "hash"),
                ("errors", "hash"),
                ("dead", "zset"),
                ("stats", "hash"),
                ("outbox", "hash"),
                ("events", "stream"),
                ("cancels", "hash"),
                ("member", "hash"),
                ("progress", "hash"),
            ],
            // Plain acks touch no dead letters, outbox or events; `due` only
            // because the scene's tasks have payloads (kept if due again).
            Script::SettleAcks => &[
                ("due", "zset"),
                ("payload", "hash"),
                ("claims", "zset"),
                ("claimed", "hash"),
                ("attempts", "hash"),
                ("errors", "hash"),
                ("stats", "hash"),
                ("cancels", "hash"),
                ("member", "hash"),
                ("progress", "hash"),
            ],
            Script::Extend => &[("claims", "zset"), ("claimed", "hash"), ("cancels", "hash")],
            Script::Release => &[("claims", "zset"), ("claimed", "hash"), ("due", "zset")],
            Script::Deliver => {
                &[("next:due", "zset"), ("next:payload", "hash"), ("next:dead", "zset"), ("next:marker", "string")]
            }
            Script::DeadRequeue => &[("dead", "zset"), ("attempts", "hash"), ("errors", "hash"), ("due", "zset")],
            Script::DeadPurge => {
                &[("dead", "zset"), ("attempts", "hash"), ("errors", "hash"), ("due", "zset"), ("payload", "hash")]
            }
            Script::DeadList => &[("dead", "zset"), ("errors", "hash"), ("attempts", "hash"), ("payload", "hash")],
            Script::Stats => &[
                ("due", "zset"),
                ("leases", "zset"),
                ("dead", "zset"),
                ("stats", "hash"),
                ("payload", "hash"),
                ("tokens", "hash"),
                ("attempts", "hash"),
                ("errors", "hash"),
                ("seq", "string"),
                ("outbox", "hash"),
                ("events", "stream"),
                ("recur", "hash"),
                ("throttle", "hash"),
                ("paused", "string"),
                ("cancels", "hash"),
                ("claims", "zset"),
                ("claimed", "hash"),
                ("groups", "zset"),
                ("member", "hash"),
            ],
            Script::Pause | Script::Resume => &[("paused", "string"), ("due", "zset")],
        }
    }

    /// Keys where the script parses or increments a number: `(key suffix, bad value)`.
    fn numbers(self) -> &'static [(&'static str, Bad)] {
        match self {
            Script::Claim => &[
                ("seq", Bad::NotANumber),
                ("stats", Bad::FieldNotANumber("dead")),
                ("claimed", Bad::FieldNotANumber("leased")),
            ],
            Script::Settle => &[
                ("stats", Bad::FieldNotANumber("succeeded")),
                ("stats", Bad::FieldNotANumber("dead")),
                ("stats", Bad::FieldNotANumber("cancelled")),
                ("claimed", Bad::FieldNotANumber("leased")),
            ],
            Script::SettleAcks => {
                &[("stats", Bad::FieldNotANumber("succeeded")), ("claimed", Bad::FieldNotANumber("leased"))]
            }
            Script::Release => &[("claimed", Bad::FieldNotANumber("leased"))],
            Script::Cancel => &[("seq", Bad::NotANumber)],
            Script::Stats => &[
                ("seq", Bad::NotANumber),
                ("stats", Bad::FieldNotANumber("failed")),
                ("stats", Bad::FieldNotANumber("groups_completed")),
                ("claimed", Bad::FieldNotANumber("leased")),
            ],
            _ => &[],
        }
    }
}

/// The state a script runs against: tasks in flight for it to act on.
struct Scene {
    claimed: Vec<ClaimedTask>,
    /// The delivery marker key of the one outbox entry (Deliver).
    marker: String,
}

/// Five tasks due now (with payloads), one of them a lease that has expired,
/// and whatever the script needs on top: claimed tasks, dead tasks, an outbox entry.
async fn scene(s: &Store, c: &mut redis::Connection, script: Script) -> Scene {
    let _: () = redis::cmd("FLUSHALL").query(c).unwrap();
    let t = ty("wt");
    if matches!(script, Script::Schedule | Script::ScheduleBatch) {
        return Scene { claimed: Vec::new(), marker: String::new() };
    }
    for id in IDS {
        let _: () = c.hset(key("wt", "payload"), id, format!("body of {id}")).unwrap();
        let _: () = c.zadd(key("wt", "due"), id, 1).unwrap();
    }
    // One lease that has run out, for claim's reap step.
    let short = ClaimLimits { max_tasks: 1, lease: Duration::from_millis(1), ..ClaimLimits::default() };
    let expired = s.claim(&t, &short).await.unwrap();
    assert_eq!(expired.tasks.len(), 1);
    tokio::time::sleep(Duration::from_millis(5)).await;
    if script == Script::Claim {
        // A recurring schedule whose armed occurrence is due: the claim arms the next one.
        s.recur_put(&t, "hourly", "{\"rule\":\"every 1h\"}", "latest", b"", &[1, 3_600_001, 7_200_001]).await.unwrap();
    }
    let mut claimed = Vec::new();
    let mut marker = String::new();
    match script {
        Script::Settle
        | Script::SettleAcks
        | Script::Extend
        | Script::Release
        | Script::Deliver
        | Script::DeadRequeue
        | Script::DeadPurge
        | Script::DeadList
        | Script::Stats => {
            claimed = s.claim(&t, &limits()).await.unwrap().tasks;
            assert_eq!(claimed.len(), 5, "the expired lease is claimed again with the rest");
        }
        _ => {}
    }
    if script == Script::Deliver {
        let f =
            FollowUp { task_type: ty("next"), id: b"f-1".to_vec(), payload: b"p".to_vec(), due_ms: 1, replace: false };
        // An outbox entry as a cluster's settle leaves it (one server's delivers it at once).
        let _: () = c.hset(key("wt", "outbox"), "wt:7:0:create", hourglass::store::encode_followup(&f)).unwrap();
        marker = "hourglass:{next}:delivered:wt:7:0:create".to_string();
    }
    if matches!(script, Script::DeadRequeue | Script::DeadPurge | Script::DeadList | Script::Stats) {
        let dead: Vec<Settlement> = claimed.iter().take(3).map(|t| fail(t, true)).collect();
        s.settle(&t, &dead, None).await.unwrap();
    }
    Scene { claimed, marker }
}

/// Runs the script under test once; `Ok` with the tasks it claimed (for the
/// caller to finish) when it did its work, `Err` with its error.
async fn run(s: &Store, script: Script, scene: &Scene) -> Result<Vec<ClaimedTask>, String> {
    let t = ty("wt");
    let leases: Vec<hourglass::task::Lease> = scene.claimed.iter().map(hourglass::task::ClaimedTask::lease).collect();
    let err = |e: anyhow::Error| format!("{e:#}");
    match script {
        Script::Schedule => s.schedule(&t, b"w-9", 1, Some(b"body"), ScheduleMode::Upsert).await.map(none).map_err(err),
        Script::ScheduleBatch => {
            let task = |id: &str| hourglass::store::NewTask {
                task_type: t.clone(),
                id: id.into(),
                due_ms: 1,
                payload: Some(b"body".to_vec()),
                mode: ScheduleMode::Upsert,
            };
            s.schedule_many(&[task("w-9"), task("w-8")]).await.map(none).map_err(err)
        }
        Script::Cancel => s.cancel(&t, b"w-5").await.map(none).map_err(err),
        Script::Claim => s.claim(&t, &limits()).await.map(|claim| claim.tasks).map_err(err),
        Script::Settle => {
            let c = &scene.claimed;
            let follow =
                FollowUp { task_type: ty("next"), id: b"f-2".to_vec(), payload: Vec::new(), due_ms: 1, replace: true };
            let batch = vec![
                ack(&c[0], vec![follow]),
                ack(&c[1], vec![]),
                ack(&c[2], vec![]),
                fail(&c[3], false),
                fail(&c[4], true),
            ];
            s.settle(&t, &batch, Some(100)).await.map(none).map_err(err)
        }
        Script::SettleAcks => {
            let batch: Vec<Settlement> = scene.claimed.iter().map(|c| ack(c, vec![])).collect();
            s.settle(&t, &batch, None).await.map(none).map_err(err)
        }
        Script::Extend => s.extend(&t, &leases, 60_000).await.map(none).map_err(err),
        Script::Release => s.release(&t, &leases).await.map(none).map_err(err),
        Script::Deliver => {
            let flushed = s.flush_outbox(&t).await.map_err(err)?;
            match flushed.failed.into_iter().next() {
                Some((target, e)) => {
                    assert_eq!(target, ty("next"));
                    assert_ne!(classify(&e), Trouble::Outage, "a data fault, not an outage: {e:#}");
                    Err(err(e))
                }
                None => Ok(Vec::new()),
            }
        }
        Script::DeadRequeue => s.dead_requeue(&t, None).await.map(none).map_err(err),
        Script::DeadPurge => s.dead_purge(&t, None).await.map(none).map_err(err),
        Script::DeadList => s.dead_list(&t, 100).await.map(none).map_err(err),
        Script::Pause => {
            let paused = s.pause(&t, Some(Duration::from_millis(1))).await.map(none).map_err(err);
            // A pause of 1 ms: over before the tasks are driven to their end.
            tokio::time::sleep(Duration::from_millis(10)).await;
            paused
        }
        Script::Resume => s.resume(&t).await.map(none).map_err(err),
        Script::Stats => match s.stats(&t).await {
            Ok(stats) => match stats.fault {
                Some(fault) => Err(fault),
                None => Ok(Vec::new()),
            },
            Err(e) => Err(err(e)),
        },
    }
}

/// A script's result that claimed nothing.
fn none<T>(_: T) -> Vec<ClaimedTask> {
    Vec::new()
}

/// After the key is fixed: the script works, and every task reaches its end.
async fn complete(s: &Store, c: &mut redis::Connection, script: Script, scene: &Scene) {
    let claimed = run(s, script, scene).await.unwrap_or_else(|e| panic!("{script:?} still fails after the fix: {e}"));
    let t = ty("wt");
    if !claimed.is_empty() {
        let batch: Vec<Settlement> = claimed.iter().map(|t| ack(t, vec![])).collect();
        s.settle(&t, &batch, None).await.unwrap();
    }
    // Drive what is left to the end: claim and ack until nothing is due or leased.
    for _ in 0..20 {
        let claim = s.claim(&t, &limits()).await.unwrap();
        if claim.tasks.is_empty() {
            break;
        }
        let batch: Vec<Settlement> = claim.tasks.iter().map(|t| ack(t, vec![])).collect();
        s.settle(&t, &batch, None).await.unwrap();
    }
    // Leases the scene's own claim still holds (settled ones are fenced, changing nothing).
    let batch: Vec<Settlement> = scene.claimed.iter().map(|t| ack(t, vec![])).collect();
    if !batch.is_empty() {
        s.settle(&t, &batch, None).await.unwrap();
    }
    let due: usize = c.zcard(key("wt", "due")).unwrap();
    let leases = crate::support::leases(c, "wt").len();
    let dead: usize = c.zcard(key("wt", "dead")).unwrap();
    let succeeded: Option<u64> = c.hget(key("wt", "stats"), "succeeded").unwrap();
    assert_eq!(leases, 0, "{script:?}: tasks left leased");
    // Nothing vanished: every task succeeded or is dead (the dead scenes keep some dead; a purge removes them).
    let accounted = succeeded.unwrap_or(0) as usize + dead;
    match script {
        Script::DeadPurge => assert!(accounted >= 2, "{script:?}: succeeded {succeeded:?}, dead {dead}"),
        Script::Schedule | Script::ScheduleBatch => assert_eq!(due, 0),
        Script::Cancel => assert_eq!(accounted, 4, "{script:?}: one task was cancelled, the rest ran"),
        _ => assert!(accounted >= 5, "{script:?}: only {accounted} of 5 tasks accounted for"),
    }
    assert_eq!(due, 0, "{script:?}: tasks left due");
    if script == Script::Deliver {
        let delivered: Option<f64> = c.zscore(key("next", "due"), "f-1").unwrap();
        assert!(delivered.is_some(), "the follow-up was not delivered after the fix");
    }
}

/// Every id of the scene is somewhere: due, leased or dead (or, the one the
/// Deliver scene acked with its follow-up, settled).
fn no_task_vanished(c: &mut redis::Connection, script: Script, scene: &Scene) {
    if matches!(script, Script::Schedule | Script::ScheduleBatch) {
        return;
    }
    for id in IDS {
        let places: Vec<Option<f64>> =
            ["due", "dead"].iter().map(|k| c.zscore(key("wt", k), id).unwrap_or(None)).collect();
        let saved: Vec<Option<f64>> =
            ["due", "dead"].iter().map(|k| c.zscore(format!("{}:saved", key("wt", k)), id).unwrap_or(None)).collect();
        let tokens = key("wt", "tokens");
        let leased = crate::support::leases_in(c, &key("wt", "claimed"), &tokens).contains_key(id)
            || crate::support::leases_in(c, &format!("{}:saved", key("wt", "claimed")), &tokens).contains_key(id);
        let settled_ok = script == Script::Deliver && scene.claimed[0].id == id.as_bytes();
        assert!(
            places.iter().chain(&saved).any(Option::is_some) || leased || settled_ok,
            "{script:?}: task {id} is in none of due, leases and dead"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_broken_key_fails_every_script_cleanly_and_loses_nothing() {
    let server = RedisServer::start();
    let mut c = server.client();
    let prefix: KeyPrefix = "hourglass".parse().unwrap();
    let s = Store::connect(&server.url(), &prefix).await.unwrap();
    let scripts = [
        Script::Schedule,
        Script::ScheduleBatch,
        Script::Cancel,
        Script::Claim,
        Script::Settle,
        Script::SettleAcks,
        Script::Extend,
        Script::Release,
        Script::Deliver,
        Script::DeadRequeue,
        Script::DeadPurge,
        Script::DeadList,
        Script::Stats,
        Script::Pause,
        Script::Resume,
    ];
    let mut cases = 0;
    for script in scripts {
        let mut plan: Vec<(&str, Bad)> = Vec::new();
        for &(suffix, expected) in script.keys() {
            for kind in KINDS.into_iter().filter(|k| *k != expected) {
                plan.push((suffix, Bad::Kind(kind)));
            }
        }
        plan.extend(script.numbers().iter().copied());
        for (suffix, bad) in plan {
            let scene = scene(&s, &mut c, script).await;
            let k = match suffix {
                "next:due" => key("next", "due"),
                "next:payload" => key("next", "payload"),
                "next:dead" => key("next", "dead"),
                "next:marker" => scene.marker.clone(),
                other => key("wt", other),
            };
            let saved = format!("{k}:saved");
            let existed: bool = c.exists(&k).unwrap();
            if existed {
                let _: () = c.rename(&k, &saved).unwrap();
            }
            if let Bad::FieldNotANumber(_) = bad
                && existed
            {
                // The other counters stay: copy them back under the bad field.
                let _: () = redis::cmd("COPY").arg(&saved).arg(&k).query(&mut c).unwrap();
            }
            plant(&mut c, &k, bad);
            let before = snapshot(&mut c, &[&k, &saved]);
            let outcome = run(&s, script, &scene).await;
            let error = outcome.expect_err(&format!("{script:?} with {bad:?} at {k} did not fail"));
            assert!(error.contains(&k), "{script:?} with {bad:?}: the error does not name {k}: {error}");
            assert!(error.contains("DEL") || error.contains("HSET"), "{script:?}: the error gives no fix: {error}");
            let after = snapshot(&mut c, &[&k, &saved]);
            assert!(before == after, "{script:?} with {bad:?} at {k} wrote before failing");
            no_task_vanished(&mut c, script, &scene);

            // The fix: the bad value goes, the real key comes back.
            let _: () = redis::cmd("DEL").arg(&k).query(&mut c).unwrap();
            if existed {
                let _: () = c.rename(&saved, &k).unwrap();
            }
            complete(&s, &mut c, script, &scene).await;
            cases += 1;
        }
    }
    assert!(cases > 200, "only {cases} cases ran");
}
