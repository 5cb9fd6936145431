//! Traces (opt-in, `[telemetry] otlp_endpoint`): one OpenTelemetry span per run, child spans for its outbound HTTP calls.
//!
//! Off by default, and then it costs one atomic load per claimed batch and
//! nothing in Redis. On, every run gets a span (`run <type>`: task type, id,
//! attempt, outcome, lateness, plugin hash) and every outbound request of the
//! plugin a child span, whose W3C `traceparent` goes out with the request.
//! A client that wants its own trace continued puts a `traceparent` into the
//! optional hash `P:{T}:trace` (id → traceparent); the pipeline reads it with
//! one HMGET per claimed batch, only while tracing is on, and never writes
//! it. This module reads nothing from Redis.
//!
//! Spans go in batches to `<otlp_endpoint>/v1/traces` as OTLP over
//! HTTP/protobuf, sent by the host's own hyper client on its tokio runtime.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result};
use arc_swap::ArcSwapOption;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{Span as _, SpanKind, Status, Tracer as _, TracerProvider as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_http::{HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracer, SdkTracerProvider};

pub use crate::config::TelemetryConfig;
use crate::config::traces_url;
use crate::task::{ClaimedTask, Ended};
pub use hourglass_runtime::trace::RunTrace;

/// How often finished spans are sent to the collector (the SDK's default).
const EXPORT_EVERY: Duration = Duration::from_secs(5);
/// Longest one export may take, connect to last byte.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest collector response read (it is a small protobuf, usually empty).
const MAX_RESPONSE: usize = 64 * 1024;

/// The tracer while tracing is on.
struct Traces {
    tracer: SdkTracer,
}

static TRACES: ArcSwapOption<Traces> = ArcSwapOption::const_empty();

/// Spans being exported; [`Exporting::stop`] sends what is left.
pub struct Exporting {
    provider: SdkTracerProvider,
}

impl Exporting {
    /// Turns tracing off and sends the spans not sent yet (waits up to the export timeout).
    pub async fn stop(self) {
        TRACES.store(None);
        let provider = self.provider;
        // The SDK blocks while it flushes; the export itself runs on this runtime.
        let flushed = tokio::task::spawn_blocking(move || provider.shutdown()).await;
        if let Ok(Err(e)) = flushed {
            tracing::warn!("traces: the last spans were not all sent: {e}");
        }
    }
}

/// Starts exporting when `[telemetry] otlp_endpoint` is set; `None` (and no cost) otherwise.
/// Must run inside the tokio runtime the exports should use.
pub fn start(config: &TelemetryConfig, host_id: &str) -> Result<Option<Exporting>> {
    let Some(endpoint) = &config.otlp_endpoint else {
        return Ok(None);
    };
    let url = traces_url(endpoint)?;
    let client = Client { runtime: tokio::runtime::Handle::current() };
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(url.clone())
        .with_timeout(EXPORT_TIMEOUT)
        .with_http_client(client)
        .build()
        .with_context(|| format!("cannot set up the trace exporter to {url}"))?;
    let processor = BatchSpanProcessor::builder(exporter)
        .with_batch_config(BatchConfigBuilder::default().with_scheduled_delay(EXPORT_EVERY).build())
        .build();
    let resource = opentelemetry_sdk::Resource::builder_empty()
        .with_service_name("hourglass")
        .with_attribute(KeyValue::new("service.instance.id", host_id.to_owned()))
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
        .build();
    let provider = SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_resource(resource)
        // A client's traceparent that says "not sampled" is respected.
        .with_sampler(Sampler::ParentBased(Box::new(Sampler::AlwaysOn)))
        .build();
    let tracer = provider.tracer("hourglass");
    TRACES.store(Some(Arc::new(Traces { tracer })));
    tracing::info!(url = %url, "traces: one span per run, sent to {url}");
    Ok(Some(Exporting { provider }))
}

/// The tracer while tracing is on; see [`tracing`].
#[derive(Clone)]
pub struct Tracing {
    traces: Arc<Traces>,
}

/// The tracer when tracing is on, else `None`: one atomic load, and nothing else is paid.
pub fn tracing() -> Option<Tracing> {
    TRACES.load_full().map(|traces| Tracing { traces })
}

impl Tracing {
    /// Starts the span of one run, as a child of the client's `traceparent`
    /// when it left one (the pipeline reads them, once per claim).
    pub fn start(&self, task: &ClaimedTask, plugin_hash: &str, started_ms: i64, traceparent: Option<&str>) -> RunSpan {
        let parent = traceparent.map_or_else(Context::new, extract);
        let span = self
            .traces
            .tracer
            .span_builder(format!("run {}", task.task_type))
            .with_kind(SpanKind::Consumer)
            .with_attributes([
                KeyValue::new("hourglass.task.type", task.task_type.to_string()),
                KeyValue::new("hourglass.task.id", String::from_utf8_lossy(&task.id).into_owned()),
                KeyValue::new("hourglass.task.attempt", i64::from(task.attempt)),
                KeyValue::new("hourglass.lateness_ms", (started_ms - task.due_ms).max(0)),
                KeyValue::new("hourglass.plugin.hash", plugin_hash.to_owned()),
            ])
            .start_with_context(&self.traces.tracer, &parent);
        RunSpan { span, tracer: self.traces.tracer.clone() }
    }
}

/// The span of one run; ends with [`RunSpan::end`], or when dropped (a run ended by shutdown).
pub struct RunSpan {
    span: opentelemetry_sdk::trace::Span,
    tracer: SdkTracer,
}

impl RunSpan {
    /// What the sandbox needs to trace the run's outbound HTTP requests as children of this span.
    pub fn run_trace(&self) -> RunTrace {
        RunTrace { parent: self.span.span_context().clone(), tracer: self.tracer.clone() }
    }

    /// Ends the span, after the settle, with what it committed: `succeeded`,
    /// `retried`, `dead` (with the error), `cancelled`, `rescheduled` or `fenced`.
    pub fn end(mut self, ended: Ended, error: Option<&str>) {
        self.span.set_attribute(KeyValue::new("hourglass.outcome", ended.as_str()));
        if let (Ended::Retried | Ended::Dead | Ended::Rescheduled, Some(e)) = (ended, error) {
            self.span.set_status(Status::error(e.to_owned()));
        }
        self.span.end();
    }

    /// Ends the span of a run stopped at shutdown (its lease is handed back; it runs again).
    pub fn stopped(mut self) {
        self.span.set_attribute(KeyValue::new("hourglass.outcome", "stopped"));
        self.span.end();
    }
}

/// The context a W3C `traceparent` names (an empty one when it is malformed: a new trace starts).
fn extract(traceparent: &str) -> Context {
    let carrier = HashMap::from([("traceparent".to_owned(), traceparent.trim().to_owned())]);
    TraceContextPropagator::new().extract(&carrier)
}

/// The exporter's HTTP client: hyper (already the host's), one connection per
/// export, run on the host's tokio runtime (the SDK calls it from its own thread).
#[derive(Debug)]
struct Client {
    runtime: tokio::runtime::Handle,
}

#[async_trait::async_trait]
impl HttpClient for Client {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let sent = self.runtime.spawn(async move { tokio::time::timeout(EXPORT_TIMEOUT, post(request)).await });
        match sent.await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(format!("no answer from the collector within {}s", EXPORT_TIMEOUT.as_secs()).into()),
            Err(e) => Err(e.into()),
        }
    }
}

