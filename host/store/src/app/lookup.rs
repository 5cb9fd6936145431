//! One task looked up by its id (`hourglass show`, the dashboard's task page), and an operator's move of one scheduled task.

use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use redis::Value;
use serde::Serialize;

use super::progress::ProgressView;
use crate::reply::{array, int, opt_bytes, opt_int, score};
use crate::task_type::TaskType;
use crate::{Store, duration_ms};

/// Payload bytes read for a preview: enough for [`PREVIEW_CHARS`] characters of UTF-8 text.
const PREVIEW_BYTES: usize = 800;
/// Characters of a text payload shown.
const PREVIEW_CHARS: usize = 200;
/// Bytes of a binary payload shown as hex.
const PREVIEW_HEX_BYTES: usize = 64;

/// Where a task is now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TaskState {
    /// In `due` with a due time in the future.
    Scheduled,
    /// In `due` with a due time now or past: waiting for a claim.
    Due,
    /// Leased by a host (running, or its host died and the lease runs out).
    Running,
    /// Dead-lettered.
    Dead,
    /// Not scheduled, running or dead.
    Unknown,
}

/// The lease of a running task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LeaseView {
    /// The host id that holds it ("" for a host without one).
    pub host: String,
    /// The attempt running (1 = first).
    pub attempt: u32,
    /// The lease token (fencing).
    pub token: u64,
    /// When the lease runs out unless renewed, ms since the epoch; renewed every third of `lease` while the task runs.
    pub lease_until_ms: i64,
}

/// The start of a payload and its size.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PayloadPreview {
    /// Its size in bytes.
    pub size: u64,
    /// Up to 200 characters, when it is UTF-8 text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Its first 64 bytes as hex, when it is not text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hex: Option<String>,
    /// Whether the preview shows less than the whole payload.
    pub truncated: bool,
}

/// Everything Redis knows about one task, read in one snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TaskView {
    /// Its type: of a sharded type, the shard it is in (named by its hash tag, `hot#3`).
    pub task_type: TaskType,
    /// Of a sharded type, the index (0 to N-1) of its shard; absent for a type
    /// with one shard, and for a task in a tag that is none of the current
    /// shards (left by a lower `shards` or an earlier version's tags).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shard: Option<u16>,
    /// Its id as (lossy) UTF-8 text; `id_hex` has the exact bytes.
    #[serde(serialize_with = "super::queues::serialize_lossy")]
    pub id: Vec<u8>,
    /// The id as hex.
    pub id_hex: String,
    /// Redis' clock when it was read, ms since the epoch.
    pub now_ms: i64,
    /// Where it is.
    pub state: TaskState,
    /// Its score in `due`, when it is there (also for a running or dead task a client scheduled
    /// again; of a running one, the time the client gave, which waits for the run to end).
    pub due_ms: Option<i64>,
    /// Its lease, while a host holds it.
    pub running: Option<LeaseView>,
    /// When it was dead-lettered, while it is dead.
    pub died_ms: Option<i64>,
    /// Attempts that ended without success so far (a running attempt is in `running`).
    pub attempts: u32,
    /// The error of the last failed attempt.
    pub last_error: Option<String>,
    /// The start of its payload; `None` when it has none.
    pub payload: Option<PayloadPreview>,
    /// The workflow group it is a child of, `<callback type>/<group id>`, until it ends.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// The workflow graph it is a node of, `<home type>/<graph id>`, until it ends.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub graph: Option<String>,
    /// The progress its handler last reported, kept across retries until it ends.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub progress: Option<ProgressView>,
}

impl Store {
    /// Where task `id` of `t` is and what Redis holds about it, read in one
    /// snapshot by a read-only script; [`TaskState::Unknown`] when it is nowhere.
    /// Of a sharded type, the shard it is in (its own first, then the others).
    pub async fn show(&self, t: &TaskType, id: &[u8]) -> Result<TaskView> {
        let mut shards = self.lookup_order(t, id).into_iter();
        let mut view = self.show_in(&shards.next().unwrap_or_else(|| t.clone()), id).await?;
        for shard in shards {
            if view.state != TaskState::Unknown {
                break;
            }
            view = self.show_in(&shard, id).await?;
        }
        if view.state == TaskState::Unknown {
            view.task_type = self.shard_for(t, id);
        }
        if self.shard_count(t) > 1 {
            view.shard = self.shard_index(&view.task_type);
        }
        Ok(view)
    }

