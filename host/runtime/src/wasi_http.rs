//! Outbound HTTP for plugins (`wasi:http/outgoing-handler`), closed by default.
//!
//! Every request a guest sends goes through [`OutboundHooks::send_request`]:
//!
//! 1. the target (`scheme://host:port`) must match the type's
//!    `allowed_outbound_hosts`, or the guest gets `HTTP-request-denied` and
//!    the host logs a warning naming plugin, task and target — before any
//!    DNS lookup or connection;
//! 2. the name is resolved here and, when only a `*` entry allowed it, every
//!    address must be public (no loopback, private or link-local), so a
//!    public name pointing at 127.0.0.1 is refused too; the connection goes
//!    to the address that was checked;
//! 3. a per-type semaphore bounds the requests in flight (`http_concurrency`);
//! 4. the whole request — waiting for a slot, connect, TLS, first byte and
//!    every body byte — must finish within `http_timeout` and the run's own
//!    deadline, whichever comes first;
//! 5. the response body is cut off with an error past `http_max_response`.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};
use wasmtime_wasi_http::io::TokioIo;
use wasmtime_wasi_http::{Error, RequestOptions, WasiBody, WasiHttpHooks};

use super::run::{HostBudget, RunMeta};
use crate::outbound::{Allowed, AllowedHosts, Target, not_public};
use crate::policy::SandboxPolicy;

/// Outbound HTTP settings of one task type, shared by all its runs.
#[derive(Debug)]
pub(crate) struct HttpPolicy {
    allowed: AllowedHosts,
    timeout: Duration,
    max_response: u64,
    slots: Arc<Semaphore>,
    concurrency: usize,
}

impl HttpPolicy {
    pub(crate) fn new(policy: &SandboxPolicy) -> HttpPolicy {
        HttpPolicy {
            allowed: policy.allowed_outbound_hosts.clone(),
            timeout: policy.http_timeout,
            max_response: policy.http_max_response.as_u64(),
            slots: Arc::new(Semaphore::new(policy.http_concurrency)),
            concurrency: policy.http_concurrency,
        }
    }
}

/// Who is calling: named in the host's log lines, and the run's span when tracing is on.
#[derive(Clone)]
pub(crate) struct Caller {
    pub(crate) plugin: Arc<str>,
    pub(crate) meta: Arc<RunMeta>,
    /// The run's span: each request gets a child span and carries its `traceparent`.
    pub(crate) trace: Option<crate::trace::RunTrace>,
}

/// Refusals one run logs in full; later ones are only counted, so a guest
/// that retries a denied target in a loop cannot flood the log.
const REFUSALS_LOGGED: usize = 3;

impl Caller {
    /// Logs a warning about one of this caller's requests, naming its target when known.
    fn warn(&self, target_url: Option<&dyn std::fmt::Display>, message: std::fmt::Arguments<'_>) {
        tracing::warn!(
            target: "hourglass::http",
            plugin = %self.plugin,
            task_type = %self.meta.task_type,
            task_id = %self.meta.task_id,
            attempt = self.meta.attempt,
            target_url = target_url.map(tracing::field::display),
            "{message}"
        );
    }

    /// Like [`Caller::warn`], at debug level.
    fn debug(&self, target_url: Option<&dyn std::fmt::Display>, message: std::fmt::Arguments<'_>) {
        tracing::debug!(
            target: "hourglass::http",
            plugin = %self.plugin,
            task_type = %self.meta.task_type,
            task_id = %self.meta.task_id,
            attempt = self.meta.attempt,
            target_url = target_url.map(tracing::field::display),
            "{message}"
        );
    }
}

/// The `wasi:http` hooks of one run.
pub(crate) struct OutboundHooks {
    policy: Arc<HttpPolicy>,
    /// When the run's execution deadline ends.
    run_deadline: std::time::Instant,
    budget: HostBudget,
    caller: Caller,
    /// Requests of this run refused so far.
    refused: Arc<AtomicUsize>,
}

impl OutboundHooks {
    pub(crate) fn new(
        policy: Arc<HttpPolicy>,
        run_deadline: std::time::Instant,
        budget: HostBudget,
        caller: Caller,
    ) -> OutboundHooks {
        OutboundHooks { policy, run_deadline, budget, caller, refused: Arc::default() }
    }

    fn deny(&self, target: &str, why: &str) {
        refusal(&self.caller, &self.refused, Some(&target), format_args!("outbound HTTP request refused: {why}"));
    }
}

/// Logs a refused request, the first [`REFUSALS_LOGGED`] of a run in full.
fn refusal(
    caller: &Caller,
    refused: &AtomicUsize,
    target: Option<&dyn std::fmt::Display>,
    message: std::fmt::Arguments<'_>,
) {
    let n = refused.fetch_add(1, Ordering::Relaxed) + 1;
    if n <= REFUSALS_LOGGED {
        caller.warn(target, message);
    }
    if n == REFUSALS_LOGGED {
        caller.warn(None, format_args!("further refused outbound requests of this run are not logged"));
    }
}

