//! Workflow groups in Redis: open, add, seal and show, and the outbox entries that carry a run's group work and a child's end.
//!
//! A group's state lives in its callback type's slot; each child's mark lives
//! in the child's type's slot. Crossing between the two always goes through
//! an outbox entry delivered exactly once (markers, as for follow-ups), so
//! on a cluster every script touches one slot. The order that makes it safe:
//! a child joins its group (`group_join.lua`) before it is scheduled
//! (`group_child.lua`), so no child can end before its group waits for it;
//! the group completes in the one step that sees it sealed with no child
//! pending (`group_end.lua`).

use anyhow::{Context, Result, anyhow, bail};
use serde::Serialize;

use super::entries::{decode_work, mode};

use crate::Store;
use crate::group::{Callback, GroupRef};
use crate::task::FollowUp;
use crate::task_type::TaskType;

/// How the outbox entry id of a run's work on a group ends (settle.lua).
pub(super) const WORK: &[u8] = b":group";

/// What the outbox passes did to groups, for the host's metrics and logs.
#[derive(Debug, Default)]
pub struct GroupMoves {
    /// Groups opened (by a run's work), by callback type.
    pub opened: Vec<TaskType>,
    /// Groups completed, and what that did with the callback.
    pub completed: Vec<(GroupRef, Fired)>,
    /// A run's work on a group that the group refused (sealed, done, another
    /// callback): the work is dropped, and this says why.
    pub refused: Vec<(GroupRef, String)>,
}

/// What a group's completion did with its callback.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Fired {
    /// Scheduled, due now, with the summary as its payload.
    Callback,
    /// Not scheduled: the group fires only if all succeed, and some did not.
    Skipped,
    /// Not scheduled: create-only, and its id was waiting or dead.
    Kept,
}

impl Fired {
    pub(super) fn parse(s: &[u8]) -> Option<Fired> {
        match s {
            b"callback" => Some(Fired::Callback),
            b"skipped" => Some(Fired::Skipped),
            b"kept" => Some(Fired::Kept),
            _ => None,
        }
    }

    /// The name used in metrics and `hourglass group show`.
    pub fn as_str(self) -> &'static str {
        match self {
            Fired::Callback => "callback",
            Fired::Skipped => "skipped",
            Fired::Kept => "kept",
        }
    }
}

/// Why a group entry of the outbox was not delivered.
pub(super) enum GroupDelivery {
    /// It can never be delivered (corrupt): dropped.
    Bad(anyhow::Error),
    /// The keys of this type are broken: the entry waits in the outbox.
    Waits(TaskType, anyhow::Error),
    /// Redis did not answer: the pass stops.
    Outage(anyhow::Error),
}

/// A child to add to a group from outside (`hourglass group add`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewChild {
    /// Its type.
    pub task_type: TaskType,
    /// Its id: text (the summary lists it).
    pub id: String,
    /// Its payload (empty: none).
    pub payload: Vec<u8>,
    /// When it is due, ms since the epoch.
    pub due_ms: i64,
}

/// What adding children did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Added {
    /// Children new to the group.
    pub joined: u64,
    /// Children not scheduled because their id is another group's child
    /// (the group counts them as cancelled).
    pub refused: Vec<(TaskType, String)>,
}

/// What sealing did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sealed {
    /// Sealed; children are still pending.
    Sealed,
    /// Sealed with none pending: it completed now.
    Completed(Fired),
    /// It was sealed (or done) before.
    Already,
}

/// A group as `hourglass group show` and the dashboard show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GroupView {
    /// The callback's type.
    pub callback_type: String,
    /// The group id.
    pub group: String,
    /// open | sealed | done.
    pub state: String,
    /// The callback's id.
    pub callback_id: String,
    /// all | success.
    pub when: String,
    /// Children added in all.
    pub added: u64,
    /// Children not ended yet.
    pub pending: u64,
    /// Children that succeeded.
    pub succeeded: u64,
    /// Children that were dead-lettered.
    pub dead: u64,
    /// Children that were cancelled (or refused).
    pub cancelled: u64,
    /// When it was opened, ms since the epoch.
    pub opened_ms: i64,
    /// When it completed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completed_ms: Option<i64>,
    /// What completing did with the callback.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fired: Option<String>,
    /// Up to 20 pending children, `<type>/<id>`.
    pub pending_sample: Vec<String>,
    /// Up to 20 children that did not succeed: `<type>/<id>` and how they ended.
    pub failed_sample: Vec<(String, String)>,
}

