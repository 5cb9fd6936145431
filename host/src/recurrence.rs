//! Recurring schedules: a cron expression in an IANA time zone, or a fixed interval, with DST-safe next occurrences and catch-up of missed runs.
//!
//! Long: one concept, its cron and interval arithmetic with the DST and missed-run rules (500 lines), and their tests (500).
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
mod tests {
    use super::*;
    use jiff::civil::Date;

    fn ms(rfc3339: &str) -> i64 {
        rfc3339.parse::<Timestamp>().unwrap().as_millisecond()
    }

    fn cron(expr: &str, tz: &str) -> Recurrence {
        Recurrence::cron(expr, Some(tz)).unwrap()
    }

    /// Local rendering, to assert on the wall clock and the offset together.
    fn local(t: i64, tz: &str) -> String {
        Timestamp::from_millisecond(t).unwrap().to_zoned(TimeZone::get(tz).unwrap()).strftime("%F %T%:z").to_string()
    }

    /// Occurrences in `(from, to]`.
    fn between(rec: &Recurrence, from: i64, to: i64) -> Vec<i64> {
        let mut out = Vec::new();
        let mut t = from;
        while let Some(n) = rec.next_after(t)
            && n <= to
        {
            out.push(n);
            t = n;
        }
        out
    }

    /// Occurrences on one local calendar day, rendered locally.
    fn on_day(rec: &Recurrence, tz: &str, day: &str) -> Vec<String> {
        let zone = TimeZone::get(tz).unwrap();
        let date: Date = day.parse().unwrap();
        let start = date.to_zoned(zone.clone()).unwrap().timestamp().as_millisecond();
        let end = date.tomorrow().unwrap().to_zoned(zone).unwrap().timestamp().as_millisecond();
        between(rec, start - 1, end - 1).into_iter().map(|t| local(t, tz)).collect()
    }

    fn assert_steps(times: &[i64], step_ms: i64) {
        for w in times.windows(2) {
            assert_eq!(w[1] - w[0], step_ms, "{} -> {}", w[0], w[1]);
        }
    }