type SendFuture = Box<dyn Future<Output = Result<(http::Response<WasiBody>, IoFuture), Error>> + Send>;
type IoFuture = Box<dyn Future<Output = Result<(), Error>> + Send>;

impl WasiHttpHooks for OutboundHooks {
    /// Bodies written by the guest are buffered in chunks of this size (two at
    /// most per body), sized from `host_memory_limit`.
    fn p2_outgoing_body_chunk_size(&mut self) -> usize {
        self.budget.body_chunk()
    }

    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        _fut: Box<dyn Future<Output = Result<(), Error>> + Send>,
    ) -> SendFuture {
        if self.caller.meta.warm_up {
            // Nothing a warm-up call does leaves the sandbox (docs/sandbox.md).
            return refused(Error::HttpRequestDenied);
        }
        let uri = request.uri();
        let target = uri.host().and_then(|host| Target::new(uri.scheme_str().unwrap_or("https"), host, uri.port_u16()));
        let Some(target) = target else {
            let shown =
                format!("{}://{}", uri.scheme_str().unwrap_or("?"), uri.authority().map_or("?", |a| a.as_str()));
            self.deny(&shown, "not an http(s) URL with a host");
            return refused(Error::HttpRequestUriInvalid);
        };
        let how = if self.policy.allowed.is_empty() {
            self.deny(&target.to_string(), "this type has no allowed_outbound_hosts (no outbound HTTP)");
            None
        } else {
            let how = self.policy.allowed.check(&target);
            if how.is_none() {
                let why = if target.is_private_name() {
                    format!(
                        "{target} is not in allowed_outbound_hosts (private and loopback hosts must be listed exactly)"
                    )
                } else {
                    format!("{target} is not in allowed_outbound_hosts")
                };
                self.deny(&target.to_string(), &why);
            }
            how
        };
        let Some(how) = how else {
            return refused(Error::HttpRequestDenied);
        };

        // The tighter of http_timeout and what is left of the run's deadline.
        let now = std::time::Instant::now();
        let budget = self.policy.timeout.min(self.run_deadline.saturating_duration_since(now));
        // A guest may ask for shorter connect and first-byte timeouts, never longer ones.
        let connect_limit = options.and_then(|o| o.connect_timeout);
        let first_byte_limit = options.and_then(|o| o.first_byte_timeout);
        let until = Instant::now() + budget;
        let send = Sender {
            policy: self.policy.clone(),
            caller: self.caller.clone(),
            refused: self.refused.clone(),
            target,
            how,
            until,
            connect_limit,
            first_byte_limit,
        };
        Box::new(send.send(request))
    }
}

fn refused(e: Error) -> SendFuture {
    let result: Result<(http::Response<WasiBody>, IoFuture), Error> = Err(e);
    Box::new(async move { result })
}

/// One request on its way out.
struct Sender {
    policy: Arc<HttpPolicy>,
    caller: Caller,
    refused: Arc<AtomicUsize>,
    target: Target,
    how: Allowed,
    until: Instant,
    connect_limit: Option<Duration>,
    first_byte_limit: Option<Duration>,
}

trait Stream: AsyncRead + AsyncWrite + Send + Sync + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Sync + Unpin + 'static> Stream for T {}

impl Sender {
    /// Sends the request; when the run is traced, inside a client span whose
    /// `traceparent` the request carries.
    async fn send(self, mut request: http::Request<WasiBody>) -> Result<(http::Response<WasiBody>, IoFuture), Error> {
        let Some(mut span) = self.caller.trace.as_ref().map(|run| crate::trace::http_request(run, &mut request)) else {
            return self.exchange(request).await;
        };
        let result = self.exchange(request).await;
        match &result {
            Ok((response, _)) => span.status(response.status().as_u16()),
            Err(e) => span.failed(e),
        }
        result
    }