    async fn show_in(&self, t: &TaskType, id: &[u8]) -> Result<TaskView> {
        let k = self.keys(t);
        let mut conn = self.conn.clone();
        let value: Value = self
            .scripts
            .show
            .key(&k.due)
            .key(&k.leases)
            .key(&k.tokens)
            .key(&k.attempts)
            .key(&k.errors)
            .key(&k.dead)
            .key(&k.payload)
            .key(&k.claims)
            .key(&k.claimed)
            .key(&k.member)
            .key(&k.held)
            .key(&k.progress)
            .arg(id)
            .arg(PREVIEW_BYTES)
            .invoke_async(&mut conn)
            .await
            .with_context(|| format!("cannot look up a {t} task"))?;
        parse_show(t, id, value).with_context(|| format!("unexpected show reply for {t}"))
    }

    /// Moves a scheduled task of `t`: due now (`postpone` = `None`), or
    /// `postpone` later than the later of its due time and now. Only a task
    /// in `due` moves; returns its new due time, or `None` when it is not
    /// scheduled (running, dead or gone: nothing is written).
    pub async fn reschedule(&self, t: &TaskType, id: &[u8], postpone: Option<Duration>) -> Result<Option<i64>> {
        for shard in self.lookup_order(t, id) {
            if let Some(due) = self.reschedule_in(&shard, id, postpone).await? {
                return Ok(Some(due));
            }
        }
        Ok(None)
    }

    async fn reschedule_in(&self, t: &TaskType, id: &[u8], postpone: Option<Duration>) -> Result<Option<i64>> {
        let k = self.keys(t);
        let mut conn = self.conn.clone();
        let mut inv = self.scripts.reschedule.key(&k.due);
        inv.arg(id);
        match postpone {
            None => inv.arg("now"),
            Some(d) => inv.arg("postpone").arg(duration_ms(d)),
        };
        let value: Value =
            inv.invoke_async(&mut conn).await.with_context(|| format!("cannot reschedule a {t} task"))?;
        match value {
            Value::Nil | Value::Boolean(false) => Ok(None),
            other => Ok(Some(int(other).with_context(|| format!("unexpected reschedule reply for {t}"))?)),
        }
    }
}

fn parse_show(t: &TaskType, id: &[u8], value: Value) -> Result<TaskView> {
    let mut v = array(value)?.into_iter();
    let mut next = || v.next().ok_or_else(|| anyhow!("short reply"));
    let now_ms = int(next()?)?;
    let due_ms = score(next()?)?;
    let lease_until = score(next()?)?;
    let token_entry = opt_bytes(next()?)?;
    let attempts = opt_int(next()?)?.unwrap_or(0).clamp(0, i64::from(u32::MAX)) as u32;
    let last_error = opt_bytes(next()?)?.map(|e| String::from_utf8_lossy(&e).into_owned());
    let died_ms = score(next()?)?;
    let payload_len = opt_int(next()?)?.unwrap_or(0).max(0) as u64;
    let head = opt_bytes(next()?)?;
    // The mark is "<callback type>\n<group id>\n<join number>": shown as "<callback type>/<group id>";
    // a graph node's begins with a unit separator (the prelude's graph_node_entry).
    let (group, graph) = match opt_bytes(next()?)? {
        None => (None, None),
        Some(mark) => {
            let text = String::from_utf8_lossy(&mark).into_owned();
            let mut parts = text.splitn(3, '\n');
            let (home, id) = (parts.next().unwrap_or_default(), parts.next().unwrap_or_default());
            match home.strip_prefix('\u{1f}') {
                Some(home) => (None, Some(format!("{home}/{id}"))),
                None => (Some(format!("{home}/{id}")), None),
            }
        }
    };
    let progress = opt_bytes(next()?)?.and_then(|p| ProgressView::parse(&p));
    let running = match (lease_until, token_entry) {
        (Some(until), Some(entry)) => Some(parse_lease(&entry, until)?),
        // A lease without a token (or the reverse) is a claim or settle caught half-way by nobody:
        // scripts are atomic, so it cannot be seen; show what there is.
        (Some(until), None) => {
            Some(LeaseView { host: String::new(), attempt: attempts + 1, token: 0, lease_until_ms: until })
        }
        (None, _) => None,
    };
    let state = if running.is_some() {
        TaskState::Running
    } else if let Some(due) = due_ms {
        if due <= now_ms { TaskState::Due } else { TaskState::Scheduled }
    } else if died_ms.is_some() {
        TaskState::Dead
    } else {
        TaskState::Unknown
    };
    let payload = head.map(|head| preview(&head, payload_len));
    Ok(TaskView {
        task_type: t.clone(),
        shard: None,
        id: id.to_vec(),
        id_hex: hex::encode(id),
        now_ms,
        state,
        due_ms,
        running,
        died_ms,
        attempts,
        last_error,
        payload,
        group,
        graph,
        progress,
    })
}

