//! One case of the random test against Redis: each step through `Store` and the model, then their states compared.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::time::Duration;

use hourglass_store::task::{Claim, Ended, Lease, Outcome, RunInfo, Settlement};
use hourglass_store::task_type::TaskType;
use hourglass_store::{CancelEffect, ClaimLimits, Extended, Keys, Store};
use proptest::sample::Index;

use super::reference::{CancelModel, Model, ModelClaim, Run, State};
use super::{Coverage, EVENTS_MAXLEN, End, HOLDERS, IDS, MAX_ID_BYTES, MAX_PAYLOAD_BYTES, START_MS, Step};

// ---------------------------------------------------------------- Redis

/// Reads the type's whole state in one round trip.
async fn read_state(store: &Store, k: &Keys) -> anyhow::Result<State> {
    type Pairs = Vec<(String, String)>;
    type Scores = Vec<(String, f64)>;
    let mut conn = store.connection();
    #[allow(clippy::type_complexity)]
    let (due, payload, dead, attempts, errors, cancels, claims, claimed, stats, seq, paused, events): (
        Scores,
        Vec<(String, Vec<u8>)>,
        Scores,
        Pairs,
        Pairs,
        Pairs,
        Scores,
        Vec<(String, Vec<u8>)>,
        Pairs,
        Option<i64>,
        bool,
        usize,
    ) = redis::pipe()
        .zrange_withscores(&k.due, 0, -1)
        .hgetall(&k.payload)
        .zrange_withscores(&k.dead, 0, -1)
        .hgetall(&k.attempts)
        .hgetall(&k.errors)
        .hgetall(&k.cancels)
        .zrange_withscores(&k.claims, 0, -1)
        .hgetall(&k.claimed)
        .hgetall(&k.stats)
        .get(&k.seq)
        .exists(&k.paused)
        .xlen(&k.events)
        .query_async(&mut conn)
        .await?;
    // A tuple reply has at most 12 parts: the run index apart (nothing runs between the reads).
    let (running, held): (BTreeSet<String>, Pairs) =
        redis::pipe().smembers(&k.running).hgetall(&k.held).query_async(&mut conn).await?;
    let scores = |v: Scores| v.into_iter().map(|(m, s)| (m, s as i64)).collect();
    let mut live = BTreeMap::new();
    let mut leased = 0;
    for (field, value) in claimed {
        if field == "leased" {
            leased = String::from_utf8(value)?.parse()?;
        } else if let Some(c) = field.strip_suffix(":live") {
            live.insert(c.to_owned(), String::from_utf8(value)?);
        }
    }
    Ok(State {
        due: scores(due),
        payload: payload.into_iter().collect(),
        dead: scores(dead),
        attempts: attempts.into_iter().collect(),
        errors: errors.into_iter().collect(),
        cancels: cancels.into_iter().collect(),
        claims: scores(claims),
        live,
        leased,
        running,
        held: held.into_iter().collect(),
        stats: stats.into_iter().map(|(f, v)| (f, v.parse().unwrap_or(i64::MIN))).filter(|(_, v)| *v != 0).collect(),
        seq: seq.unwrap_or(0),
        paused,
        events,
    })
}

/// The fields where two states differ, one per line.
fn difference(model: &State, real: &State) -> String {
    let mut out = String::new();
    macro_rules! field {
        ($($f:ident),*) => {$(
            if model.$f != real.$f {
                let _ = writeln!(out, "  {}: model {:?}\n  {}  redis {:?}", stringify!($f), model.$f, " ".repeat(stringify!($f).len()), real.$f);
            }
        )*};
    }
    field!(
        due, payload, dead, attempts, errors, cancels, claims, live, leased, running, held, stats, seq, paused, events
    );
    out
}

/// One case against Redis: every step through the store, then the model, then the comparison.
struct Case<'a> {
    store: &'a Store,
    clock_key: &'a str,
    t: TaskType,
    model: Model,
    runs: Vec<Run>,
    trace: Vec<String>,
}

