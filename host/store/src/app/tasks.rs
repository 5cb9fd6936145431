//! What clients do to one task: schedule, cancel, pause and resume its type, read its trace parent.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use futures_util::{StreamExt, TryStreamExt};

use crate::task_type::TaskType;
use crate::{Store, duration_ms};

/// What `schedule` does to an id that is already scheduled (the variants of `ZADD`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ScheduleMode {
    /// `ZADD`: the new due time replaces the old one (upsert).
    #[default]
    Upsert,
    /// `ZADD NX`: keep the first schedule (dedupe).
    IfAbsent,
    /// `ZADD GT`: only postpone (a debounce).
    OnlyLater,
    /// `ZADD LT`: only bring forward.
    OnlyEarlier,
}

impl ScheduleMode {
    fn as_str(self) -> &'static str {
        match self {
            ScheduleMode::Upsert => "upsert",
            ScheduleMode::IfAbsent => "if-absent",
            ScheduleMode::OnlyLater => "only-later",
            ScheduleMode::OnlyEarlier => "only-earlier",
        }
    }
}
/// One task for [`Store::schedule_many`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewTask {
    /// Its type (a sharded type's task goes to the shard its id picks).
    pub task_type: TaskType,
    /// Its id.
    pub id: Vec<u8>,
    /// When it is due, ms since the epoch.
    pub due_ms: i64,
    /// Its payload (`None` or empty: none).
    pub payload: Option<Vec<u8>>,
    /// What happens to an id already scheduled.
    pub mode: ScheduleMode,
}

/// Most tasks in one `schedule_batch.lua` call.
///
/// Where the bounds come from: a call holds Redis while it runs, and should
/// hold it about a millisecond at most. A task costs Redis about 3 to 5 µs
/// with a small payload and more with a large one (BENCHMARKS.md,
/// "Scheduling in batches"), so a call takes at most 200 tasks and
/// [`MAX_BATCH_BYTES`] of ids and payloads.
pub const MAX_BATCH_TASKS: usize = 200;
/// Most bytes of ids and payloads in one `schedule_batch.lua` call (see [`MAX_BATCH_TASKS`]).
pub const MAX_BATCH_BYTES: usize = 256 * 1024;
/// Types (or shards) whose batches are in flight at once: Redis runs one while the next is sent.
const QUEUES_IN_FLIGHT: usize = 4;
/// Batches of one type (or shard) per round trip: about 1,000 small tasks, as the clients send.
const BATCHES_PER_TRIP: usize = 5;

/// How many of a run of writes (their sizes, ids and payloads, in order) make one script call: at
/// most [`MAX_BATCH_TASKS`] and [`MAX_BATCH_BYTES`], and one at least. `schedule_batch.lua`'s
/// callers and the outbox's follow-up deliveries cut their calls with it.
pub(crate) fn batch_len(sizes: impl IntoIterator<Item = usize>) -> usize {
    let mut bytes = 0;
    let mut len = 0;
    for size in sizes.into_iter().take(MAX_BATCH_TASKS) {
        if len > 0 && bytes + size > MAX_BATCH_BYTES {
            break;
        }
        bytes += size;
        len += 1;
    }
    len
}

/// `indexes` (tasks of one type, in order) cut into batches of [`batch_len`].
fn cut<'a>(tasks: &'a [NewTask], indexes: &'a [usize]) -> impl Iterator<Item = &'a [usize]> + 'a {
    let mut rest = indexes;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let sizes = rest.iter().map(|&i| tasks[i].id.len() + tasks[i].payload.as_ref().map_or(0, Vec::len));
        let (batch, after) = rest.split_at(batch_len(sizes));
        rest = after;
        Some(batch)
    })
}

/// Sets the replies at `indexes` to `e`: the first gets the error itself (what the caller
/// reports, and what `classify` reads as an outage), the others its text.
fn fail_all(replies: &mut [Option<Result<Vec<i64>>>], indexes: &[usize], e: anyhow::Error) {
    let text = format!("{e:#}");
    let mut first = Some(e);
    for &i in indexes {
        replies[i] = Some(Err(first.take().unwrap_or_else(|| anyhow::anyhow!("{text}"))));
    }
}