/// A group's hash, pending count, pending sample and failed sample (field, value, ...).
type GroupRead = (Vec<(String, String)>, u64, (u64, Vec<Vec<u8>>), (u64, Vec<Vec<u8>>));

/// Shown children of each list in a [`GroupView`].
const SAMPLE: usize = 20;

impl Store {
    /// Opens group `g` with its callback; opening an open group with the same
    /// callback again changes nothing. Returns whether this call created it.
    pub async fn group_open(&self, g: &GroupRef, callback: &Callback) -> Result<bool> {
        let (opened, _, _) = self.group_join(g, Some(callback), &[], None).await?;
        Ok(opened)
    }

    /// Adds children to open group `g` and schedules them (re-scheduling a
    /// waiting task with the same id, as `hourglass schedule` does).
    pub async fn group_add(&self, g: &GroupRef, children: &[NewChild]) -> Result<Added> {
        let members: Vec<String> = children.iter().map(|c| format!("{}\n{}", c.task_type, c.id)).collect();
        let mut added = Added::default();
        for chunk in children.chunks(CHILDREN_PER_CALL).zip(members.chunks(CHILDREN_PER_CALL)) {
            let (kids, names) = chunk;
            let (_, joined, numbers) = self.group_join(g, None, names, None).await?;
            added.joined += joined;
            let follow_ups: Vec<(u64, FollowUp, &NewChild)> = kids
                .iter()
                .zip(numbers)
                // Not pending any more: it was added before, and has ended since.
                .filter_map(|(c, number)| Some((number?, c)))
                .map(|(number, c)| {
                    let f = FollowUp {
                        task_type: c.task_type.clone(),
                        id: c.id.clone().into_bytes(),
                        payload: c.payload.clone(),
                        due_ms: c.due_ms,
                        replace: true,
                    };
                    (number, f, c)
                })
                .collect();
            let steps: Vec<(u64, &FollowUp, Option<Vec<u8>>)> =
                follow_ups.iter().map(|(number, f, _)| (*number, f, None)).collect();
            let done = self.group_children(g, &steps).await.map_err(|(_, e)| e)?;
            for ((_, _, c), result) in follow_ups.iter().zip(done) {
                if result == 2 {
                    added.refused.push((c.task_type.clone(), c.id.clone()));
                }
            }
        }
        let mut types: Vec<&TaskType> = added.refused.iter().map(|(t, _)| t).collect();
        types.dedup();
        for t in types {
            // The refused children's reports tell the group now, not at a host's next heartbeat.
            self.flush_outbox(t).await?;
        }
        Ok(added)
    }

    /// Seals group `g`: no more children; it completes once none is pending.
    pub async fn group_seal(&self, g: &GroupRef) -> Result<Sealed> {
        let (what, fired) = self.group_end(g, None).await?;
        Ok(match (what.as_str(), fired) {
            ("sealed", Some(f)) => Sealed::Completed(f),
            ("sealed", None) => Sealed::Sealed,
            _ => Sealed::Already,
        })
    }

