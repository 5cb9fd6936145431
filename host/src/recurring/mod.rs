//! Recurring tasks: their rules, defined in `runner.toml` (`[schedules]`) or from the CLI, kept in Redis, each occurrence an ordinary task that fires once.
//!
//! A schedule `name` of type `T` has one *armed* occurrence at a time: the
//! task `name@<due ms>` in `hourglass:{T}:due`, with the schedule's payload.
//! The claim that hands it out arms the next one in the same atomic step
//! (`claim.lua`), from occurrence times the hosts computed and stored next
//! to it; so every occurrence is armed once, by whichever host claims, and a
//! failing or dead-lettered occurrence never stops the next. Every host runs
//! [`run`]: it puts the schedules of its `runner.toml` at start and on every
//! change (removing the ones its file no longer has), and every
//! [`SYNC_EVERY`] keeps each schedule's next times known and re-arms one
//! whose chain stopped (its armed occurrence was handed out before later
//! times were known, or a client cancelled it).
//!
//! Occurrence times come from [`rule`] (cron in an IANA time
//! zone, DST-safe, or a fixed interval). Missed occurrences, after a time
//! with no host running, follow the schedule's [`MissedPolicy`]: by default
//! the latest one runs once and the rest are skipped.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::store::{RecurState, Store, SyncOutcome};
use crate::task_type::TaskType;
pub use rule::MissedPolicy;
use rule::{Recurrence, catch_up};
pub use schedule::{RecurringConfig, RecurringName};

pub mod rule;
mod schedule;

/// How often every host keeps the schedules' next times known.
pub const SYNC_EVERY: Duration = Duration::from_secs(2);
/// Occurrence times kept known after the armed one: the runway claims arm from.
const AHEAD: usize = 16;

impl RecurringConfig {
    /// The validated schedule; an error names what is wrong with it.
    pub fn definition(&self, name: &RecurringName) -> Result<Definition> {
        let rule = self.rule()?;
        Ok(Definition {
            name: name.clone(),
            task_type: self.task_type.clone(),
            rule,
            payload: self.payload.clone().unwrap_or_default(),
            missed: self.missed.unwrap_or_default(),
            source: Source::Config,
        })
    }
}

/// Who made a schedule: its hosts' `runner.toml`, or the CLI (it lives in Redis only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// `[schedules]` of `runner.toml`: a host removes it when its file no longer has it.
    Config,
    /// `hourglass cron` / `hourglass every`: removed by `hourglass unschedule`.
    Cli,
}

/// A schedule, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Definition {
    /// Its name, unique within its type.
    pub name: RecurringName,
    /// The type of its occurrences.
    pub task_type: TaskType,
    /// When it fires.
    pub rule: Recurrence,
    /// The payload of every occurrence.
    pub payload: String,
    /// What happens to occurrences missed while no host ran.
    pub missed: MissedPolicy,
    /// Who made it.
    pub source: Source,
}

/// The definition as Redis keeps it (and compares it: an unchanged one is a no-op).
#[derive(Debug, Serialize, Deserialize)]
struct Stored {
    rule: String,
    payload: String,
    missed: MissedPolicy,
    source: Source,
}

impl Definition {
    /// The text stored in Redis.
    pub fn stored(&self) -> String {
        let stored = Stored {
            rule: self.rule.to_string(),
            payload: self.payload.clone(),
            missed: self.missed,
            source: self.source,
        };
        serde_json::to_string(&stored).unwrap_or_default()
    }

    /// Reads what [`Definition::stored`] wrote.
    pub fn from_stored(task_type: &TaskType, name: &str, text: &str) -> Result<Definition> {
        let stored: Stored = serde_json::from_str(text)
            .with_context(|| format!("schedule {task_type}/{name}: bad definition in Redis"))?;
        Ok(Definition {
            name: name.parse().map_err(anyhow::Error::msg)?,
            task_type: task_type.clone(),
            rule: stored.rule.parse().map_err(|e| anyhow::anyhow!("schedule {task_type}/{name}: {e}"))?,
            payload: stored.payload,
            missed: stored.missed,
            source: stored.source,
        })
    }

