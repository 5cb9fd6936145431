//! Workflow graphs against a reference model: random graphs run in random interleavings, with outbox deliveries repeated as after a crash.
//!
//! Each case declares a random graph (2 to 10 nodes of two types, random
//! parents, each node's rule `all` or `success` and whether its run
//! dead-letters) through the real [`Store`] on a real redis-server. Then a
//! random sequence of what hosts do: deliver a type's outbox, claim a type's
//! due nodes, settle some of the runs claimed, and deliver an outbox as a
//! host that dies between a delivery and its clean-up leaves it (the same
//! entries delivered again). Then the hosts drain it. The model works out
//! each node's fate from its parents' in plain Rust, and the case checks:
//! - a node is claimed only once all its parents ended (settled, or skipped);
//! - each node that should run is claimed exactly once, a skipped one never,
//!   and a skip's reason names a parent that did not succeed, as it ended;
//! - the graph is done exactly once, failed exactly when a node did not
//!   succeed, its counts are the model's, and nothing is left behind
//!   (outboxes, membership marks, the index of graphs running).
//!
//! `HOURGLASS_GRAPH_MODEL_CASES` sets the number of cases (default 300).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use hourglass_store::group::{FireWhen, GroupId};
use hourglass_store::task::{Outcome, RunInfo, Settlement};
use hourglass_store::task_type::TaskType;
use hourglass_store::{ClaimLimits, NodeSpec, Store};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

const HOME: &str = "flow";
const TYPES: [&str; 2] = ["ga", "gb"];

/// One node as generated: parents (bits over the nodes before it), rule, whether its run dead-letters, its type.
#[derive(Debug, Clone)]
struct Gen {
    parents: u16,
    needs_success: bool,
    dies: bool,
    type_b: bool,
}

/// What the hosts do, one step.
#[derive(Debug, Clone, Copy)]
enum Act {
    /// Deliver type `t`'s outbox (0, 1: the node types; 2: the home type).
    Flush(usize),
    /// Deliver it as a host that dies after delivering and before clearing it: the entries come back.
    Replay(usize),
    /// Claim the due nodes of node type `t`.
    Claim(usize),
    /// Settle every other run claimed and not settled yet.
    Settle,
}

fn act() -> impl Strategy<Value = Act> {
    prop_oneof![
        (0..3usize).prop_map(Act::Flush),
        (0..3usize).prop_map(Act::Replay),
        (0..2usize).prop_map(Act::Claim),
        Just(Act::Settle),
    ]
}

fn ty(name: &str) -> TaskType {
    name.parse().unwrap()
}

fn name(i: usize) -> String {
    format!("n{i}")
}

/// What the model says becomes of each node: succeeded, dead, or skipped.
fn fates(nodes: &[Gen], parents: &[Vec<usize>]) -> Vec<&'static str> {
    let mut fate = Vec::with_capacity(nodes.len());
    for (i, n) in nodes.iter().enumerate() {
        // Parents come before their child, so theirs are known.
        let all_succeeded = parents[i].iter().all(|&p| fate[p] == "succeeded");
        fate.push(if n.needs_success && !all_succeeded {
            "skipped"
        } else if n.dies {
            "dead"
        } else {
            "succeeded"
        });
    }
    fate
}

struct Case<'a> {
    store: &'a Store,
    parents: Vec<Vec<usize>>,
    fate: Vec<&'static str>,
    /// Runs claimed and not settled yet: (type index, claimed task).
    claimed: Vec<(usize, hourglass_store::task::ClaimedTask)>,
    /// Nodes claimed (how often), and nodes settled.
    runs: BTreeMap<usize, usize>,
    ended: BTreeSet<usize>,
}