    /// Group `g` as it is now, or `None` when there is no such group (never
    /// opened, or done more than 7 days ago).
    pub async fn group_show(&self, g: &GroupRef) -> Result<Option<GroupView>> {
        let gk = self.keys(&g.callback_type).group(&g.id);
        let mut conn = self.conn.clone();
        let (fields, pending, sample, failed): GroupRead = redis::pipe()
            .cmd("HGETALL")
            .arg(&gk.group)
            .cmd("HLEN")
            .arg(&gk.pending)
            // HSCAN, not HRANDFIELD: the commands a runner's ACL already has.
            .cmd("HSCAN")
            .arg(&gk.pending)
            .arg(0)
            .arg("COUNT")
            .arg(SAMPLE)
            .cmd("HSCAN")
            .arg(&gk.failed)
            .arg(0)
            .arg("COUNT")
            .arg(SAMPLE)
            .query_async(&mut conn)
            .await
            .with_context(|| format!("cannot read group {g}"))?;
        if fields.is_empty() {
            return Ok(None);
        }
        let field = |name: &str| fields.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
        let num = |name: &str| field(name).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        let shown = |member: &[u8]| String::from_utf8_lossy(member).replacen('\n', "/", 1);
        Ok(Some(GroupView {
            callback_type: g.callback_type.to_string(),
            group: g.id.to_string(),
            state: field("state").unwrap_or_default(),
            callback_id: field("callback_id").unwrap_or_default(),
            when: field("when").unwrap_or_default(),
            added: num("added"),
            pending,
            succeeded: num("succeeded"),
            dead: num("dead"),
            cancelled: num("cancelled"),
            opened_ms: num("opened_ms") as i64,
            completed_ms: field("completed_ms").and_then(|v| v.parse().ok()),
            fired: field("fired"),
            pending_sample: sample.1.chunks_exact(2).take(SAMPLE).map(|p| shown(&p[0])).collect(),
            failed_sample: failed
                .1
                .chunks_exact(2)
                .take(SAMPLE)
                .map(|p| (shown(&p[0]), String::from_utf8_lossy(&p[1]).into_owned()))
                .collect(),
        }))
    }

    /// The groups with callbacks of type `c` that are not done, oldest first:
    /// (group id, opened ms), at most `limit`.
    pub async fn groups_open(&self, c: &TaskType, limit: usize) -> Result<Vec<(String, i64)>> {
        let k = self.keys(c);
        let mut conn = self.conn.clone();
        let rows: Vec<(String, f64)> = redis::cmd("ZRANGE")
            .arg(&k.groups)
            .arg(0)
            .arg(limit.saturating_sub(1) as i64)
            .arg("WITHSCORES")
            .query_async(&mut conn)
            .await
            .with_context(|| format!("cannot list the {c} groups"))?;
        Ok(rows.into_iter().map(|(g, s)| (g, s as i64)).collect())
    }

    /// group_join.lua: opens (with `callback`) and/or joins `members`; once
    /// per `marker` when given. Returns (opened, joined, each member's join
    /// number: `None` when it is no longer pending).
    async fn group_join(
        &self,
        g: &GroupRef,
        callback: Option<&Callback>,
        members: &[String],
        marker: Option<&[u8]>,
    ) -> Result<(bool, u64, Vec<Option<u64>>)> {
        let k = self.keys(&g.callback_type);
        let gk = k.group(&g.id);
        let mut inv = self.scripts.group_join.prepare_invoke();
        inv.key(&gk.group).key(&gk.pending).key(&k.groups).key(&k.stats);
        marker_key(&mut inv, &k, marker);
        inv.arg(g.id.as_str()).arg(if marker.is_some() { "1" } else { "0" });
        match callback {
            Some(cb) => inv.arg("1").arg(&cb.id).arg(&cb.payload).arg(cb.when.as_str()).arg(mode(cb.replace)),
            None => inv.arg("0").arg("").arg("").arg("").arg(""),
        };
        for m in members {
            inv.arg(m);
        }
        let mut conn = self.conn.clone();
        let reply: Vec<Option<i64>> = inv.invoke_async(&mut conn).await.with_context(|| format!("group {g}"))?;
        match reply.as_slice() {
            [Some(opened), Some(joined), numbers @ ..] if numbers.len() == members.len() => {
                Ok((*opened == 1, (*joined).max(0) as u64, numbers.iter().map(|n| n.map(|n| n as u64)).collect()))
            }
            _ => bail!("group {g}: unexpected reply {reply:?} to a join"),
        }
    }

