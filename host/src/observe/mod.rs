//! Observability: what the host tells operators, as metrics, traces, logs and health.
//!
//! - [`telemetry`]: Prometheus metrics and the recent outcomes the dashboard lists;
//! - [`traces`]: opt-in OpenTelemetry spans of runs and their outbound HTTP calls;
//! - [`logging`]: log output, human-readable or JSON lines;
//! - [`health`]: Redis outages and per-type faults (bad data in one type's keys), which
//!   `/readyz` and the metrics report.
//!
//! The pipeline and the registry call these at the points where something
//! happens; nothing here calls back into them.

pub mod health;
pub mod logging;
pub mod telemetry;
pub mod traces;
