//! The rule of a recurring task: a cron expression in an IANA time zone, or a fixed interval, with DST-safe next occurrences and catch-up of missed runs.
//!
//! All instants are milliseconds since the Unix epoch (`i64`); cron occurrences fall on whole seconds.
//!
//! # Cron expressions
//!
//! Five fields (`minute hour day-of-month month day-of-week`), or six with a
//! leading `second` field; a seven-field (year) form is refused. Parsing is
//! done by `croner` 4, so its extensions are accepted too: names (`MON`,
//! `JAN`), `L` (last), `W` (nearest weekday), `#` (nth weekday), `?` (same as
//! `*` in the day fields), a `+` prefix on day-of-week to AND it with
//! day-of-month (plain POSIX ORs them), and the nicknames `@yearly`,
//! `@annually`, `@monthly`, `@weekly`, `@daily`, `@hourly`. Steps must be
//! `*/N` or `A-B/N` (`5/15` is refused: write `5-59/15`). An expression
//! that can never fire (`0 0 30 2 *`) is refused.
//!
//! # Daylight saving time
//!
//! Expressions are read on the wall clock of their zone. A *wall-clock job*
//! is one whose second, minute and hour fields contain no `*` and no step
//! (`30 2 * * *`, `0,30 9-17 * * MON-FRI`); every other job is an *interval
//! job* (`0 * * * *`, `*/15 * * * *`, `0 */2 * * *`). As in Vixie cron:
//!
//! - Spring forward (a wall-clock time does not exist): a wall-clock job due
//!   in the gap runs once, at the first instant after the gap (02:30 in
//!   Europe/Paris on 2026-03-29 runs at 03:00 CEST); interval jobs just lose
//!   the times that do not exist (an hourly job runs 23 times that day).
//! - Fall back (a wall-clock hour happens twice): a wall-clock job runs once,
//!   on the first pass (02:30 CEST on 2026-10-25); interval jobs run on both
//!   passes (an hourly job runs 25 times that day, one hour apart).
//!
//! Either way, occurrences are strictly increasing instants: never the same
//! instant twice, never an instant skipped for interval jobs.
//!
//! croner alone applies the wall-clock rules only when the second, minute
//! and hour are each a single value, so `30 2,14 * * *` would run twice on
//! fall-back day and not at all at 02:30 on spring-forward day; this module
//! widens the rule to lists and ranges, as Vixie cron does.
//!
//! # Intervals
//!
//! `Every(d)` has no wall clock and no time zone: its occurrences are
//! `anchor + k*d`, where the anchor is the occurrence before. So
//! `next_after(t)` is `t + d` (callers pass the previous occurrence), and
//! [`catch_up`] walks `due + k*d` from the occurrence that was due.

use std::collections::VecDeque;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use croner::Cron;
use croner::errors::CronError;
use croner::parser::{CronParser, Seconds, Year};
use jiff::Timestamp;
use jiff::civil::DateTime;
use jiff::tz::{AmbiguousOffset, TimeZone};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The most occurrences [`MissedPolicy::All`] hands out in one [`catch_up`]; older ones are dropped.
pub const MAX_CATCH_UP: usize = 1000;

/// How late an occurrence may be and still count as on time, not missed, under [`MissedPolicy::Skip`].
///
/// Without it a host that polls would skip every run, since it always sees
/// an occurrence a little after it was due.
pub const SKIP_GRACE_MS: i64 = 60_000;

/// The shortest interval [`Recurrence::every`] accepts: shorter would flood the queue.
const MIN_INTERVAL: Duration = Duration::from_secs(1);

/// The nicknames croner expands; anything else after `@` gets our own message, not croner's.
const NICKNAMES: [&str; 6] = ["@yearly", "@annually", "@monthly", "@weekly", "@daily", "@hourly"];

/// Field names and ranges, seconds first, for errors that name the culprit field.
const FIELDS: [(&str, &str); 6] = [
    ("second", "0-59"),
    ("minute", "0-59"),
    ("hour", "0-23"),
    ("day-of-month", "1-31"),
    ("month", "1-12 or JAN-DEC"),
    ("day-of-week", "0-7 or SUN-SAT"),
];

