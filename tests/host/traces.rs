//! Traces of a real `hourglass run` with `[telemetry] otlp_endpoint`: an
//! OTLP/HTTP receiver in the test decodes what the host exports, and a plain
//! HTTP server sees the `traceparent` of the plugin's outbound request.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::{Host, RedisServer, schedule_now, stat, test_plugin, wait_for};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use redis::Commands;

const LONG: Duration = Duration::from_secs(60);

/// One HTTP/1.1 request as a tiny server read it.
#[derive(Debug, Clone)]
struct Seen {
    path: String,
    headers: HashMap<String, String>,
    body: Vec<u8>,
}

/// A tiny HTTP server on 127.0.0.1 that answers every request 200 with `reply` and keeps what it saw.
struct Server {
    addr: String,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Server {
    fn start(content_type: &'static str) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let kept = seen.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let kept = kept.clone();
                std::thread::spawn(move || serve(stream, &kept, content_type));
            }
        });
        Server { addr, seen }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

/// Reads requests off one connection (keep-alive or not) until it closes.
fn serve(stream: TcpStream, seen: &Mutex<Vec<Seen>>, content_type: &str) {
    stream.set_read_timeout(Some(LONG)).unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut writer = stream;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let path = line.split(' ').nth(1).unwrap_or_default().to_owned();
        let mut headers = HashMap::new();
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_owned());
            }
        }
        let len: usize = headers.get("content-length").and_then(|l| l.parse().ok()).unwrap_or(0);
        let mut body = vec![0; len];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        seen.lock().unwrap().push(Seen { path, headers, body });
        let reply = format!("HTTP/1.1 200 OK\r\ncontent-type: {content_type}\r\ncontent-length: 0\r\n\r\n");
        if writer.write_all(reply.as_bytes()).is_err() {
            return;
        }
    }
}

/// Every span the receiver got so far.
fn spans(collector: &Server) -> Vec<Span> {
    let mut out = Vec::new();
    for request in collector.seen() {
        assert_eq!(request.path, "/v1/traces");
        assert_eq!(request.headers.get("content-type").map(String::as_str), Some("application/x-protobuf"));
        let decoded = ExportTraceServiceRequest::decode(request.body.as_slice()).expect("an OTLP protobuf export");
        for resource in decoded.resource_spans {
            for scope in resource.scope_spans {
                out.extend(scope.spans);
            }
        }
    }
    out
}

/// A span attribute as text.
fn attr(span: &Span, key: &str) -> Option<String> {
    let value = span.attributes.iter().find(|kv| kv.key == key)?.value.as_ref()?.value.as_ref()?;
    Some(match value {
        AnyValue::StringValue(s) => s.clone(),
        AnyValue::IntValue(i) => i.to_string(),
        AnyValue::BoolValue(b) => b.to_string(),
        AnyValue::DoubleValue(d) => d.to_string(),
        other => format!("{other:?}"),
    })
}

fn run_span<'a>(spans: &'a [Span], id: &str) -> Option<&'a Span> {
    spans.iter().find(|s| s.name == "run web" && attr(s, "hourglass.task.id").as_deref() == Some(id))
}