    async fn exchange(
        self,
        mut request: http::Request<WasiBody>,
    ) -> Result<(http::Response<WasiBody>, IoFuture), Error> {
        let until = self.until;
        let timed_out = || self.caller.debug(Some(&self.target), format_args!("outbound HTTP request timed out"));
        // Wait for a slot of the type's http_concurrency.
        let permit = match tokio::time::timeout_at(until, self.policy.slots.clone().acquire_owned()).await {
            Ok(Ok(permit)) => permit,
            Ok(Err(_)) => return Err(Error::ConnectionLimitReached),
            Err(_) => {
                self.caller.warn(
                    None,
                    format_args!("no free outbound HTTP slot in time (http_concurrency = {})", self.policy.concurrency),
                );
                return Err(Error::ConnectionLimitReached);
            }
        };

        let connect_until = self.connect_limit.map_or(until, |d| until.min(Instant::now() + d));
        let stream = match tokio::time::timeout_at(connect_until, self.connect()).await {
            Ok(stream) => stream?,
            Err(_) => {
                timed_out();
                return Err(Error::ConnectionTimeout);
            }
        };
        let (mut sender, conn) = match tokio::time::timeout_at(
            until,
            hyper::client::conn::http1::Builder::new().handshake::<_, WasiBody>(TokioIo::new(stream)),
        )
        .await
        {
            Ok(r) => r?,
            Err(_) => {
                timed_out();
                return Err(Error::ConnectionTimeout);
            }
        };
        // The request line carries the path only (we are not talking to a proxy).
        let path = request.uri().path_and_query().map_or("/", |p| p.as_str()).to_owned();
        *request.uri_mut() =
            http::Uri::builder().path_and_query(path).build().map_err(|_| Error::HttpRequestUriInvalid)?;

        // Drive the connection in its own task; it ends with the response body.
        let conn = wasmtime_wasi::runtime::spawn(async move { conn.await.map_err(Error::from) });
        let first_byte_until = self.first_byte_limit.map_or(until, |d| until.min(Instant::now() + d));
        let response = match tokio::time::timeout_at(first_byte_until, sender.send_request(request)).await {
            Ok(r) => r?,
            Err(_) => {
                timed_out();
                return Err(Error::HttpResponseTimeout);
            }
        };
        let max = self.policy.max_response;
        if let Some(len) = response.headers().get(http::header::CONTENT_LENGTH)
            && let Some(len) = len.to_str().ok().and_then(|l| l.parse::<u64>().ok())
            && len > max
        {
            self.caller.warn(
                Some(&self.target),
                format_args!("outbound HTTP response of {len} bytes refused: over http_max_response of {max} bytes"),
            );
            return Err(Error::HttpResponseBodySize(Some(len)));
        }
        self.caller
            .debug(Some(&self.target), format_args!("outbound HTTP response: status {}", response.status().as_u16()));
        let response = response.map(|incoming| {
            CappedBody {
                inner: incoming.map_err(Error::from).boxed_unsync(),
                left: max,
                max,
                deadline: Box::pin(tokio::time::sleep_until(until)),
                _permit: permit,
                done: false,
            }
            .boxed_unsync()
        });
        let io: IoFuture = Box::new(async move {
            match conn.await {
                Ok(()) => Ok(()),
                Err(e) => Err(e),
            }
        });
        Ok((response, io))
    }

    /// Resolves, checks the addresses, and connects (with TLS for https).
    async fn connect(&self) -> Result<Box<dyn Stream>, Error> {
        let t = &self.target;
        let addrs: Vec<SocketAddr> = match t.host.parse::<IpAddr>() {
            Ok(ip) => vec![SocketAddr::new(ip, t.port)],
            Err(_) => match tokio::net::lookup_host((t.host.as_str(), t.port)).await {
                Ok(addrs) => addrs.collect(),
                Err(e) => {
                    return Err(Error::DnsError { rcode: Some(e.to_string()), info_code: None });
                }
            },
        };
        if addrs.is_empty() {
            return Err(Error::DestinationNotFound);
        }
        if self.how == Allowed::ByWildcard
            && let Some((bad, why)) = addrs.iter().find_map(|a| not_public(a.ip()).map(|why| (a.ip(), why)))
        {
            refusal(
                &self.caller,
                &self.refused,
                Some(t),
                format_args!(
                    "outbound HTTP request refused: {} resolves to {bad} ({why}), which only an \
                     allowed_outbound_hosts entry naming the host exactly allows",
                    t.host,
                ),
            );
            return Err(Error::HttpRequestDenied);
        }
        let mut last = None;
        let mut tcp = None;
        for addr in &addrs {
            match TcpStream::connect(addr).await {
                Ok(s) => {
                    tcp = Some(s);
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        let Some(tcp) = tcp else {
            return Err(match last {
                Some(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => Error::ConnectionRefused,
                Some(e) => Error::Connect(e),
                None => Error::DestinationNotFound,
            });
        };
        let _ = tcp.set_nodelay(true);
        if t.scheme != "https" {
            return Ok(Box::new(tcp));
        }
        let name = match t.host.parse::<IpAddr>() {
            Ok(ip) => rustls::pki_types::ServerName::from(ip),
            Err(_) => rustls::pki_types::ServerName::try_from(t.host.as_str())
                .map_err(|_| Error::HttpRequestUriInvalid)?
                .to_owned(),
        };
        let tls = crate::outbound::tls_connector().connect(name, tcp).await.map_err(Error::Tls)?;
        Ok(Box::new(tls))
    }
}

/// A response body that errors past `max` bytes or after the deadline, and
/// holds the request's concurrency slot until it is done or dropped.
struct CappedBody {
    inner: WasiBody,
    left: u64,
    max: u64,
    deadline: Pin<Box<Sleep>>,
    _permit: OwnedSemaphorePermit,
    done: bool,
}

impl Body for CappedBody {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        if self.done {
            return Poll::Ready(None);
        }
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    let len = data.len() as u64;
                    if len > self.left {
                        self.done = true;
                        return Poll::Ready(Some(Err(Error::HttpResponseBodySize(Some(self.max)))));
                    }
                    self.left -= len;
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(other) => {
                // The end of the body, or an error that ends it.
                self.done = true;
                Poll::Ready(other)
            }
            Poll::Pending => match self.deadline.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    self.done = true;
                    Poll::Ready(Some(Err(Error::HttpResponseTimeout)))
                }
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