/// A validated recurrence: either a cron expression in a time zone, or a fixed interval.
///
/// Build it with [`Recurrence::cron`], [`Recurrence::every`] or
/// [`str::parse`] (the [`Display`](fmt::Display) form). Equality compares
/// the expression text and zone name, or the interval.
#[derive(Clone, Debug)]
pub enum Recurrence {
    /// A cron expression read on the wall clock of an IANA time zone.
    Cron {
        /// The expression as given, with runs of whitespace collapsed to one space.
        expr: String,
        /// The zone's canonical IANA name, e.g. `Europe/Paris` (also for input `europe/paris`).
        tz: String,
        /// The parsed expression and zone; only [`Recurrence::cron`] can make one, so every `Cron` is valid.
        compiled: Box<CompiledCron>,
    },
    /// A fixed interval, anchored to the previous occurrence (see the module docs).
    ///
    /// [`Recurrence::every`] guarantees at least 1s in whole milliseconds; a
    /// value built by hand is truncated to milliseconds and treated as at least 1ms.
    Every(Duration),
}

/// A parsed cron expression with its zone, kept next to the text it came from.
///
/// Opaque on purpose: it can only come from [`Recurrence::cron`].
#[derive(Clone)]
pub struct CompiledCron {
    cron: Cron,
    zone: TimeZone,
    /// Vixie's "fixed time" job (see the module docs): runs once across DST changes.
    wall_clock: bool,
    /// croner applies the same rule itself, so our corrections can be skipped.
    croner_fixed: bool,
}

impl fmt::Debug for CompiledCron {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The text is already in the enclosing variant; a full TimeZone dump is noise.
        f.debug_struct("CompiledCron").field("wall_clock", &self.wall_clock).finish_non_exhaustive()
    }
}

/// Why a schedule was refused; its [`Display`](fmt::Display) is one line naming the culprit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecurrenceError {
    /// The cron expression does not parse, or never fires.
    InvalidCron {
        /// The expression as given.
        expr: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The time zone is not in the IANA database.
    UnknownTimeZone {
        /// The name as given.
        name: String,
    },
    /// The interval does not parse, or is out of range.
    InvalidInterval {
        /// The interval text as given.
        text: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Text given to [`str::parse`] is in neither `every …` nor `cron "…" in …` form.
    Malformed {
        /// The text as given.
        text: String,
    },
}

impl fmt::Display for RecurrenceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InvalidCron { expr, reason } => {
                write!(f, "invalid cron expression {expr:?}: {reason}")
            }
            Self::UnknownTimeZone { name } => write!(f, "unknown time zone {name:?}"),
            Self::InvalidInterval { text, reason } => {
                write!(f, "invalid interval {text:?}: {reason}")
            }
            Self::Malformed { text } => write!(
                f,
                "invalid recurrence {text:?}: expected `every <interval>` or `cron \"<expression>\" in <time zone>`"
            ),
        }
    }
}

impl std::error::Error for RecurrenceError {}

/// What to do with occurrences missed while no host was running.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MissedPolicy {
    /// Run the latest missed occurrence once and skip the rest (the default).
    #[default]
    Latest,
    /// Run every missed occurrence, oldest first, but at most [`MAX_CATCH_UP`] (the latest ones).
    All,
    /// Run none of them: only an occurrence at most [`SKIP_GRACE_MS`] late still runs.
    Skip,
}

/// What [`catch_up`] decided: the occurrences to run now and the one to store as next.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CatchUp {
    /// Occurrence times (ms) to run now, oldest first; each is at or before `now_ms`.
    pub run_now: Vec<i64>,
    /// The next occurrence strictly after `now_ms`, or `None` if the schedule has ended.
    pub next_ms: Option<i64>,
}

fn parser() -> CronParser {
    // Years are refused so that a 7th field is a clear count error, not a silent year filter.
    CronParser::builder().seconds(Seconds::Optional).year(Year::Disallowed).build()
}

