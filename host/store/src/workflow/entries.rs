//! What the outbox holds, and its encodings: a follow-up, a run's work on a group, and a child's (or a graph node's) end, its report.

use anyhow::{Context, Result, anyhow, bail};

use crate::group::{Callback, FireWhen, GroupId, GroupRef};
use crate::task::{FollowUp, GroupWork};
use crate::task_type::TaskType;

/// How the outbox entry id of a report ends (written by the scripts).
pub(super) const REPORT: &[u8] = b":report";

/// What a report goes to: a workflow group (its callback's type is the
/// home) or a workflow graph (its home type).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Parent {
    /// The task was a group's child.
    Group,
    /// The task was a graph's node: its mark's type began with the unit separator.
    Graph,
}

/// A report: a group child's or a graph node's end, as its outbox entry holds it.
pub(crate) struct Report {
    /// The group or graph: its home type and id.
    pub(crate) group: GroupRef,
    /// Which of the two it is.
    pub(crate) parent: Parent,
    pub(super) child_type: String,
    pub(super) id: Vec<u8>,
    pub(crate) outcome: String,
    /// Its place in its parent: a group child's join (its group's `added`
    /// when it joined), a graph node's index.
    pub(crate) number: u64,
}

/// The child type is the entry id's first part; the value is
/// `<outcome>\n<callback type>\n<group id>\n<id>` (the prelude's report_ended).
pub(crate) fn decode_report(entry_id: &[u8], data: &[u8]) -> Result<Report> {
    let child_type = entry_id.split(|&b| b == b':').next().unwrap_or_default();
    // A shard's entries carry its name (`T#2:...`), so they never collide with another shard's; the group knows the type.
    let child_type =
        TaskType::parse_queue(std::str::from_utf8(child_type).context("report entry id is not text")?)?.base();
    let mut parts = data.splitn(5, |&b| b == b'\n');
    let mut text = |what: &str| -> Result<&str> {
        let part = parts.next().ok_or_else(|| anyhow!("group report has no {what}"))?;
        std::str::from_utf8(part).with_context(|| format!("group report {what} is not text"))
    };
    let outcome = text("outcome")?.to_owned();
    let home = text("callback type")?;
    // A graph node's mark names the graph's home type after a unit separator (the prelude's graph_node_entry).
    let (parent, home) = match home.strip_prefix('\u{1f}') {
        Some(home) => (Parent::Graph, home),
        None => (Parent::Group, home),
    };
    let callback_type: TaskType = home.parse()?;
    let id: GroupId = text("group id")?.parse()?;
    let number: u64 = text("join number")?.parse().context("group report join number is not a number")?;
    let child = parts.next().ok_or_else(|| anyhow!("group report has no child id"))?.to_vec();
    Ok(Report {
        group: GroupRef { callback_type, id },
        child_type: child_type.to_string(),
        id: child,
        outcome,
        number,
        parent,
    })
}

/// Appends `bytes` as `<len>\n<bytes>`.
fn put(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(format!("{}\n", bytes.len()).as_bytes());
    out.extend_from_slice(bytes);
}

/// Reads what [`put`] wrote.
fn take<'a>(data: &mut &'a [u8]) -> Result<&'a [u8]> {
    let nl = data.iter().position(|&b| b == b'\n').ok_or_else(|| anyhow!("group entry is truncated"))?;
    let len: usize = std::str::from_utf8(&data[..nl])?.parse().context("bad length in group entry")?;
    let rest = &data[nl + 1..];
    if rest.len() < len {
        bail!("group entry is truncated");
    }
    let (out, tail) = rest.split_at(len);
    *data = tail;
    Ok(out)
}

fn take_str<'a>(data: &mut &'a [u8]) -> Result<&'a str> {
    std::str::from_utf8(take(data)?).context("group entry field is not text")
}

/// Encodes a run's work on one group for the outbox (entry id ends [`WORK`]).
pub fn encode_work(w: &GroupWork) -> Vec<u8> {
    let mut out = Vec::new();
    put(&mut out, w.group.callback_type.as_str().as_bytes());
    put(&mut out, w.group.id.as_str().as_bytes());
    put(&mut out, if w.seal { b"s" } else { b"-" });
    match &w.open {
        Some(cb) => {
            put(&mut out, b"o");
            put(&mut out, cb.id.as_bytes());
            put(&mut out, cb.payload.as_bytes());
            put(&mut out, cb.when.as_str().as_bytes());
            put(&mut out, mode(cb.replace).as_bytes());
        }
        None => put(&mut out, b"-"),
    }
    for c in &w.children {
        put(&mut out, mode(c.replace).as_bytes());
        put(&mut out, &crate::encode_followup(c));
    }
    out
}