impl Case<'_> {
    fn holder(&self, i: usize) -> Store {
        self.store.clone().with_holder(HOLDERS[i])
    }

    /// Distinct runs named by `picks`, at most one per id (as one host's batch is):
    /// among those still leased, or with `stale` among every run handed out.
    fn pick(&self, picks: &[Index], stale: bool) -> Vec<Run> {
        let mut seen = BTreeSet::new();
        let mut out = Vec::new();
        let pool: Vec<&Run> = self.runs.iter().filter(|r| stale || self.model.leased_in(&r.lease).is_some()).collect();
        if pool.is_empty() {
            return out;
        }
        for p in picks {
            let run = pool[p.index(pool.len())];
            if seen.insert(run.lease.id.clone()) {
                out.push(run.clone());
            }
        }
        out
    }

    async fn apply(&mut self, n: usize, step: &Step) -> Result<(), String> {
        let t = self.t.clone();
        let now = self.model.now;
        let fail = |what: &str, e: anyhow::Error| format!("step {n} {what}: {e:#}");
        let note: String = match step {
            Step::Schedule { id, at, payload, mode } => {
                let id = IDS[*id];
                self.model.known.insert(id.to_owned());
                let body = vec![b'a' + (n % 26) as u8; *payload];
                let body_arg = (!body.is_empty()).then_some(body.as_slice());
                let written = self
                    .store
                    .schedule(&t, id.as_bytes(), now + at, body_arg, *mode)
                    .await
                    .map_err(|e| fail("schedule", e))?;
                let expected = self.model.schedule(id, now + at, &body, *mode);
                if written != expected {
                    return Err(format!("step {n}: schedule wrote {written}, the model {expected}"));
                }
                format!("written {written}")
            }
            Step::Claim { holder, max, lease_ms, max_running } => {
                let limits = ClaimLimits {
                    max_tasks: *max,
                    lease: Duration::from_millis(*lease_ms),
                    max_payload_bytes: MAX_PAYLOAD_BYTES as u64,
                    max_id_bytes: MAX_ID_BYTES,
                    max_running: *max_running,
                    ..ClaimLimits::default()
                };
                let claim = self.holder(*holder).claim(&t, &limits).await.map_err(|e| fail("claim", e))?;
                let expected = self.model.claim(*holder, *max, *lease_ms, *max_running);
                compare_claim(n, &claim, &expected)?;
                for task in &claim.tasks {
                    self.runs.push(Run {
                        lease: Lease { id: task.id.clone(), token: task.token, claim: task.claim },
                        attempt: task.attempt,
                    });
                }
                let ids: Vec<_> = expected.tasks.iter().map(|t| format!("{}#{}", t.0, t.4)).collect();
                let overlap = if expected.held.is_empty() {
                    String::new()
                } else {
                    format!(" (held for their earlier run: {:?})", expected.held)
                };
                format!("handed out {ids:?}, dead-lettered {:?}{overlap}", expected.dead)
            }
            Step::Settle { runs, stale, events } => {
                let picks: Vec<Index> = runs.iter().map(|r| r.0).collect();
                let runs: Vec<(Run, End)> =
                    self.pick(&picks, *stale).into_iter().zip(runs.iter().map(|r| r.1)).collect();
                if runs.is_empty() {
                    return Ok(());
                }
                let batch: Vec<Settlement> = runs
                    .iter()
                    .map(|(run, end)| Settlement {
                        lease: run.lease.clone(),
                        outcome: match end {
                            End::Ack => Outcome::Ack { followups: Vec::new(), groups: Vec::new(), graphs: Vec::new() },
                            End::Retry { delay_ms } => Outcome::Retry {
                                delay: Duration::from_millis(*delay_ms),
                                error: "retry".into(),
                                progress: None,
                            },
                            End::Dead => Outcome::Dead { error: "dead".into() },
                            End::Cancel => Outcome::Cancelled,
                        },
                        run: RunInfo { attempt: run.attempt, ..RunInfo::default() },
                    })
                    .collect();
                let results = self
                    .store
                    .settle(&t, &batch, events.then_some(EVENTS_MAXLEN))
                    .await
                    .map_err(|e| fail("settle", e))?
                    .0;
                let expected: Vec<Ended> =
                    runs.iter().map(|(run, end)| self.model.settle(run, *end, *events)).collect();
                if results != expected {
                    return Err(format!("step {n}: settle gave {results:?}, the model {expected:?}"));
                }
                let what: Vec<_> = runs
                    .iter()
                    .zip(&results)
                    .map(|((run, end), r)| {
                        format!("{}#{} {end:?}: {r:?}", String::from_utf8_lossy(&run.lease.id), run.lease.token)
                    })
                    .collect();
                what.join(", ")
            }
            Step::Extend { runs, stale, lease_ms } => {
                let runs = self.pick(runs, *stale);
                if runs.is_empty() {
                    return Ok(());
                }
                let leases: Vec<Lease> = runs.iter().map(|r| r.lease.clone()).collect();
                let got = self.store.extend(&t, &leases, *lease_ms).await.map_err(|e| fail("extend", e))?;
                let expected: Vec<Extended> = runs.iter().map(|r| self.model.extend(r, *lease_ms)).collect();
                if got != expected {
                    return Err(format!("step {n}: extend gave {got:?}, the model {expected:?}"));
                }
                format!("{got:?}")
            }
            Step::Release { runs, stale } => {
                let runs = self.pick(runs, *stale);
                if runs.is_empty() {
                    return Ok(());
                }
                let leases: Vec<Lease> = runs.iter().map(|r| r.lease.clone()).collect();
                let got = self.store.release(&t, &leases).await.map_err(|e| fail("release", e))?;
                let expected = self.model.release(&runs.iter().collect::<Vec<_>>());
                if got != expected {
                    return Err(format!("step {n}: release handed back {got}, the model {expected}"));
                }
                format!("handed back {got}")
            }
            Step::Cancel { id } => {
                let id = IDS[*id];
                let got = self.store.cancel(&t, id.as_bytes()).await.map_err(|e| fail("cancel", e))?;
                match (self.model.cancel(id), &got) {
                    (CancelModel::Scheduled, CancelEffect::Scheduled)
                    | (CancelModel::Unknown, CancelEffect::Unknown) => {}
                    (CancelModel::Running(candidates), CancelEffect::Running { holder }) => {
                        // The script marks one lease of the id; more than one exists only in the exception.
                        let mut conn = self.store.connection();
                        let marked: Option<String> = redis::cmd("HGET")
                            .arg(self.store.keys(&t).cancels)
                            .arg(id)
                            .query_async(&mut conn)
                            .await
                            .map_err(|e| format!("step {n}: {e}"))?;
                        let Some((token, _)) =
                            candidates.iter().find(|(token, h)| Some(token) == marked.as_ref() && h == holder)
                        else {
                            return Err(format!(
                                "step {n}: cancel marked {marked:?} on {holder}, the model expected one of {candidates:?}"
                            ));
                        };
                        self.model.s.cancels.insert(id.to_owned(), token.clone());
                        self.model.covered.cancelled_running += 1;
                    }
                    (_, got) => return Err(format!("step {n}: cancel gave {got:?}, which the model did not expect")),
                }
                format!("{got:?}")
            }
            Step::Requeue { id } | Step::Purge { id } => {
                let purge = matches!(step, Step::Purge { .. });
                let ids = id.map(|i| vec![IDS[i].as_bytes().to_vec()]);
                let got = if purge {
                    self.store.dead_purge(&t, ids.as_deref()).await.map_err(|e| fail("purge", e))?
                } else {
                    self.store.dead_requeue(&t, ids.as_deref()).await.map_err(|e| fail("requeue", e))?
                };
                let expected = self.model.dead_op(id.map(|i| IDS[i]), purge);
                if got != expected {
                    return Err(format!("step {n}: {got} dead tasks moved, the model {expected}"));
                }
                format!("{got} moved")
            }
            Step::Pause => {
                let ends = self.store.pause(&t, None).await.map_err(|e| fail("pause", e))?;
                if ends.is_some() {
                    return Err(format!("step {n}: a pause until resumed ends at {ends:?}"));
                }
                self.model.s.paused = true;
                String::new()
            }
            Step::Resume => {
                let was = self.store.resume(&t).await.map_err(|e| fail("resume", e))?;
                if was != self.model.s.paused {
                    return Err(format!("step {n}: resume says paused was {was}, the model {}", self.model.s.paused));
                }
                self.model.s.paused = false;
                String::new()
            }
            Step::Advance { ms } => {
                self.model.now += ms;
                set_clock(self.store, self.clock_key, self.model.now).await.map_err(|e| fail("clock", e))?;
                format!("now {}", self.model.now - START_MS)
            }
        };
        self.trace.push(format!("{n:>3} {step:?} -> {note}"));
        let real = read_state(self.store, &self.store.keys(&t)).await.map_err(|e| fail("read", e))?;
        if real != self.model.s {
            return Err(format!("after step {n} Redis and the model differ:\n{}", difference(&self.model.s, &real)));
        }
        self.model.check_properties(&real).map_err(|e| format!("after step {n}: {e}"))?;
        self.model.settle_down();
        Ok(())
    }
}