impl Case<'_> {
    fn index(id: &[u8]) -> usize {
        String::from_utf8_lossy(id).rsplit('n').next().unwrap().parse().unwrap()
    }

    async fn step(&mut self, a: Act) -> Result<(), String> {
        let types = [ty(TYPES[0]), ty(TYPES[1]), ty(HOME)];
        let e = |what: &str, e: anyhow::Error| format!("{what}: {e:#}");
        match a {
            Act::Flush(t) => {
                self.store.flush_outbox(&types[t]).await.map_err(|x| e("flush", x))?;
            }
            Act::Replay(t) => {
                let outbox = self.store.keys(&types[t]).outbox;
                let mut conn = self.store.connection();
                let entries: Vec<(Vec<u8>, Vec<u8>)> =
                    redis::cmd("HGETALL").arg(&outbox).query_async(&mut conn).await.map_err(|x| e("read", x.into()))?;
                self.store.flush_outbox(&types[t]).await.map_err(|x| e("flush", x))?;
                for (entry, value) in entries {
                    let _: () = redis::cmd("HSET")
                        .arg(&outbox)
                        .arg(entry)
                        .arg(value)
                        .query_async(&mut conn)
                        .await
                        .map_err(|x| e("put back", x.into()))?;
                }
            }
            Act::Claim(t) => {
                let limits = ClaimLimits { max_tasks: 100, lease: Duration::from_secs(600), ..ClaimLimits::default() };
                let claim = self.store.claim(&types[t], &limits).await.map_err(|x| e("claim", x))?;
                for task in claim.tasks {
                    let i = Self::index(&task.id);
                    for &p in &self.parents[i] {
                        if !self.ended.contains(&p) && self.fate[p] != "skipped" {
                            return Err(format!("{} claimed before its parent {} ended", name(i), name(p)));
                        }
                    }
                    *self.runs.entry(i).or_default() += 1;
                    self.claimed.push((t, task));
                }
            }
            Act::Settle => {
                let mut keep = Vec::new();
                let mut by_type: [Vec<Settlement>; 2] = [Vec::new(), Vec::new()];
                for (k, (t, task)) in std::mem::take(&mut self.claimed).into_iter().enumerate() {
                    if k % 2 == 1 {
                        keep.push((t, task));
                        continue;
                    }
                    let i = Self::index(&task.id);
                    let outcome = if self.fate[i] == "dead" {
                        Outcome::Dead { error: "planned".into() }
                    } else {
                        Outcome::Ack { followups: Vec::new(), groups: Vec::new(), graphs: Vec::new() }
                    };
                    by_type[t].push(Settlement {
                        lease: task.lease(),
                        outcome,
                        run: RunInfo { attempt: task.attempt, ..RunInfo::default() },
                    });
                    self.ended.insert(i);
                }
                self.claimed = keep;
                for (t, batch) in by_type.iter().enumerate() {
                    if !batch.is_empty() {
                        self.store.settle(&types[t], batch, None).await.map_err(|x| e("settle", x))?;
                    }
                }
            }
        }
        Ok(())
    }
}