    fn policy(&self) -> &'static str {
        match self.missed {
            MissedPolicy::Latest => "latest",
            MissedPolicy::All => "all",
            MissedPolicy::Skip => "skip",
        }
    }

    /// Occurrence times to arm from, after `after_ms` at `now_ms`: the missed
    /// ones the policy keeps, then [`AHEAD`] to come.
    pub fn times_after(&self, after_ms: i64, now_ms: i64) -> Vec<i64> {
        let Some(first) = self.rule.next_after(after_ms) else { return Vec::new() };
        let caught = catch_up(&self.rule, first, now_ms, self.missed);
        let mut times = caught.run_now;
        let mut next = caught.next_ms;
        while times.len() < AHEAD + caught_len(&times, now_ms) {
            let Some(t) = next else { break };
            times.push(t);
            next = self.rule.next_after(t);
        }
        times
    }

    /// Puts it in Redis (arming its first occurrence after now); false when it was already so.
    pub async fn put(&self, store: &Store) -> Result<bool> {
        let now = crate::clock::now_ms();
        // The first occurrence after now (an interval starts one interval from now).
        let times = self.times_after(now, now);
        store
            .recur_put(
                &self.task_type,
                self.name.as_str(),
                &self.stored(),
                self.policy(),
                self.payload.as_bytes(),
                &times,
            )
            .await
    }
}

/// How many of `times` are due already (they come first).
fn caught_len(times: &[i64], now_ms: i64) -> usize {
    times.iter().take_while(|t| **t <= now_ms).count()
}

/// Puts the schedules of `config` into Redis and removes the config-made
/// ones it no longer has; returns how many changed.
pub async fn apply_config(store: &Store, config: &BTreeMap<RecurringName, RecurringConfig>) -> Result<usize> {
    let mut changed = 0;
    let mut wanted: BTreeSet<(TaskType, String)> = BTreeSet::new();
    for (name, schedule) in config {
        let definition = schedule.definition(name)?;
        wanted.insert((definition.task_type.clone(), name.to_string()));
        if definition.put(store).await? {
            info!(schedule = %name, task_type = %definition.task_type, rule = %definition.rule, "recurring schedule put from runner.toml");
            changed += 1;
        }
    }
    for t in store.recurring_types().await? {
        for state in store.recur_list(&t).await? {
            let Ok(definition) = Definition::from_stored(&t, &state.name, &state.definition) else { continue };
            if definition.source == Source::Config && !wanted.contains(&(t.clone(), state.name.clone())) {
                store.recur_remove(&t, &state.name).await?;
                info!(schedule = %state.name, task_type = %t, "recurring schedule removed: runner.toml no longer has it");
                changed += 1;
            }
        }
    }
    Ok(changed)
}

/// One round over every schedule: keep its next times known, re-arm a stopped chain.
pub async fn sync_round(store: &Store) -> Result<()> {
    let now = crate::clock::now_ms();
    for t in store.recurring_types().await? {
        for state in store.recur_list(&t).await? {
            if let Err(e) = sync_one(store, &t, &state, now).await {
                warn!(task_type = %t, schedule = %state.name, "recurring schedule not synced: {e:#}");
            }
        }
    }
    Ok(())
}

async fn sync_one(store: &Store, t: &TaskType, state: &RecurState, now: i64) -> Result<()> {
    let definition = Definition::from_stored(t, &state.name, &state.definition)?;
    let ahead = state.then.iter().filter(|ms| **ms > now).count();
    // Enough runway, and the armed occurrence still waits: nothing to do.
    if state.armed_due && ahead >= AHEAD / 2 {
        return Ok(());
    }
    let after = state.armed_ms().unwrap_or(now);
    let times = definition.times_after(after, now);
    match store.recur_sync(t, &state.name, &state.definition, state.armed.as_deref(), &times).await? {
        SyncOutcome::Armed => debug!(task_type = %t, schedule = %state.name, "recurring schedule re-armed"),
        SyncOutcome::Kept | SyncOutcome::Stale => {}
    }
    Ok(())
}