    #[test]
    fn parses_good_expressions() {
        for expr in [
            "0 7 * * *",
            "*/15 * * * *",
            "0 9-17 * * MON-FRI",
            "30 2 1,15 jan,jul *",
            "0 0 L * *",
            "0 12 * * 5#2",
            "0 0 1 * +MON",
            "0 0 ? * 7",
            "*/10 * * * * *",
            "@daily",
            "@HOURLY",
        ] {
            let rec = Recurrence::cron(expr, None).unwrap_or_else(|e| panic!("{expr}: {e}"));
            assert!(matches!(&rec, Recurrence::Cron { tz, .. } if tz == "UTC"), "{rec:?}");
        }
        let rec = Recurrence::cron("  0   7 * *\t* ", Some("europe/paris")).unwrap();
        assert_eq!(rec.to_string(), r#"cron "0 7 * * *" in Europe/Paris"#);
        assert_eq!(Recurrence::every("1h 30m").unwrap(), Recurrence::Every(Duration::from_secs(5400)));
        assert_eq!(Recurrence::every("1s").unwrap(), Recurrence::Every(Duration::from_secs(1)));
        assert_eq!(Recurrence::every("1500ms").unwrap(), Recurrence::Every(Duration::from_millis(1500)));
    }

    #[test]
    fn bad_input_gets_one_clear_line() {
        let err = |r: Result<Recurrence, RecurrenceError>| r.unwrap_err().to_string();
        assert_eq!(
            err(Recurrence::cron("0 7 * *", None)),
            r#"invalid cron expression "0 7 * *": expected 5 fields (minute hour day-of-month month day-of-week), or 6 with a leading second; got 4"#
        );
        assert_eq!(
            err(Recurrence::cron("0 0 1 1 * * 2030", None)),
            r#"invalid cron expression "0 0 1 1 * * 2030": expected 5 fields (minute hour day-of-month month day-of-week), or 6 with a leading second; got 7"#
        );
        assert_eq!(
            err(Recurrence::cron("61 * * * *", None)),
            r#"invalid cron expression "61 * * * *": minute field "61": number out of bounds (allowed 0-59)"#
        );
        assert_eq!(
            err(Recurrence::cron("0 24 * * *", None)),
            r#"invalid cron expression "0 24 * * *": hour field "24": number out of bounds (allowed 0-23)"#
        );
        assert_eq!(
            err(Recurrence::cron("0 0 * * 8", None)),
            r#"invalid cron expression "0 0 * * 8": day-of-week field "8": number out of bounds (allowed 0-7 or SUN-SAT)"#
        );
        assert_eq!(
            err(Recurrence::cron("70 0 0 * * *", None)),
            r#"invalid cron expression "70 0 0 * * *": second field "70": number out of bounds (allowed 0-59)"#
        );
        assert_eq!(
            err(Recurrence::cron("0 0 * foo *", None)),
            r#"invalid cron expression "0 0 * foo *": month field "foo": illegal character"#
        );
        assert_eq!(
            err(Recurrence::cron("*/0 * * * *", None)),
            r#"invalid cron expression "*/0 * * * *": minute field "*/0": step cannot be zero"#
        );
        assert!(
            err(Recurrence::cron("5/15 * * * *", None))
                .starts_with(r#"invalid cron expression "5/15 * * * *": minute field "5/15": invalid step syntax"#)
        );
        assert_eq!(err(Recurrence::cron("  ", None)), r#"invalid cron expression "  ": empty"#);
        assert_eq!(
            err(Recurrence::cron("@reboot", None)),
            r#"invalid cron expression "@reboot": unknown nickname (expected @yearly, @annually, @monthly, @weekly, @daily, @hourly)"#
        );
        assert_eq!(
            err(Recurrence::cron("0 0 30 2 *", None)),
            r#"invalid cron expression "0 0 30 2 *": never matches any date"#
        );
        assert_eq!(err(Recurrence::cron("0 7 * * *", Some("Europe/Pariss"))), r#"unknown time zone "Europe/Pariss""#);
        assert_eq!(err(Recurrence::cron("0 7 * * *", Some(""))), r#"unknown time zone """#);
        assert_eq!(err(Recurrence::every("0s")), r#"invalid interval "0s": must be at least 1s"#);
        assert_eq!(err(Recurrence::every("999ms")), r#"invalid interval "999ms": must be at least 1s"#);
        assert_eq!(
            err(Recurrence::every("1s 500us")),
            r#"invalid interval "1s 500us": must be a whole number of milliseconds"#
        );
        assert!(err(Recurrence::every("soon")).starts_with(r#"invalid interval "soon": "#));
        assert!(err(Recurrence::every("")).starts_with(r#"invalid interval "": "#));
        assert_eq!(
            err("hourly".parse::<Recurrence>()),
            r#"invalid recurrence "hourly": expected `every <interval>` or `cron "<expression>" in <time zone>`"#
        );
        for e in [
            Recurrence::cron("61 * * * *", None).unwrap_err(),
            Recurrence::every("0s").unwrap_err(),
            Recurrence::cron("* * * * *", Some("Mars/Olympus")).unwrap_err(),
        ] {
            assert!(!e.to_string().contains('\n'));
        }
    }

    #[test]
    fn display_round_trips() {
        let cases = [
            (cron("0 7 * * *", "Europe/Paris"), r#"cron "0 7 * * *" in Europe/Paris"#),
            (Recurrence::cron("@daily", None).unwrap(), r#"cron "@daily" in UTC"#),
            (
                cron("*/10 * 9-17 * * MON-FRI", "America/New_York"),
                r#"cron "*/10 * 9-17 * * MON-FRI" in America/New_York"#,
            ),
            (Recurrence::every("15m").unwrap(), "every 15m"),
            (Recurrence::every("1h30m").unwrap(), "every 1h 30m"),
            (Recurrence::every("1day 1s 5ms").unwrap(), "every 1day 1s 5ms"),
            (Recurrence::every("1month").unwrap(), "every 1month"),
        ];
        for (rec, text) in cases {
            assert_eq!(rec.to_string(), text);
            assert_eq!(text.parse::<Recurrence>().unwrap(), rec, "{text}");
        }
        assert_eq!(r#"cron "0 7 * * *""#.parse::<Recurrence>().unwrap(), cron("0 7 * * *", "UTC"));
        assert_ne!(cron("0 7 * * *", "UTC"), cron("0 7 * * *", "Europe/Paris"));
        assert!(matches!(r#"cron "0 7 * * *" at UTC"#.parse::<Recurrence>(), Err(RecurrenceError::Malformed { .. })));

        // serde goes through the same text.
        use serde::de::IntoDeserializer;
        use serde::de::value::{Error, StrDeserializer};
        let de: StrDeserializer<'_, Error> = "every 1h 30m".into_deserializer();
        assert_eq!(Recurrence::deserialize(de).unwrap(), Recurrence::Every(Duration::from_secs(5400)));
        let de: StrDeserializer<'_, Error> = "every 0s".into_deserializer();
        assert_eq!(
            Recurrence::deserialize(de).unwrap_err().to_string(),
            r#"invalid interval "0s": must be at least 1s"#
        );
        let de: StrDeserializer<'_, Error> = "skip".into_deserializer();
        assert_eq!(MissedPolicy::deserialize(de).unwrap(), MissedPolicy::Skip);
        assert_eq!(MissedPolicy::default(), MissedPolicy::Latest);
    }

    #[test]
    fn next_after_utc_cron() {
        let rec = cron("0 7 * * *", "UTC");
        assert_eq!(rec.next_after(ms("2026-01-01T06:59:59.999Z")), Some(ms("2026-01-01T07:00:00Z")));
        // Strictly after: an occurrence at exactly `after` is not returned again.
        assert_eq!(rec.next_after(ms("2026-01-01T07:00:00Z")), Some(ms("2026-01-02T07:00:00Z")));
        assert_eq!(rec.next_after(ms("2026-01-01T07:00:00.001Z")), Some(ms("2026-01-02T07:00:00Z")));
        let weekdays = cron("0 9 * * MON-FRI", "UTC");
        // 2026-01-02 is a Friday.
        assert_eq!(weekdays.next_after(ms("2026-01-02T09:00:00Z")), Some(ms("2026-01-05T09:00:00Z")));
        let secs = cron("*/10 * * * * *", "UTC");
        assert_eq!(secs.next_after(ms("2026-01-01T00:00:05.500Z")), Some(ms("2026-01-01T00:00:10Z")));
        // Before the epoch too.
        assert_eq!(cron("0 0 * * *", "UTC").next_after(-1), Some(0));
        // POSIX: day-of-month OR day-of-week when both are restricted; `+` makes it AND.
        assert_eq!(
            cron("0 0 13 * FRI", "UTC").next_after(ms("2026-01-01T00:00:00Z")),
            Some(ms("2026-01-02T00:00:00Z"))
        );
        assert_eq!(
            cron("0 0 13 * +FRI", "UTC").next_after(ms("2026-01-01T00:00:00Z")),
            Some(ms("2026-02-13T00:00:00Z"))
        );
    }

    #[test]
    fn next_after_every_is_anchored_to_the_previous_occurrence() {
        let rec = Recurrence::every("1h 30m").unwrap();
        let t = ms("2026-03-29T00:15:00.250Z");
        assert_eq!(rec.next_after(t), Some(t + 5_400_000));
        // No wall clock: the Paris DST change does not matter.
        let runs = between(&rec, t, t + 10 * 5_400_000);
        assert_eq!(runs.len(), 10);
        assert_steps(&runs, 5_400_000);
        assert_eq!(rec.next_after(i64::MAX - 1), None);
        assert_eq!(Recurrence::Every(Duration::ZERO).next_after(5), Some(6));
    }

    #[test]
    fn daily_job_in_spring_forward_gap_runs_once_right_after_the_gap() {
        let rec = cron("30 2 * * *", "Europe/Paris");
        assert_eq!(on_day(&rec, "Europe/Paris", "2026-03-28"), ["2026-03-28 02:30:00+01:00"]);
        assert_eq!(on_day(&rec, "Europe/Paris", "2026-03-29"), ["2026-03-29 03:00:00+02:00"]);
        assert_eq!(on_day(&rec, "Europe/Paris", "2026-03-30"), ["2026-03-30 02:30:00+02:00"]);
        let rec = cron("30 2 * * *", "America/New_York");
        assert_eq!(on_day(&rec, "America/New_York", "2026-03-08"), ["2026-03-08 03:00:00-04:00"]);
    }

    #[test]
    fn daily_job_in_fall_back_fold_runs_once_on_the_first_pass() {
        let rec = cron("30 2 * * *", "Europe/Paris");
        assert_eq!(on_day(&rec, "Europe/Paris", "2026-10-25"), ["2026-10-25 02:30:00+02:00"]);
        // Asked from inside the second pass, it does not run again that day.
        assert_eq!(rec.next_after(ms("2026-10-25T01:10:00Z")), Some(ms("2026-10-26T01:30:00Z")));
        // New York repeats 01:00-02:00.
        let rec = cron("30 1 * * *", "America/New_York");
        assert_eq!(on_day(&rec, "America/New_York", "2026-11-01"), ["2026-11-01 01:30:00-04:00"]);
    }

    #[test]
    fn lists_and_ranges_follow_the_wall_clock_rules_too() {
        // croner alone would run 02:30 twice on fall-back day and skip it on spring-forward day.
        let rec = cron("30 2,14 * * *", "Europe/Paris");
        assert_eq!(
            on_day(&rec, "Europe/Paris", "2026-03-29"),
            ["2026-03-29 03:00:00+02:00", "2026-03-29 14:30:00+02:00"]
        );
        assert_eq!(
            on_day(&rec, "Europe/Paris", "2026-10-25"),
            ["2026-10-25 02:30:00+02:00", "2026-10-25 14:30:00+01:00"]
        );
        let rec = cron("0,30 2 * * *", "Europe/Paris");
        assert_eq!(on_day(&rec, "Europe/Paris", "2026-03-29"), ["2026-03-29 03:00:00+02:00"]);
        assert_eq!(
            on_day(&rec, "Europe/Paris", "2026-10-25"),
            ["2026-10-25 02:00:00+02:00", "2026-10-25 02:30:00+02:00"]
        );
        // A job due both in the gap and right after it still runs once there.
        let rec = cron("0 1-3 * * *", "Europe/Paris");
        assert_eq!(
            on_day(&rec, "Europe/Paris", "2026-03-29"),
            ["2026-03-29 01:00:00+01:00", "2026-03-29 03:00:00+02:00"]
        );
        assert_eq!(
            on_day(&rec, "Europe/Paris", "2026-10-25"),
            ["2026-10-25 01:00:00+02:00", "2026-10-25 02:00:00+02:00", "2026-10-25 03:00:00+01:00"]
        );
    }

    #[test]
    fn hourly_job_runs_every_real_hour_across_dst() {
        for (tz, spring, fall) in
            [("Europe/Paris", "2026-03-29", "2026-10-25"), ("America/New_York", "2026-03-08", "2026-11-01")]
        {
            let rec = cron("0 * * * *", tz);
            let zone = TimeZone::get(tz).unwrap();
            for (day, expected) in [(spring, 23), (fall, 25)] {
                let runs = on_day(&rec, tz, day);
                assert_eq!(runs.len(), expected, "{tz} {day}: {runs:?}");
                let date: Date = day.parse().unwrap();
                let start = date.to_zoned(zone.clone()).unwrap().timestamp().as_millisecond();
                let instants = between(&rec, start - 1, start + (expected as i64 - 1) * 3_600_000);
                assert_eq!(instants.len(), expected);
                assert_steps(&instants, 3_600_000); // no duplicate, no skipped instant
            }
        }
        let rec = cron("0 * * * *", "Europe/Paris");
        let fall = on_day(&rec, "Europe/Paris", "2026-10-25");
        assert_eq!(fall[2..4], ["2026-10-25 02:00:00+02:00", "2026-10-25 02:00:00+01:00"]);
    }

    #[test]
    fn quarter_hourly_job_is_strictly_increasing_across_dst() {
        let rec = cron("*/15 * * * *", "Europe/Paris");
        for (day, expected) in [("2026-03-29", 92), ("2026-10-25", 100)] {
            assert_eq!(on_day(&rec, "Europe/Paris", day).len(), expected, "{day}");
        }
        let runs = between(&rec, ms("2026-03-28T22:00:00Z"), ms("2026-03-29T04:00:00Z"));
        assert_steps(&runs, 900_000);
        let runs = between(&rec, ms("2026-10-24T22:00:00Z"), ms("2026-10-25T04:00:00Z"));
        assert_steps(&runs, 900_000);
        assert_eq!(runs.len(), 24);
    }

    #[test]
    fn a_year_of_a_daily_job_is_one_run_per_day() {
        for tz in ["Europe/Paris", "America/New_York", "UTC"] {
            let rec = cron("30 2 * * *", tz);
            let zone = TimeZone::get(tz).unwrap();
            let start = Date::new(2026, 1, 1).unwrap().to_zoned(zone.clone()).unwrap().timestamp().as_millisecond();
            let end = Date::new(2027, 1, 1).unwrap().to_zoned(zone.clone()).unwrap().timestamp().as_millisecond();
            let runs = between(&rec, start, end);
            assert_eq!(runs.len(), 365, "{tz}");
            let mut days: Vec<Date> =
                runs.iter().map(|&t| zone.to_datetime(Timestamp::from_millisecond(t).unwrap()).date()).collect();
            days.dedup();
            assert_eq!(days.len(), 365, "{tz}: one per local date");
        }
    }

    #[test]
    fn catch_up_latest_runs_the_latest_missed_once() {
        let rec = cron("0 * * * *", "UTC");
        let due = ms("2026-05-01T00:00:00Z");
        let now = ms("2026-05-01T09:30:00Z"); // 00:00..=09:00 missed: 10
        let out = catch_up(&rec, due, now, MissedPolicy::Latest);
        assert_eq!(
            out,
            CatchUp { run_now: vec![ms("2026-05-01T09:00:00Z")], next_ms: Some(ms("2026-05-01T10:00:00Z")) }
        );

        let every = Recurrence::every("1h").unwrap();
        let due = ms("2026-05-01T00:00:07Z");
        let out = catch_up(&every, due, due + 9 * 3_600_000 + 1_800_000, MissedPolicy::Latest);
        assert_eq!(out, CatchUp { run_now: vec![due + 9 * 3_600_000], next_ms: Some(due + 10 * 3_600_000) });
    }

    #[test]
    fn catch_up_all_is_capped_to_the_latest() {
        let every = Recurrence::every("1s").unwrap();
        let out = catch_up(&every, 0, 5_000_500, MissedPolicy::All); // 5001 missed
        assert_eq!(out.run_now.len(), MAX_CATCH_UP);
        assert_eq!(out.run_now.first(), Some(&4_001_000));
        assert_eq!(out.run_now.last(), Some(&5_000_000));
        assert_steps(&out.run_now, 1000);
        assert_eq!(out.next_ms, Some(5_001_000));

        let secs = cron("* * * * * *", "UTC");
        let out = catch_up(&secs, 0, 5_000_500, MissedPolicy::All);
        assert_eq!(
            (out.run_now.len(), out.run_now[0], out.run_now[999], out.next_ms),
            (1000, 4_001_000, 5_000_000, Some(5_001_000))
        );

        // A year-long outage of a per-minute job costs ~1000 steps, not 500k.
        let minutely = cron("* * * * *", "Europe/Paris");
        let (due, now) = (ms("2025-06-01T00:00:00Z"), ms("2026-06-01T00:00:30Z"));
        let out = catch_up(&minutely, due, now, MissedPolicy::All);
        assert_eq!(out.run_now.len(), MAX_CATCH_UP);
        assert_eq!(out.run_now.last(), Some(&ms("2026-06-01T00:00:00Z")));
        assert_steps(&out.run_now, 60_000);

        let out = catch_up(&rec3(), ms("2026-05-01T00:00:00Z"), ms("2026-05-01T02:00:00Z"), MissedPolicy::All);
        assert_eq!(out.run_now, [ms("2026-05-01T00:00:00Z"), ms("2026-05-01T01:00:00Z"), ms("2026-05-01T02:00:00Z")]);
        assert_eq!(out.next_ms, Some(ms("2026-05-01T03:00:00Z")));
    }

    fn rec3() -> Recurrence {
        cron("0 * * * *", "UTC")
    }

    #[test]
    fn catch_up_skip_runs_only_an_occurrence_within_the_grace() {
        let due = ms("2026-05-01T00:00:00Z");
        let out = catch_up(&rec3(), due, ms("2026-05-01T09:30:00Z"), MissedPolicy::Skip);
        assert_eq!(out, CatchUp { run_now: vec![], next_ms: Some(ms("2026-05-01T10:00:00Z")) });
        // A poll 5s late is on time, not missed.
        let out = catch_up(&rec3(), due, due + 5_000, MissedPolicy::Skip);
        assert_eq!(out, CatchUp { run_now: vec![due], next_ms: Some(ms("2026-05-01T01:00:00Z")) });
        let every = Recurrence::every("10m").unwrap();
        let out = catch_up(&every, due, due + 35 * 60_000, MissedPolicy::Skip);
        assert_eq!(out, CatchUp { run_now: vec![], next_ms: Some(due + 40 * 60_000) });
    }

    #[test]
    fn catch_up_with_nothing_missed_or_due_exactly_now() {
        let due = ms("2026-05-01T10:00:00Z");
        for policy in [MissedPolicy::Latest, MissedPolicy::All, MissedPolicy::Skip] {
            for rec in [rec3(), Recurrence::every("1h").unwrap()] {
                let out = catch_up(&rec, due, due - 1, policy);
                assert_eq!(out, CatchUp { run_now: vec![], next_ms: Some(due) }, "{rec} {policy:?}");
                let out = catch_up(&rec, due, due, policy);
                assert_eq!(out, CatchUp { run_now: vec![due], next_ms: Some(due + 3_600_000) }, "{rec} {policy:?}");
            }
        }
    }

    #[test]
    fn catch_up_across_fall_back_keeps_the_wall_clock_rules() {
        let (due, now) = (ms("2026-10-24T00:30:00Z"), ms("2026-10-26T12:00:00Z"));
        for expr in ["30 2 * * *", "30 2,14 * * *"] {
            let rec = cron(expr, "Europe/Paris");
            let all = catch_up(&rec, due, now, MissedPolicy::All);
            assert_eq!(all.run_now, between(&rec, due - 1, now), "{expr}");
            assert!(!all.run_now.contains(&ms("2026-10-25T01:30:00Z")), "{expr}: no second 02:30");
        }
        // The latest missed one is found even when croner's latest is the dropped second pass.
        let rec = cron("30 2,14 * * *", "Europe/Paris");
        let out = catch_up(&rec, due, ms("2026-10-25T01:45:00Z"), MissedPolicy::Latest);
        assert_eq!(out.run_now, [ms("2026-10-25T00:30:00Z")]);
        assert_eq!(out.next_ms, Some(ms("2026-10-25T13:30:00Z")));
        let rec = cron("0-59 0-59 2 * * *", "Europe/Paris");
        let out = catch_up(&rec, due, ms("2026-10-25T01:45:00Z"), MissedPolicy::Latest);
        assert_eq!(out.run_now, [ms("2026-10-25T00:59:59Z")]);
    }

    const EXPRS: [&str; 10] = [
        "*/15 * * * *",
        "0 * * * *",
        "30 2 * * *",
        "30 2,14 * * *",
        "0,30 1-3 * * *",
        "*/7 */3 * * *",
        "0 0 * * MON",
        "*/20 * * * * *",
        "15 2 L * *",
        "0 0-23/5 * * *",
    ];
    const ZONES: [&str; 6] =
        ["UTC", "Europe/Paris", "America/New_York", "Australia/Lord_Howe", "America/Santiago", "Asia/Kolkata"];

    #[test]
    fn property_next_after_is_strictly_increasing() {
        let start = ms("2026-02-20T00:00:00Z");
        for expr in EXPRS {
            for tz in ZONES {
                let rec = cron(expr, tz);
                let Recurrence::Cron { compiled, .. } = &rec else { unreachable!() };
                let zone = TimeZone::get(tz).unwrap();
                let mut t = start;
                let mut wall = zone.to_datetime(Timestamp::from_millisecond(t).unwrap());
                for i in 0..2000 {
                    let n = rec.next_after(t).unwrap_or_else(|| panic!("{expr} {tz}: ended at {i}"));
                    assert!(n > t, "{expr} in {tz}: {n} after {t}");
                    if compiled.wall_clock {
                        // A wall-clock job never repeats a wall-clock time.
                        let w = zone.to_datetime(Timestamp::from_millisecond(n).unwrap());
                        assert!(w > wall, "{expr} in {tz}: {w} after {wall}");
                        wall = w;
                    }
                    t = n;
                }
            }
        }
    }

    #[test]
    fn property_catch_up_all_matches_stepping_forward() {
        // Windows around the 2026 transitions, in both hemispheres.
        let windows = [
            ("2026-03-28T12:00:00Z", "2026-03-29T12:00:00Z"),
            ("2026-10-24T12:00:00Z", "2026-10-25T12:00:00Z"),
            ("2026-04-04T00:00:00Z", "2026-04-06T00:00:00Z"),
            ("2026-09-05T00:00:00Z", "2026-09-07T00:00:00Z"),
            ("2026-03-07T12:00:00Z", "2026-03-08T12:00:00Z"),
            ("2026-10-31T12:00:00Z", "2026-11-01T12:00:00Z"),
        ];
        for expr in EXPRS {
            for tz in ZONES {
                let rec = cron(expr, tz);
                for (from, to) in windows {
                    let (from, to) = (ms(from), ms(to));
                    let Some(due) = rec.next_after(from) else {
                        continue;
                    };
                    let mut expected = vec![due];
                    expected.extend(between(&rec, due, to));
                    if expected.last() > Some(&to) {
                        continue;
                    }
                    let keep = expected.len().saturating_sub(MAX_CATCH_UP);
                    let out = catch_up(&rec, due, to, MissedPolicy::All);
                    assert_eq!(out.run_now, expected[keep..], "{expr} in {tz}");
                    assert_eq!(out.next_ms, rec.next_after(to), "{expr} in {tz}");
                    let latest = catch_up(&rec, due, to, MissedPolicy::Latest);
                    assert_eq!(latest.run_now, expected[expected.len() - 1..], "{expr} in {tz}");
                }
            }
        }
    }
}
