//! Every workflow graph step (declaring one, a node's end delivered from the outbox, cancelling one) with each of its keys broken fails cleanly and goes on once the key is fixed.

use super::{Bad, KINDS, limits, plant, snapshot};
use crate::support::{RedisServer, ack, key, ty};
use hourglass::group::{FireWhen, GroupId};
use hourglass::store::{NodeSpec, Store};
use redis::Commands;

/// graph_open.lua, graph_reports.lua and graph_cancel.lua: a wrong-typed key, a counter that is
/// not a number or a node that is not JSON fails the step with an error naming
/// the key and the fix, writes nothing, and the same step goes on once it is fixed.
#[tokio::test(flavor = "multi_thread")]
async fn a_broken_key_fails_every_graph_step_cleanly() {
    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Step {
        Declare,
        Report,
        Cancel,
    }
    let server = RedisServer::start();
    let mut c = server.client();
    let s = Store::connect(&server.url(), &"hourglass".parse().unwrap()).await.unwrap();
    let (home, g): (_, GroupId) = (ty("fl"), "g".parse().unwrap());
    let node = |name: &str, parents: &[&str]| NodeSpec {
        name: name.into(),
        task_type: ty("wt"),
        id: format!("n-{name}"),
        payload: String::new(),
        when: FireWhen::AllSucceeded,
        parents: parents.iter().map(|p| p.to_string()).collect(),
    };
    let nodes = vec![node("a", &[]), node("b", &["a"])];
    let graph_keys: &[(&str, &str)] =
        &[("fl:graph:g", "hash"), ("fl:graph-nodes:g", "hash"), ("fl:graphs", "zset"), ("fl:outbox", "hash")];
    let plan: Vec<(Step, &str, Bad)> = [
        (Step::Declare, vec![("fl:stats", "graphs_opened")]),
        (Step::Report, vec![("fl:graph:g", "scheduled"), ("fl:stats", "graphs_completed")]),
        (Step::Cancel, vec![("fl:graph:g", "waiting"), ("fl:stats", "graphs_failed")]),
    ]
    .into_iter()
    .flat_map(|(step, numbers)| {
        // Cancelling reads neither the outbox nor seq in its script.
        let keys = graph_keys.iter().filter(move |(k, _)| step != Step::Cancel || *k != "fl:outbox");
        let kinds = keys.flat_map(move |&(k, expected)| {
            KINDS.into_iter().filter(move |kind| *kind != expected).map(move |kind| (step, k, Bad::Kind(kind)))
        });
        let seq = (step != Step::Cancel).then_some((step, "fl:seq", Bad::NotANumber));
        kinds
            .chain(numbers.into_iter().map(move |(k, field)| (step, k, Bad::FieldNotANumber(field))))
            .chain(seq)
            .collect::<Vec<_>>()
    })
    .collect();

    let mut cases = 0;
    for (step, at, bad) in plan {
        let _: () = redis::cmd("FLUSHALL").query(&mut c).unwrap();
        let _: () = c.set(key("fl", "seq"), 5).unwrap();
        if step == Step::Cancel {
            // Declared, the root scheduled; b waits.
            s.graph_open(&home, &g, &nodes).await.unwrap();
            s.flush_outbox(&home).await.unwrap();
        }
        if step == Step::Report {
            // Declared, the root run and settled; its end waits in wt's outbox for the flush under test.
            s.graph_open(&home, &g, &nodes).await.unwrap();
            s.flush_outbox(&home).await.unwrap();
            let claimed = s.claim(&ty("wt"), &limits()).await.unwrap().tasks;
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
                Step::Declare => s.graph_open(&home, &g, &nodes).await.map(drop),
                Step::Cancel => s.graph_cancel(&home, &g).await.map(drop),
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
        let differs: Vec<String> = before
            .keys()
            .chain(after.keys())
            .filter(|name| before.get(*name) != after.get(*name))
            .map(|name| String::from_utf8_lossy(name).into_owned())
            .collect();
        assert!(differs.is_empty(), "{step:?} with {bad:?} at {k} wrote {differs:?} before failing");

        let _: () = redis::cmd("DEL").arg(&k).query(&mut c).unwrap();
        if existed {
            let _: () = c.rename(&saved, &k).unwrap();
        }
        run().await.unwrap_or_else(|e| panic!("{step:?} still fails after the fix at {k}: {e:#}"));
        let view = s.graph_show(&home, &g).await.unwrap().expect("the graph exists");
        let states: Vec<&str> = view.nodes.iter().map(|n| n.state.as_str()).collect();
        match step {
            Step::Declare => assert_eq!(states, ["scheduled", "waiting"], "{k}"),
            Step::Report => assert_eq!(states, ["succeeded", "scheduled"], "{k}"),
            Step::Cancel => assert_eq!(states, ["cancelled", "skipped"], "{k}"),
        }
        cases += 1;
    }
    assert!(cases > 20, "only {cases} cases ran");

    // A node that is not JSON: the end waits in the outbox, nothing is written, and it goes on once the node is back.
    let _: () = redis::cmd("FLUSHALL").query(&mut c).unwrap();
    s.graph_open(&home, &g, &nodes).await.unwrap();
    s.flush_outbox(&home).await.unwrap();
    let claimed = s.claim(&ty("wt"), &limits()).await.unwrap().tasks;
    s.settle(&ty("wt"), &[ack(&claimed[0], vec![])], None).await.unwrap();
    let nodes_key = key("fl", "graph-nodes:g");
    let good: String = c.hget(&nodes_key, "1").unwrap();
    let () = c.hset(&nodes_key, "1", "{not json").unwrap();
    let before = snapshot(&mut c, &[]);
    let e = s.flush_outbox(&ty("wt")).await.unwrap().failed.into_iter().next().expect("the end waits").1;
    assert!(format!("{e:#}").contains(&nodes_key), "{e:#}");
    assert_eq!(snapshot(&mut c, &[]), before, "nothing written");
    let () = c.hset(&nodes_key, "1", good).unwrap();
    assert!(s.flush_outbox(&ty("wt")).await.unwrap().failed.is_empty());
    let view = s.graph_show(&home, &g).await.unwrap().unwrap();
    assert_eq!(view.nodes[0].state, "succeeded");
}
