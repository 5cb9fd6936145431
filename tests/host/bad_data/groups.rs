//! Every workflow group step (open, add, seal, a child's end delivered from the outbox) with each of its keys broken fails cleanly and completes the group once the key is fixed.

use super::{Bad, KINDS, limits, plant, snapshot};
use crate::support::{RedisServer, ack, key, ty};
use hourglass::store::Store;
use redis::Commands;

/// The workflow group scripts (open, add, seal, and a child's end delivered
/// from the outbox): a wrong-typed key or a counter that is not a number fails
/// the step with an error naming the key, writes nothing in that step's
/// slot, and the same step completes the group once the key is fixed.
#[tokio::test(flavor = "multi_thread")]
async fn a_broken_key_fails_every_group_step_cleanly() {
    use hourglass::group::{Callback, FireWhen, GroupRef};
    use hourglass::store::NewChild;

    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Step {
        Open,
        Add,
        Seal,
        Report,
    }
    let server = RedisServer::start();
    let mut c = server.client();
    let s = Store::connect(&server.url(), &"hourglass".parse().unwrap()).await.unwrap();
    let g = GroupRef { callback_type: ty("cb"), id: "g".parse().unwrap() };
    let cb = Callback { id: "cb-1".into(), payload: "p".into(), when: FireWhen::AllEnded, replace: true };
    let child = || vec![NewChild { task_type: ty("wt"), id: "w-1".into(), payload: b"x".to_vec(), due_ms: 1 }];
    let group_keys: &[(&str, &str)] = &[("cb:group:g", "hash"), ("cb:group-pending:g", "hash")];
    let end_keys: &[(&str, &str)] = &[
        ("cb:group:g", "hash"),
        ("cb:group-pending:g", "hash"),
        ("cb:group-failed:g", "hash"),
        ("cb:groups", "zset"),
        ("cb:due", "zset"),
        ("cb:payload", "hash"),
        ("cb:dead", "zset"),
    ];
    let child_keys: &[(&str, &str)] = &[
        ("wt:due", "zset"),
        ("wt:payload", "hash"),
        ("wt:member", "hash"),
        ("wt:dead", "zset"),
        ("wt:outbox", "hash"),
    ];
    let plan: Vec<(Step, &str, Bad)> = [
        (Step::Open, [group_keys, &[("cb:groups", "zset")]].concat(), vec![("cb:stats", "groups_opened")]),
        (Step::Add, [group_keys, child_keys].concat(), vec![("cb:group:g", "added")]),
        (Step::Seal, end_keys.to_vec(), vec![("cb:group:g", "succeeded"), ("cb:stats", "groups_completed")]),
        (Step::Report, end_keys.to_vec(), vec![("cb:group:g", "dead"), ("cb:stats", "groups_completed")]),
    ]
    .into_iter()
    .flat_map(|(step, keys, numbers)| {
        let kinds = keys.into_iter().flat_map(move |(k, expected)| {
            KINDS.into_iter().filter(move |kind| *kind != expected).map(move |kind| (step, k, Bad::Kind(kind)))
        });
        kinds
            .chain(numbers.into_iter().map(move |(k, field)| (step, k, Bad::FieldNotANumber(field))))
            .collect::<Vec<_>>()
    })
    .chain([(Step::Add, "wt:seq", Bad::NotANumber)])
    .collect();

    let mut cases = 0;
    for (step, at, bad) in plan {
        let _: () = redis::cmd("FLUSHALL").query(&mut c).unwrap();
        // The scene: what each step needs before it runs.
        if step != Step::Open {
            s.group_open(&g, &cb).await.unwrap();
        }
        if step == Step::Add {
            let _: () = c.set(key("wt", "seq"), 5).unwrap();
        }
        if step == Step::Report {
            s.group_add(&g, &child()).await.unwrap();
            s.group_seal(&g).await.unwrap();
            let claimed = s.claim(&ty("wt"), &limits()).await.unwrap().tasks;
            // Settled without moving the outbox: the report waits for the flush under test.
            s.settle(&ty("wt"), &[ack(&claimed[0], vec![])], None).await.unwrap();
        }
        let (t, suffix) = at.split_once(':').unwrap();
        let k = key(t, suffix);
        let saved = format!("{k}:saved");
        let existed: bool = c.exists(&k).unwrap();
        if existed {
            let _: () = c.rename(&k, &saved).unwrap();
            if let Bad::FieldNotANumber(_) = bad {
                let _: () = redis::cmd("COPY").arg(&saved).arg(&k).query(&mut c).unwrap();
            }
        }
        plant(&mut c, &k, bad);
        let before = snapshot(&mut c, &[&k, &saved]);
        let run = || async {
            match step {
                Step::Open => s.group_open(&g, &cb).await.map(drop),
                Step::Add => s.group_add(&g, &child()).await.map(drop),
                Step::Seal => s.group_seal(&g).await.map(drop),
                Step::Report => {
                    let flushed = s.flush_outbox(&ty("wt")).await?;
                    match flushed.failed.into_iter().next() {
                        Some((_, e)) => Err(e),
                        None => Ok(()),
                    }
                }
            }
        };
        let error = format!("{:#}", run().await.expect_err(&format!("{step:?} with {bad:?} at {k} did not fail")));
        assert!(error.contains(&k), "{step:?} with {bad:?}: the error does not name {k}: {error}");
        assert!(error.contains("DEL") || error.contains("HSET"), "{step:?}: the error gives no fix: {error}");
        let after = snapshot(&mut c, &[&k, &saved]);
        // Adding joins the group (its slot) before it schedules the child (the
        // child's slot): a fault in the child's keys leaves the child joined,
        // not scheduled, and the same add completes it.
        let joined_first = step == Step::Add && t == "wt";
        let differs: Vec<String> = before
            .keys()
            .chain(after.keys())
            .filter(|name| before.get(*name) != after.get(*name))
            .map(|name| String::from_utf8_lossy(name).into_owned())
            .filter(|name| !(joined_first && (name.ends_with(":group:g") || name.ends_with(":group-pending:g"))))
            .collect();
        assert!(differs.is_empty(), "{step:?} with {bad:?} at {k} wrote {differs:?} before failing");

        let _: () = redis::cmd("DEL").arg(&k).query(&mut c).unwrap();
        if existed {
            let _: () = c.rename(&saved, &k).unwrap();
        }
        run().await.unwrap_or_else(|e| panic!("{step:?} still fails after the fix at {k}: {e:#}"));
        let view = s.group_show(&g).await.unwrap().expect("the group exists");
        match step {
            Step::Open => assert_eq!(view.state, "open"),
            Step::Add => {
                assert_eq!((view.added, view.pending), (1, 1), "{k}");
                let due: Option<f64> = c.zscore(key("wt", "due"), "w-1").unwrap();
                assert!(due.is_some(), "{k}: the child was not scheduled after the fix");
            }
            Step::Seal => assert_eq!((view.state.as_str(), view.fired.as_deref()), ("done", Some("callback"))),
            Step::Report => assert_eq!((view.state.as_str(), view.succeeded), ("done", 1), "{k}"),
        }
        cases += 1;
    }
    assert!(cases > 80, "only {cases} cases ran");
}
