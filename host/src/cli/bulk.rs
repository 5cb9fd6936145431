//! `hourglass schedule-many`: tasks from a JSON Lines file, every line checked before the first write, then written in batches.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use clap::Args;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::{parse_at, parse_in};
use crate::clock::now_ms;
use crate::store::{NewTask, ScheduleMode, Store};
use crate::task_type::TaskType;

/// `hourglass schedule-many`.
#[derive(Debug, Args)]
pub struct ScheduleManyArgs {
    /// JSON Lines, one task a line: `{"task_type": "order.expire", "id": "o-1", "delay": "15m", "payload": {"order": 1}}`
    /// (fields: task_type, id or id_hex, payload or payload_hex, one of at, at_ms, delay, delay_ms [default: due
    /// now], mode); `-` reads standard input.
    pub file: PathBuf,
    /// After writing, wait until this many replicas have it all (Redis WAIT); exit 1 if fewer do in time.
    #[arg(long, value_name = "N")]
    pub wait_replicas: Option<u32>,
    /// How long --wait-replicas waits.
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = parse_in, requires = "wait_replicas")]
    pub wait_timeout: Duration,
}

/// One line of the file, as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Line<'a> {
    /// Its type.
    task_type: String,
    /// Its id, as text.
    id: Option<String>,
    /// Its id as hex, for ids that are not text.
    id_hex: Option<String>,
    /// Its payload: a JSON string is written as its text, any other JSON value as written in the file.
    #[serde(borrow)]
    payload: Option<&'a RawValue>,
    /// Its payload as hex, for payloads that are not text.
    payload_hex: Option<String>,
    /// When it is due: RFC 3339, or ms since the Unix epoch.
    at: Option<AtValue>,
    /// When it is due, ms since the Unix epoch.
    at_ms: Option<i64>,
    /// Due in this long from now: `30s`, `15m`, `1h 30m`.
    delay: Option<String>,
    /// Due in this many ms from now.
    delay_ms: Option<u64>,
    /// upsert (default), if-absent, only-later or only-earlier: what happens to an id already scheduled.
    mode: Option<String>,
}

/// `at`: RFC 3339 text or integer ms, as `hourglass schedule --at` takes.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum AtValue {
    Ms(i64),
    Text(String),
}