async fn run_case(store: &Store, case: u32, gens: &[Gen], acts: &[Act]) -> Result<(), String> {
    let mut conn = store.connection();
    let _: () = redis::cmd("FLUSHDB").query_async(&mut conn).await.map_err(|e| e.to_string())?;
    let parents: Vec<Vec<usize>> =
        gens.iter().enumerate().map(|(i, g)| (0..i.min(16)).filter(|j| g.parents & (1 << j) != 0).collect()).collect();
    let fate = fates(gens, &parents);
    // Declared in reverse, so children come before their parents in the list.
    let specs: Vec<NodeSpec> = gens
        .iter()
        .enumerate()
        .rev()
        .map(|(i, g)| NodeSpec {
            name: name(i),
            task_type: ty(TYPES[g.type_b as usize]),
            id: format!("c{case}/n{i}"),
            payload: String::new(),
            when: if g.needs_success { FireWhen::AllSucceeded } else { FireWhen::AllEnded },
            parents: parents[i].iter().map(|&p| name(p)).collect(),
        })
        .collect();
    let gid: GroupId = format!("g{case}").parse().unwrap();
    store.graph_open(&ty(HOME), &gid, &specs).await.map_err(|e| format!("declare: {e:#}"))?;
    let mut c = Case { store, parents, fate, claimed: Vec::new(), runs: BTreeMap::new(), ended: BTreeSet::new() };
    for (n, a) in acts.iter().enumerate() {
        c.step(*a).await.map_err(|e| format!("step {n} ({a:?}): {e}"))?;
    }
    // The hosts drain what is left.
    let drain = [Act::Flush(2), Act::Flush(0), Act::Flush(1), Act::Claim(0), Act::Claim(1), Act::Settle, Act::Settle];
    let mut view = None;
    for _ in 0..4 * gens.len() + 4 {
        for a in drain {
            c.step(a).await.map_err(|e| format!("draining ({a:?}): {e}"))?;
        }
        let v = store.graph_show(&ty(HOME), &gid).await.map_err(|e| format!("show: {e:#}"))?;
        if v.as_ref().is_some_and(|v| v.state == "done") {
            view = v;
            break;
        }
    }
    let v = view.ok_or("the graph never finished")?;

    for (i, n) in v.nodes.iter().rev().enumerate() {
        let want = c.fate[i];
        if n.state != want {
            return Err(format!("{} is {}, the model says {want} ({:?})", n.name, n.state, v.nodes));
        }
        let runs = c.runs.get(&i).copied().unwrap_or(0);
        if runs != usize::from(want != "skipped") {
            return Err(format!("{} ({want}) was claimed {runs} times", n.name));
        }
        if want == "skipped" {
            let reason = n.reason.as_deref().unwrap_or_default();
            let named = c.parents[i].iter().any(|&p| reason == format!("parent {} {}", name(p), c.fate[p]));
            if !named {
                return Err(format!("{} skipped because {reason:?}, not a parent that did not succeed", n.name));
            }
        }
    }
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    for f in &c.fate {
        *counts.entry(f.to_string()).or_default() += 1;
    }
    for (state, n) in &v.counts {
        if counts.get(state).copied().unwrap_or(0) != *n {
            return Err(format!("the graph counts {n} {state}, the model {counts:?}"));
        }
    }
    let stats: BTreeMap<String, i64> = redis::cmd("HGETALL")
        .arg(store.keys(&ty(HOME)).stats)
        .query_async(&mut conn)
        .await
        .map_err(|e| e.to_string())?;
    let failed = i64::from(c.fate.iter().any(|f| *f != "succeeded"));
    if stats.get("graphs_completed") != Some(&1) || stats.get("graphs_failed").copied().unwrap_or(0) != failed {
        return Err(format!("stats {stats:?}: done once, failed {failed} expected"));
    }
    for t in [HOME, TYPES[0], TYPES[1]] {
        let k = store.keys(&ty(t));
        let (outbox, member, graphs): (u64, u64, u64) = redis::pipe()
            .hlen(&k.outbox)
            .hlen(&k.member)
            .zcard(&k.graphs)
            .query_async(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
        if (outbox, member, graphs) != (0, 0, 0) {
            return Err(format!("{t}: left behind: {outbox} outbox entries, {member} marks, {graphs} graphs"));
        }
    }
    Ok(())
}

fn cases() -> u32 {
    std::env::var("HOURGLASS_GRAPH_MODEL_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(300)
}

#[test]
fn graphs_agree_with_the_model_under_random_interleavings_and_repeated_deliveries() {
    let server = crate::support::RedisServer::start();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let prefix: hourglass_store::KeyPrefix = "hggraph".parse().unwrap();
    let store = rt.block_on(Store::connect(&server.url(), &prefix)).unwrap();
    let node = (any::<u16>(), prop::bool::weighted(0.4), prop::bool::weighted(0.25), any::<bool>())
        .prop_map(|(parents, needs_success, dies, type_b)| Gen { parents, needs_success, dies, type_b });
    let strategy = (prop::collection::vec(node, 2..10), prop::collection::vec(act(), 0..40));
    let mut runner = TestRunner::new(Config { cases: cases(), failure_persistence: None, ..Config::default() });
    let case = std::cell::Cell::new(0u32);
    let result = runner.run(&strategy, |(gens, acts)| {
        case.set(case.get() + 1);
        rt.block_on(run_case(&store, case.get(), &gens, &acts)).map_err(TestCaseError::fail)
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}