/// A host's part: put its `runner.toml` schedules (`schedules()`, read now
/// and whenever `changes` moves) and sync every schedule every
/// [`SYNC_EVERY`], until `shutdown`.
pub async fn run(
    store: Store,
    schedules: impl Fn() -> BTreeMap<RecurringName, RecurringConfig>,
    mut changes: tokio::sync::watch::Receiver<u64>,
    shutdown: CancellationToken,
) {
    let mut applied: Option<BTreeMap<RecurringName, RecurringConfig>> = None;
    loop {
        let wanted = schedules();
        if applied.as_ref() != Some(&wanted) {
            match apply_config(&store, &wanted).await {
                Ok(_) => applied = Some(wanted),
                Err(e) => warn!("recurring schedules of runner.toml not put yet: {e:#}"),
            }
        }
        if let Err(e) = sync_round(&store).await {
            debug!("recurring schedules not synced this round: {e:#}");
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = changes.changed() => {}
            _ = tokio::time::sleep(SYNC_EVERY) => {}
        }
    }
}

/// One schedule as `hourglass schedules` and the dashboard show it.
#[derive(Debug, Clone, Serialize)]
pub struct Listed {
    /// Its type.
    pub task_type: String,
    /// Its name.
    pub name: String,
    /// When it fires (`cron "..." in Zone`, `every 15m`).
    pub rule: String,
    /// Its armed occurrence's due time (ms), if any.
    pub next_ms: Option<i64>,
    /// Whether that occurrence waits in `due` (false while it runs).
    pub armed_due: bool,
    /// `config` or `cli`.
    pub source: String,
    /// The missed-occurrence policy.
    pub missed: String,
}

/// Every schedule in Redis, by type then name.
pub async fn list(store: &Store) -> Result<Vec<Listed>> {
    let mut out = Vec::new();
    for t in store.recurring_types().await? {
        for state in store.recur_list(&t).await? {
            let (rule, source, missed) = match Definition::from_stored(&t, &state.name, &state.definition) {
                Ok(d) => (d.rule.to_string(), format!("{:?}", d.source).to_lowercase(), d.policy().to_owned()),
                Err(e) => (format!("unreadable: {e:#}"), String::new(), String::new()),
            };
            out.push(Listed {
                task_type: t.to_string(),
                name: state.name.clone(),
                rule,
                next_ms: state.armed_ms(),
                armed_due: state.armed_due,
                source,
                missed,
            });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every(secs: u64) -> Definition {
        Definition {
            name: "s".parse().unwrap(),
            task_type: "t".parse().unwrap(),
            rule: Recurrence::every(&format!("{secs}s")).unwrap(),
            payload: String::new(),
            missed: MissedPolicy::Latest,
            source: Source::Cli,
        }
    }

    #[test]
    fn times_after_keep_the_policy_then_a_runway() {
        let d = every(10);
        // On time: the next sixteen.
        let times = d.times_after(1_000_000, 1_000_000);
        assert_eq!(times.len(), AHEAD);
        assert_eq!(times[0], 1_010_000);
        assert!(times.windows(2).all(|w| w[1] - w[0] == 10_000));
        // After 100 s down: the latest missed one, then sixteen to come.
        let times = d.times_after(1_000_000, 1_100_500);
        assert_eq!(times[0], 1_100_000, "the latest missed occurrence");
        assert_eq!(times[1], 1_110_000);
        assert_eq!(times.len(), AHEAD + 1);
        // All: every missed one first.
        let all = Definition { missed: MissedPolicy::All, ..every(10) };
        let times = all.times_after(1_000_000, 1_100_500);
        assert_eq!(&times[..3], &[1_010_000, 1_020_000, 1_030_000]);
        assert_eq!(times.iter().filter(|t| **t <= 1_100_500).count(), 10);
    }

    #[test]
    fn definitions_round_trip_through_redis_text() {
        let config = RecurringConfig {
            task_type: "digest.send".parse().unwrap(),
            cron: Some("0 7 * * *".into()),
            timezone: Some("Europe/Paris".into()),
            every: None,
            payload: Some("hi".into()),
            missed: None,
        };
        let name: RecurringName = "daily-digest".parse().unwrap();
        let d = config.definition(&name).unwrap();
        let back = Definition::from_stored(&d.task_type, name.as_str(), &d.stored()).unwrap();
        assert_eq!(back, d);
        assert!("bad@name".parse::<RecurringName>().is_err());
    }
}