/// Reads a tokens entry: `<token>:<attempt>[@<host id>]`.
fn parse_lease(entry: &[u8], lease_until_ms: i64) -> Result<LeaseView> {
    let text = String::from_utf8_lossy(entry);
    let (numbers, host) = text.split_once('@').unwrap_or((&text, ""));
    let Some((token, attempt)) = numbers.split_once(':') else {
        bail!("tokens entry {text:?} is not <token>:<attempt>[@<host id>]");
    };
    Ok(LeaseView {
        host: host.to_owned(),
        attempt: attempt.parse().with_context(|| format!("bad attempt in tokens entry {text:?}"))?,
        token: token.parse().with_context(|| format!("bad token in tokens entry {text:?}"))?,
        lease_until_ms,
    })
}

/// A preview of a payload from its first bytes: text when they are UTF-8
/// (a character cut at the end of what was read does not count), hex otherwise.
fn preview(head: &[u8], size: u64) -> PayloadPreview {
    let text = match std::str::from_utf8(head) {
        Ok(s) => Some(s),
        // Only a character cut off by the read may be incomplete.
        Err(e) if e.error_len().is_none() => std::str::from_utf8(&head[..e.valid_up_to()]).ok(),
        Err(_) => None,
    }
    .filter(|s| !s.chars().any(|c| c.is_control() && !matches!(c, '\n' | '\r' | '\t')));
    match text {
        Some(s) => {
            let shown: String = s.chars().take(PREVIEW_CHARS).collect();
            let truncated = (shown.len() as u64) < size;
            PayloadPreview { size, text: Some(shown), hex: None, truncated }
        }
        None => {
            let shown = &head[..head.len().min(PREVIEW_HEX_BYTES)];
            PayloadPreview { size, text: None, hex: Some(hex::encode(shown)), truncated: (shown.len() as u64) < size }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_payloads_are_shown_as_text_and_binary_as_hex() {
        let p = preview(b"{\"order\": 42}", 13);
        assert_eq!((p.text.as_deref(), p.hex, p.truncated), (Some("{\"order\": 42}"), None, false));
        let long = "é".repeat(400);
        let p = preview(&long.as_bytes()[..PREVIEW_BYTES - 1], long.len() as u64);
        assert_eq!(
            p.text.as_deref().map(|t| t.chars().count()),
            Some(PREVIEW_CHARS),
            "a cut last character is not binary"
        );
        assert!(p.truncated);
        let p = preview(&[0, 159, 146, 150, 1], 5);
        assert_eq!((p.text, p.hex.as_deref(), p.truncated), (None, Some("009f929601"), false));
        let p = preview(b"a\x07b", 3);
        assert_eq!(p.hex.as_deref(), Some("610762"), "control characters are not text");
    }

    #[test]
    fn token_entries_name_attempt_and_host() {
        let l = parse_lease(b"17:3@host-a@b", 99).unwrap();
        assert_eq!((l.token, l.attempt, l.host.as_str(), l.lease_until_ms), (17, 3, "host-a@b", 99));
        assert_eq!(parse_lease(b"5:1", 1).unwrap().host, "");
        assert!(parse_lease(b"garbage", 1).is_err());
    }
}