async fn post(request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
    let uri = request.uri().clone();
    let host = uri.host().ok_or("no host in the collector URL")?.to_owned();
    let https = uri.scheme_str() == Some("https");
    let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
    let tcp = tokio::net::TcpStream::connect((host.as_str(), port)).await?;
    let _ = tcp.set_nodelay(true);
    let (mut parts, body) = request.into_parts();
    parts.uri = uri.path_and_query().map_or("/", |p| p.as_str()).parse()?;
    if let Some(authority) = uri.authority() {
        parts.headers.insert(http::header::HOST, authority.as_str().parse()?);
    }
    let request = http::Request::from_parts(parts, Full::new(body));
    let response = if https {
        let name = rustls::pki_types::ServerName::try_from(host.as_str())?.to_owned();
        let tls = crate::outbound::tls_connector().connect(name, tcp).await?;
        exchange(tls, request).await?
    } else {
        exchange(tcp, request).await?
    };
    Ok(response)
}

async fn exchange<S>(stream: S, request: http::Request<Full<Bytes>>) -> Result<Response<Bytes>, HttpError>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let response = sender.send_request(request).await?;
    let (parts, body) = response.into_parts();
    let body = Limited::new(body, MAX_RESPONSE).collect().await?.to_bytes();
    Ok(Response::from_parts(parts, body))
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::TraceContextExt;

    use super::*;

    #[test]
    fn endpoints_are_collector_urls() {
        assert_eq!(traces_url("http://collector:4318").unwrap(), "http://collector:4318/v1/traces");
        assert_eq!(traces_url("https://otel.example/base/").unwrap(), "https://otel.example/base/v1/traces");
        for (bad, why) in [
            ("collector:4318", "http://"),
            ("ftp://x", "http://"),
            ("http://x/?a=1", "query"),
            ("not a url", "not a URL"),
        ] {
            let e = traces_url(bad).unwrap_err().to_string();
            assert!(e.contains(why) && e.contains("telemetry.otlp_endpoint"), "{bad}: {e}");
        }
        assert!(TelemetryConfig { otlp_endpoint: Some(String::new()) }.validate().is_err());
    }

    #[test]
    fn traceparents_are_read_or_ignored() {
        let cx = extract("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
        let sc = cx.span().span_context().clone();
        assert!(sc.is_valid() && sc.is_remote());
        assert_eq!(sc.trace_id().to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert!(!extract("garbage").span().span_context().is_valid());
    }
}