/// Decodes what [`encode_work`] wrote.
pub fn decode_work(mut data: &[u8]) -> Result<GroupWork> {
    let d = &mut data;
    let callback_type: TaskType = take_str(d)?.parse()?;
    let id: GroupId = take_str(d)?.parse()?;
    let seal = take(d)? == b"s";
    let open = match take(d)? {
        b"o" => Some(Callback {
            id: take_str(d)?.to_owned(),
            payload: take_str(d)?.to_owned(),
            when: take_str(d)?.parse::<FireWhen>()?,
            replace: take(d)? == b"replace",
        }),
        _ => None,
    };
    let mut children = Vec::new();
    while !d.is_empty() {
        let replace = take(d)? == b"replace";
        let entry: &[u8] = if replace { b"" } else { b":create" };
        children.push(crate::decode_followup(entry, take(d)?)?);
    }
    Ok(GroupWork { group: GroupRef { callback_type, id }, open, children, seal })
}

/// How a follow-up's entry names whether it may replace a waiting task.
pub(crate) fn mode(replace: bool) -> &'static str {
    if replace { "replace" } else { "create" }
}

/// How an outbox entry id ends when its follow-up is create-only (settle.lua).
const CREATE_ONLY: &[u8] = b":create";

/// Encodes a follow-up for the outbox: `<type>\n<due_ms>\n<id_len>\n<id><payload>`
/// (binary-safe). Whether it may replace is in the entry id (settle.lua).
pub fn encode_followup(f: &FollowUp) -> Vec<u8> {
    let mut out = format!("{}\n{}\n{}\n", f.task_type, f.due_ms, f.id.len()).into_bytes();
    out.extend_from_slice(&f.id);
    out.extend_from_slice(&f.payload);
    out
}

/// Decodes the outbox entry `entry_id` holding what [`encode_followup`] wrote.
pub fn decode_followup(entry_id: &[u8], data: &[u8]) -> Result<FollowUp> {
    let mut parts = data.splitn(4, |&b| b == b'\n');
    let mut text = |what: &str| -> Result<&str> {
        let part = parts.next().ok_or_else(|| anyhow!("outbox entry has no {what}"))?;
        std::str::from_utf8(part).with_context(|| format!("outbox entry {what} is not text"))
    };
    let task_type: TaskType = text("type")?.parse()?;
    let due_ms: i64 = text("due time")?.parse().context("bad due time in outbox entry")?;
    let id_len: usize = text("id length")?.parse().context("bad id length in outbox entry")?;
    let rest = parts.next().unwrap_or_default();
    if rest.len() < id_len {
        bail!("outbox entry is truncated");
    }
    let (id, payload) = rest.split_at(id_len);
    let replace = !entry_id.ends_with(CREATE_ONLY);
    Ok(FollowUp { task_type, id: id.to_vec(), payload: payload.to_vec(), due_ms, replace })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::task::FollowUp;

    #[test]
    fn group_work_round_trips() {
        let child = |id: &str, replace| FollowUp {
            task_type: "ship".parse().unwrap(),
            id: id.as_bytes().to_vec(),
            payload: b"p\n1".to_vec(),
            due_ms: 7,
            replace,
        };
        let work = GroupWork {
            group: GroupRef { callback_type: "order.done".parse().unwrap(), id: "o-1".parse().unwrap() },
            open: Some(Callback {
                id: "cb".into(),
                payload: "{}".into(),
                when: FireWhen::AllSucceeded,
                replace: false,
            }),
            children: vec![child("a", true), child("b\nc", false)],
            seal: true,
        };
        assert_eq!(decode_work(&encode_work(&work)).unwrap(), work);
        let bare = GroupWork { open: None, children: vec![], seal: false, ..work };
        assert_eq!(decode_work(&encode_work(&bare)).unwrap(), bare);
        assert!(decode_work(b"9\nshort").is_err());
    }

    #[test]
    fn reports_name_the_child_type_in_their_entry_id() {
        let r = decode_report(b"ship:41:report", b"dead\norder.done\no-1\n7\nid\nwith newline").unwrap();
        assert_eq!(
            (r.child_type.as_str(), r.outcome.as_str(), r.number, r.id.as_slice()),
            ("ship", "dead", 7, &b"id\nwith newline"[..])
        );
        assert_eq!(r.group.to_string(), "order.done/o-1");
        assert!(decode_report(b"ship:41:report", b"dead\nBAD TYPE\ng\n1\nid").is_err());
        assert!(decode_report(b"ship:41:report", b"dead\norder.done\ng\nseven\nid").is_err(), "no join number");
    }

    #[test]
    fn followup_encoding_round_trips() {
        let f = FollowUp {
            task_type: "a.b".parse().unwrap(),
            id: vec![0, 10, 255, b'\n'],
            payload: vec![b'\n', 0, 1],
            due_ms: -5,
            replace: true,
        };
        assert_eq!(decode_followup(b"src:7:0", &encode_followup(&f)).unwrap(), f);
        let created = FollowUp { replace: false, ..f.clone() };
        assert_eq!(decode_followup(b"src:7:0:create", &encode_followup(&created)).unwrap(), created);
        assert!(decode_followup(b"src:7:0", b"a\n1\n9\nxy").is_err());
    }
}
