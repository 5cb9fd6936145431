//! The client span of a traced run's outbound HTTP request, and the `traceparent` it carries out.
//!
//! The host decides whether a run is traced and hands the run's span
//! context and its tracer in a [`RunTrace`]; nothing here reads Redis or a
//! global: an untraced run carries `None` and costs nothing.

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{Span as _, SpanContext, SpanKind, Status, TraceContextExt, Tracer as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracer;

/// A traced run: its span's context (the parent of its outbound requests' spans) and the tracer that makes them.
#[derive(Debug, Clone)]
pub struct RunTrace {
    /// The run's span.
    pub parent: SpanContext,
    /// The host's tracer (cheap to clone).
    pub tracer: SdkTracer,
}

/// The span of one outbound HTTP request of a run; ends when dropped.
pub struct HttpSpan {
    span: opentelemetry_sdk::trace::Span,
}

/// Starts the client span of one outbound request under the run's span and
/// writes its `traceparent` into the request's headers (replacing the guest's, if any).
pub fn http_request(run: &RunTrace, request: &mut http::Request<impl Sized>) -> HttpSpan {
    let uri = request.uri();
    let mut attributes = vec![
        KeyValue::new("http.request.method", request.method().as_str().to_owned()),
        KeyValue::new("server.address", uri.host().unwrap_or_default().to_owned()),
        // No query: it may carry secrets.
        KeyValue::new(
            "url.full",
            format!(
                "{}://{}{}",
                uri.scheme_str().unwrap_or("http"),
                uri.authority().map_or("", |a| a.as_str()),
                uri.path()
            ),
        ),
    ];
    if let Some(port) = uri.port_u16() {
        attributes.push(KeyValue::new("server.port", i64::from(port)));
    }
    let cx = Context::new().with_remote_span_context(run.parent.clone());
    let span = run
        .tracer
        .span_builder(request.method().as_str().to_owned())
        .with_kind(SpanKind::Client)
        .with_attributes(attributes)
        .start_with_context(&run.tracer, &cx);
    let cx = Context::new().with_remote_span_context(span.span_context().clone());
    TraceContextPropagator::new().inject_context(&cx, &mut opentelemetry_http::HeaderInjector(request.headers_mut()));
    HttpSpan { span }
}

impl HttpSpan {
    /// Records the response status (4xx and 5xx mark the span as an error).
    pub fn status(&mut self, status: u16) {
        self.span.set_attribute(KeyValue::new("http.response.status_code", i64::from(status)));
        if status >= 400 {
            self.span.set_status(Status::error(format!("HTTP {status}")));
        }
    }

    /// Records why the request failed.
    pub fn failed(&mut self, error: &dyn std::fmt::Display) {
        self.span.set_status(Status::error(error.to_string()));
    }
}
