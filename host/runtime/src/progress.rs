//! Progress a handler reports while it runs (the `progress` import): checked here, then handed to whoever writes it down.

use std::sync::Arc;

use hourglass_task::task::{Lease, Progress};

use crate::trace::RunTrace;

/// Most bytes of a progress report's `detail` (JSON text), mirrored in the WIT docs.
pub const MAX_PROGRESS_DETAIL: usize = 1024;

/// Where a run's progress goes: the host's writer, which keeps the latest
/// report of each run and writes it to Redis a few times a second.
///
/// Called from guest code's host call, on the guest executor: it must not block.
pub trait ReportProgress: Send + Sync + 'static {
    /// The run holding `lease` (its attempt `attempt`) got this far.
    fn report(&self, lease: &Lease, attempt: u32, progress: Progress);
    /// The run holding `lease`, which reported, has returned: a report of it not
    /// written yet need not be (its settle keeps the last one with a retry,
    /// and drops the task's progress with any end).
    fn run_returned(&self, lease: &Lease);
}

/// What a run reports to, beside its result: its trace span (tracing on) and
/// where its progress goes (none: reports are checked, then dropped).
#[derive(Clone, Default)]
pub struct RunHooks {
    /// The run's span; its outbound requests become child spans.
    pub trace: Option<RunTrace>,
    /// Where its progress reports go.
    pub progress: Option<Arc<dyn ReportProgress>>,
}

/// The progress sink of one run, bound to its lease; dropped when the run ends.
pub(crate) struct ProgressTo {
    sink: Arc<dyn ReportProgress>,
    lease: Lease,
    attempt: u32,
    /// Whether the run reported (only then is the sink told it returned).
    reported: bool,
}

impl ProgressTo {
    pub(crate) fn new(sink: Arc<dyn ReportProgress>, lease: Lease, attempt: u32) -> ProgressTo {
        ProgressTo { sink, lease, attempt, reported: false }
    }

    pub(crate) fn report(&mut self, progress: Progress) {
        self.reported = true;
        self.sink.report(&self.lease, self.attempt, progress);
    }
}

impl Drop for ProgressTo {
    fn drop(&mut self) {
        if self.reported {
            self.sink.run_returned(&self.lease);
        }
    }
}

/// A report as the guest made it, checked: a percentage of at most 100, and
/// a detail that is empty or JSON text of at most [`MAX_PROGRESS_DETAIL`] bytes.
pub(crate) fn checked(percent: u8, detail: String) -> Result<Progress, String> {
    if percent > 100 {
        return Err(format!("progress of {percent}% is over 100"));
    }
    if detail.len() > MAX_PROGRESS_DETAIL {
        return Err(format!(
            "progress detail of {} bytes is over the {MAX_PROGRESS_DETAIL} bytes allowed",
            detail.len()
        ));
    }
    if !detail.is_empty()
        && let Err(e) = serde_json::from_str::<serde::de::IgnoredAny>(&detail)
    {
        return Err(format!("progress detail is not JSON: {e}"));
    }
    Ok(Progress { percent, detail })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_is_a_percentage_and_json_detail() {
        assert_eq!(checked(40, r#"{"step":"copy"}"#.into()).unwrap().percent, 40);
        assert_eq!(checked(100, String::new()).unwrap().detail, "");
        assert_eq!(checked(101, String::new()).unwrap_err(), "progress of 101% is over 100");
        assert!(checked(5, "{not json".into()).unwrap_err().starts_with("progress detail is not JSON"));
        let big = format!("\"{}\"", "x".repeat(MAX_PROGRESS_DETAIL));
        assert!(checked(5, big).unwrap_err().contains("is over the 1024 bytes allowed"));
    }
}