fn compare_claim(n: usize, claim: &Claim, expected: &ModelClaim) -> Result<(), String> {
    let got: Vec<_> = claim
        .tasks
        .iter()
        .map(|t| (String::from_utf8_lossy(&t.id).into_owned(), t.due_ms, t.payload.clone(), t.attempt, t.token))
        .collect();
    let dead: Vec<_> =
        claim.dead_lettered.iter().map(|(id, r)| (String::from_utf8_lossy(id).into_owned(), r.clone())).collect();
    if got != expected.tasks || dead != expected.dead || claim.paused != expected.paused {
        return Err(format!(
            "step {n}: the claim handed out {got:?}, dead-lettered {dead:?}, paused {}; the model {:?}, {:?}, paused {}",
            claim.paused, expected.tasks, expected.dead, expected.paused
        ));
    }
    Ok(())
}

async fn set_clock(store: &Store, key: &str, now: i64) -> anyhow::Result<()> {
    let mut conn = store.connection();
    let () = redis::cmd("SET").arg(key).arg(now).query_async(&mut conn).await?;
    Ok(())
}

/// Deletes every key of type `t` (the case is over).
async fn clean(store: &Store, t: &TaskType) -> anyhow::Result<()> {
    let mut conn = store.connection();
    let () = redis::cmd("DEL").arg(&store.keys(t).fixed()[..]).query_async(&mut conn).await?;
    Ok(())
}

/// Runs `steps` as case number `case`: what it covered, or the step that
/// failed with the difference and the trace of the steps before it.
pub(super) async fn run_case(store: &Store, clock_key: &str, case: usize, steps: &[Step]) -> Result<Coverage, String> {
    let t: TaskType = format!("case{case}").parse().unwrap();
    set_clock(store, clock_key, START_MS).await.map_err(|e| e.to_string())?;
    let mut c = Case { store, clock_key, t: t.clone(), model: Model::new(), runs: Vec::new(), trace: Vec::new() };
    let mut outcome = Ok(());
    for (n, step) in steps.iter().enumerate() {
        if let Err(e) = c.apply(n, step).await {
            outcome = Err(format!("{e}\ntrace:\n{}\n{n:>3} {step:?} -> failed", c.trace.join("\n")));
            break;
        }
    }
    clean(store, &t).await.map_err(|e| e.to_string())?;
    outcome.map(|()| c.model.covered)
}