/// One line checked: the task it schedules (`now` is when the file was read, for delays).
fn parse_line(text: &str, now: i64) -> Result<NewTask> {
    let line: Line = serde_json::from_str(text).map_err(|e| anyhow!("{e}"))?;
    let task_type: TaskType = line.task_type.parse().map_err(|e| anyhow!("task_type: {e}"))?;
    let id = match (line.id, line.id_hex) {
        (Some(id), None) if !id.is_empty() => id.into_bytes(),
        (Some(_), None) => bail!("id: an id is at least one byte"),
        (None, Some(h)) => match hex::decode(&h) {
            Ok(id) if !id.is_empty() => id,
            Ok(_) => bail!("id_hex: an id is at least one byte"),
            Err(e) => bail!("id_hex: not hex: {e}"),
        },
        (None, None) => bail!("a task needs an id (or id_hex)"),
        (Some(_), Some(_)) => bail!("give id or id_hex, not both"),
    };
    let payload = match (line.payload, line.payload_hex) {
        (Some(_), Some(_)) => bail!("give payload or payload_hex, not both"),
        // (`"payload": null` is no payload: serde reads it as None.)
        (Some(raw), None) => match raw.get() {
            // A JSON string is the payload's text; anything else is kept as the file has it.
            s if s.starts_with('"') => Some(serde_json::from_str::<String>(s)?.into_bytes()),
            s => Some(s.as_bytes().to_vec()),
        },
        (None, Some(h)) => Some(hex::decode(&h).map_err(|e| anyhow!("payload_hex: not hex: {e}"))?),
        (None, None) => None,
    };
    let due_ms = match (line.at, line.at_ms, line.delay, line.delay_ms) {
        (None, None, None, None) => now,
        (Some(AtValue::Ms(ms)), None, None, None) | (None, Some(ms), None, None) => {
            if ms < 0 {
                bail!("at: must not be negative");
            }
            ms
        }
        (Some(AtValue::Text(t)), None, None, None) => parse_at(&t).map_err(|e| anyhow!("at {t:?}: {e}"))?,
        (None, None, Some(d), None) => {
            let d = parse_in(&d).map_err(|e| anyhow!("delay {d:?}: {e}"))?;
            now.saturating_add(i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        }
        (None, None, None, Some(ms)) => now.saturating_add(i64::try_from(ms).unwrap_or(i64::MAX)),
        _ => bail!("give one of at, at_ms, delay and delay_ms, not several"),
    };
    let mode = match line.mode.as_deref() {
        None | Some("upsert") => ScheduleMode::Upsert,
        Some("if-absent") => ScheduleMode::IfAbsent,
        Some("only-later") => ScheduleMode::OnlyLater,
        Some("only-earlier") => ScheduleMode::OnlyEarlier,
        Some(other) => bail!("mode: unknown mode {other:?}: upsert, if-absent, only-later or only-earlier"),
    };
    Ok(NewTask { task_type, id, due_ms, payload, mode })
}

/// Every task of `input` (named `name` in errors), or the first bad line's error (`<name>:<line>: why`).
fn read_tasks(input: impl Read, name: &str, now: i64) -> Result<Vec<NewTask>> {
    let mut tasks = Vec::new();
    let mut reader = BufReader::new(input);
    let mut line = String::new();
    for number in 1.. {
        line.clear();
        if reader.read_line(&mut line).with_context(|| format!("cannot read {name}"))? == 0 {
            break;
        }
        let text = line.trim();
        if text.is_empty() {
            continue;
        }
        tasks.push(parse_line(text, now).with_context(|| format!("{name}:{number}"))?);
    }
    Ok(tasks)
}

/// `hourglass schedule-many`: the whole file checked, then written (`Store::schedule_many`), then `--wait-replicas`.
pub(super) async fn schedule_many(store: &Store, args: ScheduleManyArgs) -> Result<ExitCode> {
    let now = now_ms();
    let (tasks, name) = if args.file == Path::new("-") {
        (read_tasks(std::io::stdin().lock(), "standard input", now)?, "standard input".to_string())
    } else {
        let name = args.file.display().to_string();
        let file = std::fs::File::open(&args.file).with_context(|| format!("cannot open {name}"))?;
        (read_tasks(file, &name, now)?, name)
    };
    let written = store.schedule_many(&tasks).await?;
    let kept = written.iter().filter(|w| !**w).count();
    if kept == 0 {
        println!("scheduled {} tasks from {name}", tasks.len());
    } else {
        println!(
            "scheduled {} of {} tasks from {name}; kept {kept} as they were (their mode kept the due time already there)",
            tasks.len() - kept,
            tasks.len()
        );
    }
    super::tasks::wait_for_replicas(store, args.wait_replicas, args.wait_timeout, "the writes", "them").await
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_700_000_000_000;

    fn one(text: &str) -> NewTask {
        parse_line(text, NOW).unwrap()
    }

    fn refused(text: &str) -> String {
        format!("{:#}", parse_line(text, NOW).unwrap_err())
    }

    #[test]
    fn a_line_names_its_type_id_and_time() {
        let t = one(r#"{"task_type": "order.expire", "id": "o-1", "delay": "15m"}"#);
        assert_eq!(t.task_type.as_str(), "order.expire");
        assert_eq!(t.id, b"o-1");
        assert_eq!(t.due_ms, NOW + 15 * 60 * 1000);
        assert_eq!(t.payload, None);
        assert_eq!(t.mode, ScheduleMode::Upsert);
        assert_eq!(one(r#"{"task_type": "a", "id": "1"}"#).due_ms, NOW, "no time: due now");
        assert_eq!(one(r#"{"task_type": "a", "id": "1", "at": 1700000000123}"#).due_ms, 1_700_000_000_123);
        assert_eq!(one(r#"{"task_type": "a", "id": "1", "at": "2023-11-14T22:13:20Z"}"#).due_ms, NOW);
        assert_eq!(one(r#"{"task_type": "a", "id": "1", "at_ms": 5}"#).due_ms, 5);
        assert_eq!(one(r#"{"task_type": "a", "id": "1", "delay_ms": 250}"#).due_ms, NOW + 250);
        let modes = [("if-absent", ScheduleMode::IfAbsent), ("only-later", ScheduleMode::OnlyLater)];
        for (name, mode) in modes.into_iter().chain([("only-earlier", ScheduleMode::OnlyEarlier)]) {
            assert_eq!(one(&format!(r#"{{"task_type": "a", "id": "1", "mode": "{name}"}}"#)).mode, mode);
        }
    }

    #[test]
    fn payloads_are_written_as_given() {
        let p = |json: &str| one(&format!(r#"{{"task_type": "a", "id": "1", "payload": {json}}}"#)).payload;
        assert_eq!(p(r#""plain text \u00e9""#), Some("plain text é".as_bytes().to_vec()), "a string is its text");
        // Other JSON exactly as the file has it: key order, spacing and number spelling kept.
        assert_eq!(p(r#"{"z": 1, "a": [1.50, true]}"#), Some(br#"{"z": 1, "a": [1.50, true]}"#.to_vec()));
        assert_eq!(p("42"), Some(b"42".to_vec()));
        assert_eq!(p("null"), None);
        let t = one(r#"{"task_type": "a", "id_hex": "00ff", "payload_hex": "0001fe"}"#);
        assert_eq!((t.id, t.payload), (vec![0, 0xff], Some(vec![0, 1, 0xfe])));
    }

    #[test]
    fn a_bad_line_names_what_is_wrong() {
        assert!(refused(r#"{"task_type": "a", "id": "1", "typ": 1}"#).contains("unknown field `typ`"));
        assert!(refused(r#"{"task_type": "Bad Type", "id": "1"}"#).contains("task_type"));
        assert!(refused(r#"{"task_type": "a"}"#).contains("needs an id"));
        assert!(refused(r#"{"task_type": "a", "id": ""}"#).contains("at least one byte"));
        assert!(refused(r#"{"task_type": "a", "id": "1", "id_hex": "01"}"#).contains("not both"));
        assert!(refused(r#"{"task_type": "a", "id_hex": "zz"}"#).contains("id_hex: not hex"));
        assert!(
            refused(r#"{"task_type": "a", "id": "1", "delay": "soon"}"#).contains("delay \"soon\": not a duration")
        );
        assert!(
            refused(r#"{"task_type": "a", "id": "1", "at": "tomorrow"}"#).contains("at \"tomorrow\": not an RFC 3339")
        );
        assert!(refused(r#"{"task_type": "a", "id": "1", "at": -1}"#).contains("negative"));
        assert!(refused(r#"{"task_type": "a", "id": "1", "at_ms": 1, "delay_ms": 1}"#).contains("not several"));
        assert!(refused(r#"{"task_type": "a", "id": "1", "mode": "nx"}"#).contains("unknown mode"));
        assert!(refused(r#"{"task_type": "a", "id": "1", "payload": 1, "payload_hex": ""}"#).contains("not both"));
        assert!(refused("\"text\"").contains("invalid type"));
    }

    #[test]
    fn the_file_is_read_whole_and_a_bad_line_is_named_by_its_number() {
        let file = "{\"task_type\": \"a\", \"id\": \"1\"}\n\n{\"task_type\": \"a\", \"id\": \"2\"}\n";
        assert_eq!(read_tasks(file.as_bytes(), "t.jsonl", NOW).unwrap().len(), 2, "blank lines are skipped");
        let bad = format!("{file}{{\"task_type\": \"a\"}}\n");
        let err = format!("{:#}", read_tasks(bad.as_bytes(), "t.jsonl", NOW).unwrap_err());
        assert!(err.starts_with("t.jsonl:4: "), "{err}");
    }
}