#[test]
fn a_run_exports_its_span_and_its_outbound_call_carries_the_trace() {
    let redis = RedisServer::start();
    let collector = Server::start("application/x-protobuf");
    let target = Server::start("text/plain");
    let host = Host::start(
        &redis,
        &[("web", test_plugin("chaos"))],
        &format!(
            "[types.web]\nmax_attempts = 1\nallowed_outbound_hosts = [\"http://{}\"]\n[telemetry]\notlp_endpoint = \"http://{}\"\n",
            target.addr, collector.addr
        ),
    );
    let mut conn = redis.client();

    // A run that calls out (chaos turns the answer into an error: it dies after its one attempt).
    schedule_now(&mut conn, "web", "call-1", &format!("http-get:http://{}/hello?secret=1", target.addr));
    // A run whose client asked for its trace to be continued.
    let client_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let client_span = "00f067aa0ba902b7";
    let _: () = conn.hset("hourglass:{web}:trace", "quiet-1", format!("00-{client_trace}-{client_span}-01")).unwrap();
    schedule_now(&mut conn, "web", "quiet-1", "ok");

    let all = wait_for("both run spans and the HTTP span at the collector", LONG, || {
        let all = spans(&collector);
        (run_span(&all, "call-1").is_some()
            && run_span(&all, "quiet-1").is_some()
            && all.iter().any(|s| s.name == "GET"))
        .then_some(all)
    });
    assert_eq!((stat(&mut conn, "web", "dead"), stat(&mut conn, "web", "succeeded")), (1, 1));

    // One span per run, with the attributes the issue asks for.
    let call = run_span(&all, "call-1").unwrap();
    assert_eq!(all.iter().filter(|s| s.name == "run web").count(), 2, "{all:#?}");
    assert_eq!(attr(call, "hourglass.task.type").as_deref(), Some("web"));
    assert_eq!(attr(call, "hourglass.task.attempt").as_deref(), Some("1"));
    assert_eq!(attr(call, "hourglass.outcome").as_deref(), Some("dead"));
    assert!(attr(call, "hourglass.lateness_ms").unwrap().parse::<i64>().unwrap() >= 0);
    let hash = hourglass::runtime::short_hash(&std::fs::read(test_plugin("chaos")).unwrap());
    assert_eq!(attr(call, "hourglass.plugin.hash"), Some(hash));
    assert!(call.parent_span_id.is_empty(), "a task without a client traceparent starts a trace");

    // The outbound call: a child span of the run, and the request carried its traceparent.
    let http = all.iter().find(|s| s.name == "GET").unwrap();
    assert_eq!((&http.trace_id, &http.parent_span_id), (&call.trace_id, &call.span_id));
    assert_eq!(attr(http, "http.response.status_code").as_deref(), Some("200"));
    assert_eq!(
        attr(http, "url.full"),
        Some(format!("http://{}/hello", target.addr)),
        "the query stays out of the span"
    );
    let sent = target.seen();
    assert_eq!(sent.len(), 1, "{sent:?}");
    let traceparent = sent[0].headers.get("traceparent").expect("the outbound request carries a traceparent");
    assert_eq!(traceparent, &format!("00-{}-{}-01", hex(&call.trace_id), hex(&http.span_id)));

    // The client's trace is continued: same trace id, the client's span as parent.
    let quiet = run_span(&all, "quiet-1").unwrap();
    assert_eq!(hex(&quiet.trace_id), client_trace);
    assert_eq!(hex(&quiet.parent_span_id), client_span);
    assert_eq!(attr(quiet, "hourglass.outcome").as_deref(), Some("succeeded"));
    drop(host);
}

#[test]
fn without_telemetry_no_traceparent_goes_out() {
    let redis = RedisServer::start();
    let target = Server::start("text/plain");
    let _host = Host::start(
        &redis,
        &[("web", test_plugin("chaos"))],
        &format!("[types.web]\nmax_attempts = 1\nallowed_outbound_hosts = [\"http://{}\"]\n", target.addr),
    );
    let mut conn = redis.client();
    schedule_now(&mut conn, "web", "call-1", &format!("http-get:http://{}/hello", target.addr));
    wait_for("the run", LONG, || (stat(&mut conn, "web", "dead") == 1).then_some(()));
    let sent = target.seen();
    assert_eq!(sent.len(), 1);
    assert!(!sent[0].headers.contains_key("traceparent"), "{:?}", sent[0].headers);
}

#[test]
fn a_bad_endpoint_stops_the_host_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("runner.toml");
    std::fs::write(&config, "[telemetry]\notlp_endpoint = \"collector:4318\"\n").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hourglass"))
        .arg("--config")
        .arg(&config)
        .arg("stats")
        .env_remove("HOURGLASS_REDIS_URL")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("telemetry.otlp_endpoint") && err.contains("collector:4318"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