impl Recurrence {
    /// Parses a cron expression read in `timezone` (an IANA name, `UTC` when `None`).
    ///
    /// Accepts 5 fields (`minute hour day-of-month month day-of-week`), 6
    /// with a leading `second`, or a nickname such as `@daily`; see the
    /// module docs for the syntax and DST rules.
    pub fn cron(expr: &str, timezone: Option<&str>) -> Result<Recurrence, RecurrenceError> {
        let normalized = expr.split_whitespace().collect::<Vec<_>>().join(" ");
        let invalid = |reason: String| RecurrenceError::InvalidCron { expr: expr.to_string(), reason };
        let fields: Vec<&str> = normalized.split(' ').filter(|s| !s.is_empty()).collect();
        if fields.is_empty() {
            return Err(invalid("empty".into()));
        }
        if normalized.starts_with('@') {
            if !NICKNAMES.iter().any(|n| n.eq_ignore_ascii_case(&normalized)) {
                return Err(invalid(format!("unknown nickname (expected {})", NICKNAMES.join(", "))));
            }
        } else if !(5..=6).contains(&fields.len()) {
            return Err(invalid(format!(
                "expected 5 fields (minute hour day-of-month month day-of-week), or 6 with a leading second; got {}",
                fields.len()
            )));
        }
        let cron = parser().parse(&normalized).map_err(|e| invalid(explain(&fields, &e)))?;

        let name = timezone.unwrap_or("UTC").trim();
        let zone = TimeZone::get(name).map_err(|_| RecurrenceError::UnknownTimeZone { name: name.to_string() })?;
        let tz = zone.iana_name().unwrap_or(name).to_string();

        let pattern = &cron.pattern;
        let wall_clock =
            [&pattern.seconds, &pattern.minutes, &pattern.hours].iter().all(|c| c.step == 1 && !c.from_wildcard);
        let croner_fixed = cron.determine_job_type() == croner::JobType::FixedTime;
        let compiled = CompiledCron { cron, zone, wall_clock, croner_fixed };
        // croner parses `0 0 30 2 *` happily; refuse it here rather than never running.
        if compiled.next_after(0).is_none() {
            return Err(invalid("never matches any date".into()));
        }
        Ok(Recurrence::Cron { expr: normalized, tz, compiled: Box::new(compiled) })
    }

    /// Parses an interval such as `15m`, `1h 30m` or `90s` (humantime syntax); at least 1s, in whole milliseconds.
    pub fn every(text: &str) -> Result<Recurrence, RecurrenceError> {
        let invalid = |reason: &str| RecurrenceError::InvalidInterval { text: text.to_string(), reason: reason.into() };
        let d = humantime::parse_duration(text.trim()).map_err(|e| invalid(&e.to_string()))?;
        if d < MIN_INTERVAL {
            return Err(invalid("must be at least 1s"));
        }
        if d.subsec_nanos() % 1_000_000 != 0 {
            return Err(invalid("must be a whole number of milliseconds"));
        }
        if i64::try_from(d.as_millis()).is_err() {
            return Err(invalid("too large"));
        }
        Ok(Recurrence::Every(d))
    }

    /// The first occurrence strictly after `after_ms` (ms since Unix epoch), or None if there is none.
    ///
    /// For `Every(d)` this is `after_ms + d`: pass the previous occurrence
    /// (the anchor), not the current time, or the schedule drifts. `None`
    /// means the result would overflow, or a cron expression has no later
    /// match (croner searches up to the year 5000).
    pub fn next_after(&self, after_ms: i64) -> Option<i64> {
        match self {
            Recurrence::Cron { compiled, .. } => compiled.next_after(after_ms),
            Recurrence::Every(d) => after_ms.checked_add(step_ms(*d)),
        }
    }
}

/// The interval in ms, at least 1 so that a hand-built `Every(0)` still moves forward.
fn step_ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX).max(1)
}

/// Turns a croner error into a reason that names the field at fault, when one field alone is.
fn explain(fields: &[&str], err: &CronError) -> String {
    if (5..=6).contains(&fields.len()) {
        let names = &FIELDS[6 - fields.len()..];
        // croner's messages do not say which field; parse each one alone to find out.
        for (i, field) in fields.iter().enumerate() {
            let probe: Vec<&str> = (0..fields.len()).map(|j| if j == i { *field } else { "*" }).collect();
            if let Err(e) = parser().parse(&probe.join(" ")) {
                let (name, range) = names[i];
                let mut reason = format!("{name} field {field:?}: {}", describe(&e));
                if reason.ends_with("out of bounds") {
                    reason.push_str(&format!(" (allowed {range})"));
                }
                return reason;
            }
        }
    }
    describe(err)
}

