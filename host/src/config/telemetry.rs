//! The `[telemetry]` table: where traces go.

use anyhow::{Result, bail};
use serde::Deserialize;

/// The `[telemetry]` table of `runner.toml`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// OTLP/HTTP collector, `http://collector:4318`: spans go to its `/v1/traces`. Unset: no traces.
    pub otlp_endpoint: Option<String>,
}

impl TelemetryConfig {
    /// Checks the endpoint: an `http` or `https` URL with a host and no query.
    pub fn validate(&self) -> Result<()> {
        match self.otlp_endpoint.as_deref() {
            Some("") => bail!("telemetry.otlp_endpoint is empty: remove it to turn traces off"),
            Some(url) => traces_url(url).map(drop),
            None => Ok(()),
        }
    }
}

/// `<endpoint>/v1/traces`, or why the endpoint is not a collector URL.
pub fn traces_url(endpoint: &str) -> Result<String> {
    let bad =
        |why: &str| anyhow::anyhow!("telemetry.otlp_endpoint = {endpoint:?} {why}, like \"http://collector:4318\"");
    let uri: http::Uri = endpoint.parse().map_err(|_| bad("is not a URL"))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) {
        return Err(bad("must start with http:// or https://"));
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(bad("has no host"));
    }
    if uri.query().is_some() {
        return Err(bad("must not have a query"));
    }
    Ok(format!("{}/v1/traces", endpoint.trim_end_matches('/')))
}