impl Store {
    /// Schedules (or re-schedules) a task, as an app would: payload and due
    /// time in one atomic step; `mode` picks what happens to an id already
    /// scheduled. Returns whether the due time was written.
    pub async fn schedule(
        &self,
        t: &TaskType,
        id: &[u8],
        due_ms: i64,
        payload: Option<&[u8]>,
        mode: ScheduleMode,
    ) -> Result<bool> {
        let t = &self.shard_for(t, id);
        let k = self.keys(t);
        let mut conn = self.conn.clone();
        let payload = payload.unwrap_or_default();
        let written: i64 = self
            .scripts
            .schedule
            .key(&k.due)
            .key(&k.payload)
            .arg(id)
            .arg(due_ms)
            .arg(payload)
            .arg(if payload.is_empty() { "0" } else { "1" })
            .arg(mode.as_str())
            .invoke_async(&mut conn)
            .await
            .with_context(|| format!("cannot schedule a {t} task"))?;
        Ok(written == 1)
    }

    /// Schedules many tasks, each as [`Store::schedule`] would, in batches:
    /// one `schedule_batch.lua` call per type (or shard) and at most
    /// [`MAX_BATCH_TASKS`] tasks or [`MAX_BATCH_BYTES`], a few calls in flight
    /// at once. Returns, in the tasks' order, whether each due time was
    /// written. Each batch is atomic; an error (a type's keys of the wrong
    /// type) names the first task of its batch, which wrote nothing, while the
    /// batches sent before or beside it may be written.
    pub async fn schedule_many(&self, tasks: &[NewTask]) -> Result<Vec<bool>> {
        // Each task's shard, then the tasks of each shard in their order, cut into batches.
        let mut by_queue: std::collections::BTreeMap<TaskType, Vec<usize>> = std::collections::BTreeMap::new();
        for (i, task) in tasks.iter().enumerate() {
            by_queue.entry(self.shard_for(&task.task_type, &task.id)).or_default().push(i);
        }
        // One type's batches go out in order on one connection, several per round trip, so a later
        // task sees an earlier one's write; types go side by side.
        let queues = futures_util::stream::iter(by_queue).map(|(q, indexes)| async move {
            let k = self.keys(&q);
            let batches: Vec<&[usize]> = cut(tasks, &indexes).collect();
            let mut done: Vec<(usize, bool)> = Vec::with_capacity(indexes.len());
            for trip in batches.chunks(BATCHES_PER_TRIP) {
                let invocations: Vec<redis::ScriptInvocation<'_>> = trip
                    .iter()
                    .map(|batch| {
                        let mut inv = self.scripts.schedule_batch.prepare_invoke();
                        inv.key(&k.due).key(&k.payload);
                        for &i in *batch {
                            let task = &tasks[i];
                            inv.arg(&task.id)
                                .arg(task.due_ms)
                                .arg(task.payload.as_deref().unwrap_or_default())
                                .arg(task.mode.as_str());
                        }
                        inv
                    })
                    .collect();
                let written = self.invoke_in_order(&invocations).await;
                for (batch, written) in trip.iter().zip(written) {
                    let written = written.with_context(|| {
                        format!("cannot schedule a batch of {} {q} tasks, from tasks[{}]", batch.len(), batch[0])
                    })?;
                    anyhow::ensure!(
                        written.len() == batch.len(),
                        "schedule_batch: {} answers for {} tasks",
                        written.len(),
                        batch.len()
                    );
                    done.extend(batch.iter().zip(written).map(|(&i, w)| (i, w == 1)));
                }
            }
            anyhow::Ok(done)
        });
        let done: Vec<Vec<(usize, bool)>> = queues.buffer_unordered(QUEUES_IN_FLIGHT).try_collect().await?;
        let mut out = vec![false; tasks.len()];
        for (i, w) in done.into_iter().flatten() {
            out[i] = w;
        }
        Ok(out)
    }