/// croner's message without its prefix, capital and full stop, to fit inside our one line.
fn describe(err: &CronError) -> String {
    let text = match err {
        CronError::EmptyPattern => return "empty".into(),
        // croner reports the upper-cased text here, which would not match the input.
        CronError::IllegalCharacters(_) => return "illegal character".into(),
        CronError::InvalidPattern(m) | CronError::ComponentError(m) => m.clone(),
        other => other.to_string(),
    };
    let text = text.trim_end_matches('.');
    let mut chars = text.chars();
    match chars.next() {
        Some(c) => c.to_lowercase().chain(chars).collect(),
        None => String::new(),
    }
}

impl CompiledCron {
    fn next_after(&self, after_ms: i64) -> Option<i64> {
        // Occurrences are whole seconds, so "after the second containing after_ms" is the same set.
        let mut from = Timestamp::from_second(after_ms.div_euclid(1000)).ok()?;
        loop {
            let found =
                self.cron.find_next_occurrence(&from.to_zoned(self.zone.clone()), false).ok().map(|z| z.timestamp());
            if self.wall_clock && !self.croner_fixed {
                if let Some(gap_run) = self.gap_run(from, found) {
                    return Some(gap_run.as_millisecond());
                }
                if let Some(t) = found
                    && self.is_second_pass(t)
                {
                    // Ran on the first pass of this wall-clock time already.
                    from = t;
                    continue;
                }
            }
            return found.map(|t| t.as_millisecond());
        }
    }

    /// The start of a DST gap in `(from, until]` during which this job was due on the wall clock, if any.
    ///
    /// croner drops such times for jobs it does not call fixed; a wall-clock
    /// job still runs once, right after the gap (as croner does for its own fixed jobs).
    fn gap_run(&self, from: Timestamp, until: Option<Timestamp>) -> Option<Timestamp> {
        let until = until?;
        for transition in self.zone.following(from) {
            let at = transition.timestamp();
            if at > until {
                break;
            }
            let before = self.zone.to_offset(Timestamp::from_second(at.as_second() - 1).ok()?);
            let after = transition.offset();
            if after <= before {
                continue; // a fold or a rename, not a gap
            }
            let (gap_start, gap_end) = (before.to_datetime(at), after.to_datetime(at));
            if let Ok(due) = self.cron.find_next_occurrence::<DateTime>(&gap_start, true)
                && due < gap_end
            {
                return Some(at);
            }
        }
        None
    }

    /// Whether `t` is the second instant of a wall-clock time that happens twice (fall back).
    fn is_second_pass(&self, t: Timestamp) -> bool {
        let civil = self.zone.to_datetime(t);
        match self.zone.to_ambiguous_timestamp(civil).offset() {
            AmbiguousOffset::Fold { after, .. } => self.zone.to_offset(t) == after,
            _ => false,
        }
    }

    /// Up to `want` (≥ 1) latest occurrences in `[due_ms, now_ms]`, oldest first, counting `due_ms` itself.
    ///
    /// Walking forward from `due_ms` could take millions of steps after a
    /// long outage, so croner's backward search finds a starting point a few
    /// occurrences before the `want` latest, and the forward walk (which
    /// applies our DST rules) runs from there. The slack covers the few
    /// occurrences croner yields that our rules drop; if it was not enough,
    /// retry with more.
    fn latest_until(&self, due_ms: i64, now_ms: i64, want: usize) -> Vec<i64> {
        let mut slack = 2usize;
        loop {
            let depth = want.saturating_add(slack);
            let start = self.nth_back(now_ms, depth, due_ms).filter(|&a| a > due_ms);
            let mut runs = VecDeque::with_capacity(want.min(64));
            let mut next = match start {
                Some(anchor) => self.next_after(anchor),
                None => {
                    runs.push_back(due_ms);
                    self.next_after(due_ms)
                }
            };
            while let Some(t) = next
                && t <= now_ms
            {
                if runs.len() == want {
                    runs.pop_front();
                }
                runs.push_back(t);
                next = self.next_after(t);
            }
            if runs.len() >= want || start.is_none() {
                return runs.into();
            }
            slack = slack.saturating_mul(8);
        }
    }