    /// group_child.lua: schedules children of group `g` (each with its join
    /// number and its step's marker, if it runs once), marked as the group's;
    /// one script call per run of consecutive children of one type, and up
    /// to [`CHILDREN_PER_CALL`]. Returns per child 1 scheduled, 0 ran before,
    /// 2 refused; or the type whose call failed, and why.
    async fn group_children(
        &self,
        g: &GroupRef,
        children: &[(u64, &FollowUp, Option<Vec<u8>>)],
    ) -> Result<Vec<i64>, (TaskType, anyhow::Error)> {
        let mut results = Vec::with_capacity(children.len());
        // One call per run of children in the same slot: of one type, or of one shard of a sharded type.
        let shard = |c: &(u64, &FollowUp, Option<Vec<u8>>)| self.shard_for(&c.1.task_type, &c.1.id);
        let of_one_shard = children.chunk_by(|a, b| shard(a) == shard(b));
        for batch in of_one_shard.flat_map(|run| run.chunks(CHILDREN_PER_CALL)) {
            let t = &shard(&batch[0]);
            let marked = batch.iter().map(|(number, f, marker)| {
                (marker.as_deref(), *f, format!("{}\n{number}", g.membership()).into_bytes())
            });
            let inv = self.group_child_call(t, marked);
            let mut conn = self.conn.clone();
            let done: Result<Vec<i64>> = inv
                .invoke_async(&mut conn)
                .await
                .with_context(|| format!("cannot schedule {} {t} children of group {g}", batch.len()));
            match done {
                Ok(done) if done.len() == batch.len() => results.extend(done),
                Ok(done) => {
                    return Err((t.clone(), anyhow!("group {g}: {} results for {} children", done.len(), batch.len())));
                }
                Err(e) => return Err((t.clone(), e)),
            }
        }
        Ok(results)
    }

    /// The group_child.lua call that schedules `children` in shard `t`, each
    /// (its entry's marker, when it must run once; the task; its mark in
    /// `member`): a group's child or a graph's node.
    pub(super) fn group_child_call<'a, 'c>(
        &'a self,
        t: &TaskType,
        children: impl IntoIterator<Item = (Option<&'c [u8]>, &'c FollowUp, Vec<u8>)>,
    ) -> redis::ScriptInvocation<'a> {
        let k = self.keys(t);
        let mut inv = self.scripts.group_child.prepare_invoke();
        inv.key(&k.due).key(&k.payload).key(&k.member).key(&k.dead).key(&k.outbox).key(&k.seq);
        inv.arg(t.as_str());
        for (marker, f, mark) in children {
            marker_key(&mut inv, &k, marker);
            inv.arg(&f.id)
                .arg(f.due_ms)
                .arg(&f.payload)
                .arg(if f.payload.is_empty() { "0" } else { "1" })
                .arg(mark)
                .arg(mode(f.replace))
                .arg(if marker.is_some() { "1" } else { "0" });
        }
        inv
    }

    /// group_end.lua: seals `g` (once per `marker` when given). Returns
    /// what it did and, when the group completed, what it fired.
    async fn group_end(&self, g: &GroupRef, marker: Option<&[u8]>) -> Result<(String, Option<Fired>)> {
        let k = self.keys(&g.callback_type);
        let gk = k.group(&g.id);
        let mut inv = self.scripts.group_end.prepare_invoke();
        inv.key(&gk.group).key(&gk.pending).key(&gk.failed).key(&k.groups).key(&k.stats);
        inv.key(&k.due).key(&k.payload).key(&k.dead);
        marker_key(&mut inv, &k, marker);
        inv.arg(g.id.as_str()).arg(if marker.is_some() { "1" } else { "0" });
        let mut conn = self.conn.clone();
        let reply: Vec<Vec<u8>> = inv.invoke_async(&mut conn).await.with_context(|| format!("group {g}"))?;
        match reply.as_slice() {
            [what, fired] => Ok((String::from_utf8_lossy(what).into_owned(), Fired::parse(fired))),
            _ => bail!("group {g}: unexpected reply to a seal"),
        }
    }

    /// Delivers the outbox entry `entry_id` of a run's work on one group:
    /// open and join, schedule each child, then seal; each step once (its
    /// own marker), so a pass cut short anywhere is finished by the next.
    pub(super) async fn deliver_work(
        &self,
        entry_id: &[u8],
        data: &[u8],
        moves: &mut GroupMoves,
    ) -> Result<(), GroupDelivery> {
        let work = decode_work(data).map_err(GroupDelivery::Bad)?;
        let g = &work.group;
        let marker = |step: &str| [entry_id, b":", step.as_bytes()].concat();
        let members: Vec<String> =
            work.children.iter().map(|c| format!("{}\n{}", c.task_type, String::from_utf8_lossy(&c.id))).collect();
        let numbers = match self.group_join(g, work.open.as_ref(), &members, Some(&marker("join"))).await {
            Ok((opened, _, numbers)) => {
                if opened {
                    moves.opened.push(g.callback_type.clone());
                }
                numbers
            }
            Err(e) => return refused_or(g, e, moves),
        };
        let steps: Vec<(u64, &FollowUp, Option<Vec<u8>>)> = work
            .children
            .iter()
            .zip(numbers)
            .enumerate()
            // No longer pending: scheduled by an earlier pass, and ended since.
            .filter_map(|(n, (child, number))| Some((number?, child, Some(marker(&n.to_string())))))
            .collect();
        if let Err((t, e)) = self.group_children(g, &steps).await {
            return Err(classified(&t, e));
        }
        if work.seal {
            match self.group_end(g, Some(&marker("seal"))).await {
                Ok((_, Some(fired))) => moves.completed.push((g.clone(), fired)),
                Ok(_) => {}
                Err(e) => return refused_or(g, e, moves),
            }
        }
        Ok(())
    }
}