    /// Runs `invocations` (of one script) in one pipeline, in order, and
    /// returns each one's reply. Those Redis answered NOSCRIPT (after a
    /// `SCRIPT FLUSH`, or a failover to a replica that never ran it) wrote
    /// nothing and are sent again, in their order, once the script is loaded.
    /// The one case that can reorder writes: another client loads the script
    /// between two of them, so a later one runs before an earlier one's
    /// resend (an id in both then ends as the earlier one left it).
    async fn invoke_in_order(&self, invocations: &[redis::ScriptInvocation<'_>]) -> Vec<Result<Vec<i64>>> {
        let mut replies: Vec<Option<Result<Vec<i64>>>> = invocations.iter().map(|_| None).collect();
        let mut todo: Vec<usize> = (0..invocations.len()).collect();
        for last_try in [false, true] {
            let mut pipe = redis::pipe();
            for &i in &todo {
                pipe.invoke_script(&invocations[i]);
            }
            let mut conn = self.conn.clone();
            let sent: redis::RedisResult<Vec<redis::RedisResult<Vec<i64>>>> =
                pipe.ignore_errors().query_async(&mut conn).await;
            let answers = match sent {
                Ok(answers) if answers.len() == todo.len() => answers,
                failed => {
                    // The connection failed (or answered out of step): nothing is known of the calls just sent.
                    let e = match failed {
                        Err(e) => anyhow::Error::new(e),
                        Ok(answers) => anyhow::anyhow!("{} replies to a pipeline of {}", answers.len(), todo.len()),
                    };
                    fail_all(&mut replies, &todo, e);
                    break;
                }
            };
            let mut missing = Vec::new();
            for (i, answer) in todo.iter().copied().zip(answers) {
                match answer {
                    Err(e) if !last_try && e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                        missing.push(i)
                    }
                    other => replies[i] = Some(other.map_err(anyhow::Error::new)),
                }
            }
            if missing.is_empty() {
                break;
            }
            let mut conn = self.conn.clone();
            if let Err(e) = invocations[missing[0]].load_async(&mut conn).await {
                fail_all(&mut replies, &missing, anyhow::Error::new(e));
                break;
            }
            todo = missing;
        }
        replies.into_iter().map(|r| r.unwrap_or_else(|| Err(anyhow::anyhow!("no reply")))).collect()
    }

    /// Waits until `replicas` replicas acknowledged this connection's writes,
    /// or `timeout` passed (Redis `WAIT`); returns how many did.
    pub async fn wait_replicas(&self, replicas: u32, timeout: Duration) -> Result<u32> {
        if self.target.is_cluster() {
            // WAIT counts the writes of its own connection to one node; a cluster
            // connection may send it to another node than the slot's master.
            bail!(
                "--wait-replicas is not supported on a Redis Cluster; use WAIT from a client connected to the slot's master"
            );
        }
        let mut conn = self.conn.clone();
        let acked: i64 = redis::cmd("WAIT")
            .arg(replicas)
            .arg(duration_ms(timeout))
            .query_async(&mut conn)
            .await
            .context("cannot wait for replicas (WAIT)")?;
        Ok(u32::try_from(acked).unwrap_or(0))
    }

    /// Pauses type `t` (every shard) on every host, for `length` or until resumed; returns
    /// when the pause ends (ms since the epoch), `None` for "until resumed".
    pub async fn pause(&self, t: &TaskType, length: Option<Duration>) -> Result<Option<i64>> {
        let mut ends = None;
        for shard in self.shards_of(t) {
            ends = self.pause_in(&shard, length).await?;
        }
        Ok(ends)
    }

    async fn pause_in(&self, t: &TaskType, length: Option<Duration>) -> Result<Option<i64>> {
        let k = self.keys(t);
        let mut conn = self.conn.clone();
        let ends: i64 = self
            .scripts
            .pause
            .key(&k.paused)
            .key(&k.due)
            .arg(length.map_or(0, duration_ms))
            .invoke_async(&mut conn)
            .await
            .with_context(|| format!("cannot pause {t}"))?;
        Ok((ends > 0).then_some(ends))
    }

    /// Resumes a paused type (every shard); false when it was not paused.
    pub async fn resume(&self, t: &TaskType) -> Result<bool> {
        let mut resumed = false;
        for shard in self.shards_of(t) {
            resumed |= self.resume_in(&shard).await?;
        }
        Ok(resumed)
    }

    async fn resume_in(&self, t: &TaskType) -> Result<bool> {
        let k = self.keys(t);
        let mut conn = self.conn.clone();
        let resumed: i64 = self
            .scripts
            .resume
            .key(&k.paused)
            .key(&k.due)
            .invoke_async(&mut conn)
            .await
            .with_context(|| format!("cannot resume {t}"))?;
        Ok(resumed == 1)
    }

    /// Whether task `id` of `t` is leased (claimed and not yet settled) now.
    pub async fn leased(&self, t: &TaskType, id: &[u8]) -> Result<bool> {
        Ok(self.show(t, id).await?.running.is_some())
    }
}