    /// croner's `n`th occurrence at or before `now_ms`, counting back; stops early once at or before `floor_ms`.
    fn nth_back(&self, now_ms: i64, n: usize, floor_ms: i64) -> Option<i64> {
        let mut at = Timestamp::from_second(now_ms.div_euclid(1000)).ok()?.to_zoned(self.zone.clone());
        let mut inclusive = true;
        for _ in 0..n {
            at = self.cron.find_previous_occurrence(&at, inclusive).ok()?;
            inclusive = false;
            if at.timestamp().as_millisecond() <= floor_ms {
                return Some(at.timestamp().as_millisecond());
            }
        }
        Some(at.timestamp().as_millisecond())
    }
}

/// Given the occurrence that was due next (`due_ms`, may be in the past) and `now_ms`, which occurrences to hand out now and which one to store as the next.
///
/// An occurrence at exactly `now_ms` is due, not future. `due_ms` itself
/// counts as an occurrence even if the schedule has changed since. For
/// `Every(d)` the missed ones are `due_ms + k*d` and `next_ms` continues that
/// series; for cron, `next_ms` is `next_after(now_ms)`. Cost is bounded by
/// the number handed out, not by the length of the outage.
pub fn catch_up(rec: &Recurrence, due_ms: i64, now_ms: i64, policy: MissedPolicy) -> CatchUp {
    if due_ms > now_ms {
        return CatchUp { run_now: Vec::new(), next_ms: Some(due_ms) };
    }
    let want = match policy {
        MissedPolicy::All => MAX_CATCH_UP,
        // Skip still needs the latest one, to run it if it is within the grace.
        MissedPolicy::Latest | MissedPolicy::Skip => 1,
    };
    let (mut run_now, next_ms) = match rec {
        Recurrence::Every(d) => {
            let step = i128::from(step_ms(*d));
            let (due, now) = (i128::from(due_ms), i128::from(now_ms));
            let count = (now - due) / step + 1; // occurrences due..=now
            let first = (count - want as i128).max(0);
            // All are ≤ now_ms, so they fit in i64.
            let runs = (first..count).map(|k| (due + k * step) as i64).collect();
            (runs, i64::try_from(due + count * step).ok())
        }
        Recurrence::Cron { compiled, .. } => (compiled.latest_until(due_ms, now_ms, want), compiled.next_after(now_ms)),
    };
    if policy == MissedPolicy::Skip {
        run_now.retain(|&t| now_ms - t <= SKIP_GRACE_MS);
    }
    CatchUp { run_now, next_ms }
}

impl fmt::Display for Recurrence {
    /// `cron "<expr>" in <zone>` or `every <interval>`; [`str::parse`] reads it back.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Recurrence::Cron { expr, tz, .. } => write!(f, "cron \"{expr}\" in {tz}"),
            Recurrence::Every(d) => write!(f, "every {}", humantime::format_duration(*d)),
        }
    }
}

impl FromStr for Recurrence {
    type Err = RecurrenceError;

    /// Reads the [`Display`](fmt::Display) form; ` in <zone>` may be left out for UTC.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let malformed = || RecurrenceError::Malformed { text: s.to_string() };
        let text = s.trim();
        if let Some(interval) = text.strip_prefix("every ") {
            return Recurrence::every(interval);
        }
        let quoted = text.strip_prefix("cron ").ok_or_else(malformed)?.trim_start();
        let inner = quoted.strip_prefix('"').ok_or_else(malformed)?;
        // croner refuses quotes inside an expression, so the next quote closes it.
        let (expr, rest) = inner.split_once('"').ok_or_else(malformed)?;
        let rest = rest.trim();
        let zone = match rest {
            "" => None,
            _ => Some(rest.strip_prefix("in ").ok_or_else(malformed)?),
        };
        Recurrence::cron(expr, zone)
    }
}

impl PartialEq for Recurrence {
    fn eq(&self, other: &Self) -> bool {
        // The compiled form follows from the text, so the text decides.
        match (self, other) {
            (Recurrence::Cron { expr: a, tz: za, .. }, Recurrence::Cron { expr: b, tz: zb, .. }) => a == b && za == zb,
            (Recurrence::Every(a), Recurrence::Every(b)) => a == b,
            _ => false,
        }
    }
}

impl Eq for Recurrence {}

impl Serialize for Recurrence {
    /// As its [`Display`](fmt::Display) text, so stored schedules stay readable.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Recurrence {
    /// From its [`Display`](fmt::Display) text, validating it again.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests;