/// The marker key (in `k`'s slot) of a step that runs once, or a key that
/// the script does not use (it is still declared, in the same slot).
fn marker_key(inv: &mut redis::ScriptInvocation<'_>, k: &crate::Keys, marker: Option<&[u8]>) {
    match marker {
        Some(m) => inv.key(k.delivered(m)),
        None => inv.key(k.delivered(b"-")),
    };
}

/// A group's own refusal (HGGROUP) is the run's mistake: recorded, dropped.
fn refused_or(g: &GroupRef, e: anyhow::Error, moves: &mut GroupMoves) -> Result<(), GroupDelivery> {
    if let Some(why) = group_refusal(&e) {
        moves.refused.push((g.clone(), why));
        return Ok(());
    }
    Err(classified(&g.callback_type, e))
}

/// The text of a group's refusal (HGGROUP), if `e` is one.
pub fn group_refusal(e: &anyhow::Error) -> Option<String> {
    let redis = e.chain().find_map(|c| c.downcast_ref::<redis::RedisError>())?;
    (redis.code() == Some("HGGROUP")).then(|| redis.detail().unwrap_or_default().to_owned())
}

/// Why a workflow group step was refused (`HGGROUP` from its script, which
/// wrote nothing), for callers that match on it; the Python and Node clients
/// raise the same three (`NoSuchGroup`, `GroupClosed`, `GroupConflict`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GroupRefusal {
    /// The group was never opened, or was done more than 7 days ago.
    #[error("{0}")]
    NoSuchGroup(String),
    /// The group is sealed or done: no children can be added.
    #[error("{0}")]
    Closed(String),
    /// Opening a group that is open with another callback, or that already completed.
    #[error("{0}")]
    Conflict(String),
}

impl GroupRefusal {
    /// The refusal that error `e` of a group step carries, if it is one.
    pub fn of(e: &anyhow::Error) -> Option<GroupRefusal> {
        // The words of group_join.lua's and group_end.lua's refusals.
        let why = group_refusal(e)?;
        Some(if why.starts_with("no group") {
            GroupRefusal::NoSuchGroup(why)
        } else if why.contains("no children can be added") {
            GroupRefusal::Closed(why)
        } else {
            GroupRefusal::Conflict(why)
        })
    }
}

fn classified(t: &TaskType, e: anyhow::Error) -> GroupDelivery {
    match crate::classify(&e) {
        crate::Trouble::Outage => GroupDelivery::Outage(e),
        _ => GroupDelivery::Waits(t.clone(), e),
    }
}

/// Children scheduled per script call (all of one type): 128 of them hold Redis about 0.7–0.9 ms a
/// call, as `schedule_batch`'s bound does (BENCHMARKS.md, "Scheduling in batches"; 256 took 1.3–1.5 ms).
pub const CHILDREN_PER_CALL: usize = 128;
