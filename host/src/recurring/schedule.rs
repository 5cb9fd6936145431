//! A `[schedules."name"]` table: the plain data of a recurring task's rule, checked as it is parsed.

use anyhow::{Result, bail};
use serde::Deserialize;

use super::rule::{MissedPolicy, Recurrence};
use crate::task_type::TaskType;

/// A schedule's name: like a task type, `[a-z0-9][a-z0-9._-]{0,63}` (so `@` never appears in it).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(try_from = "String")]
pub struct RecurringName(String);

impl RecurringName {
    /// The name as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for RecurringName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<String> for RecurringName {
    type Error = String;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        // The same rule as task type names; it keeps `@` (the occurrence separator) out.
        s.parse::<TaskType>().map(|_| RecurringName(s.clone())).map_err(|_| {
            format!("invalid schedule name {s:?}: use 1 to 64 of a-z 0-9 . _ - , starting with a letter or digit")
        })
    }
}

impl std::str::FromStr for RecurringName {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        RecurringName::try_from(s.to_owned())
    }
}

/// A `[schedules."name"]` table of `runner.toml`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecurringConfig {
    /// The task type of its occurrences.
    #[serde(rename = "type")]
    pub task_type: TaskType,
    /// A cron expression (5 fields, or 6 with seconds first), read on the wall clock of `timezone`.
    pub cron: Option<String>,
    /// The IANA time zone of `cron` [default: UTC].
    pub timezone: Option<String>,
    /// Or a fixed interval instead of `cron`: `15m`, `1h 30m` (at least 1s).
    pub every: Option<String>,
    /// The payload of every occurrence (text) [default: none].
    pub payload: Option<String>,
    /// After a time with no host running: `latest` (run the latest missed occurrence once), `all`, or `skip`.
    pub missed: Option<MissedPolicy>,
}

impl RecurringConfig {
    /// Its rule: a cron expression in a time zone or an interval; an error names what is wrong.
    pub fn rule(&self) -> Result<Recurrence> {
        Ok(match (&self.cron, &self.every) {
            (Some(expr), None) => Recurrence::cron(expr, self.timezone.as_deref())?,
            (None, Some(interval)) => {
                if self.timezone.is_some() {
                    bail!("timezone goes with cron, not with every");
                }
                Recurrence::every(interval)?
            }
            (Some(_), Some(_)) => bail!("give cron or every, not both"),
            (None, None) => bail!("give cron = \"...\" or every = \"...\""),
        })
    }
}
