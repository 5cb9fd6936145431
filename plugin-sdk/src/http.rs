//! Outbound HTTP: a small blocking client over `wasi:http`, so handlers never touch raw WASI types.
//!
//! The host lets a request through only when its `scheme://host:port` is in
//! the task type's `allowed_outbound_hosts` (runner.toml); anything else
//! fails with [`ErrorKind::Denied`]. Requests are also bounded by the type's
//! `http_timeout`, `http_max_response` and the run's deadline.
//!
//! ```no_run
//! use hourglass_sdk::{Failure, http};
//!
//! fn notify(url: &str, token: &str) -> Result<(), Failure> {
//!     let auth = format!("Bearer {token}");
//!     let resp = http::post_json(url, &serde_json::json!({"ok": true}), &[("authorization", &auth)])?;
//!     if !resp.is_success() {
//!         return Err(Failure::error(format!("{url} answered {}", resp.status)));
//!     }
//!     Ok(())
//! }
//! # fn main() {}
//! ```

use std::fmt;

use crate::Failure;
use crate::bindings::wasi::http::outgoing_handler;
use crate::bindings::wasi::http::types as wt;
use crate::bindings::wasi::io::streams::StreamError;

/// An HTTP method.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Method {
    /// GET
    Get,
    /// HEAD
    Head,
    /// POST
    Post,
    /// PUT
    Put,
    /// PATCH
    Patch,
    /// DELETE
    Delete,
}

/// A request to send; build it with [`Request::new`] or use [`get`] / [`post_json`].
#[derive(Debug, Clone)]
pub struct Request {
    method: Method,
    url: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

/// A response, read whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// The status code, e.g. 200.
    pub status: u16,
    /// The headers as received (names in lower case; values lossily decoded).
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

/// What kind of failure an [`HttpError`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The host refused the target: not in the type's `allowed_outbound_hosts`.
    Denied,
    /// `http_timeout` or the run's deadline passed.
    Timeout,
    /// The response body was over `http_max_response`.
    TooLarge,
    /// The URL, a header or the method is invalid.
    InvalidRequest,
    /// DNS, connection, TLS or protocol trouble.
    Network,
}

/// Why a request failed; `?` turns it into a retryable [`Failure::Error`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpError {
    /// What kind of failure.
    pub kind: ErrorKind,
    /// One line, naming the URL (without its query).
    pub message: String,
}

impl fmt::Display for HttpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for HttpError {}

impl From<HttpError> for Failure {
    fn from(e: HttpError) -> Failure {
        // Even a denied target may be allowed by a config reload: retry by backoff.
        Failure::Error(e.message)
    }
}

impl Response {
    /// Whether the status is 2xx.
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    /// `Retry-After` in milliseconds, when it is given in seconds.
    pub fn retry_after_ms(&self) -> Option<u64> {
        let secs: u64 = self.header("retry-after")?.trim().parse().ok()?;
        Some(secs.saturating_mul(1000))
    }

    /// The usual reading of a status for a task: 2xx is success; 429 and 5xx
    /// are retried (after `Retry-After` seconds when given, else by backoff);
    /// anything else (4xx, an unfollowed 3xx) fails permanently. `what` names
    /// the other side in the failure text, e.g. `"webhook"`.
    pub fn outcome(&self, what: &str) -> Result<(), Failure> {
        if self.is_success() {
            return Ok(());
        }
        let body = self.text();
        let snippet: String = body.chars().take(200).collect();
        let text = if snippet.trim().is_empty() {
            format!("{what} answered {}", self.status)
        } else {
            format!("{what} answered {}: {}", self.status, snippet.trim())
        };
        if self.status == 429 || self.status >= 500 {
            return Err(match self.retry_after_ms() {
                Some(ms) => Failure::RetryAfter(ms),
                None => Failure::Error(text),
            });
        }
        Err(Failure::Permanent(text))
    }

    /// The body as text; invalid UTF-8 is replaced by `U+FFFD`.
    pub fn text(&self) -> std::borrow::Cow<'_, str> {
        String::from_utf8_lossy(&self.body)
    }

    /// Parses the body as JSON.
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_slice(&self.body)
    }
}

/// `GET url`.
pub fn get(url: &str) -> Result<Response, HttpError> {
    Request::new(Method::Get, url).send()
}

/// `POST url` with `body` as JSON (`content-type: application/json`) and extra `headers`.
pub fn post_json<T: serde::Serialize + ?Sized>(
    url: &str,
    body: &T,
    headers: &[(&str, &str)],
) -> Result<Response, HttpError> {
    let mut req = Request::new(Method::Post, url).json(body)?;
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.send()
}

impl Request {
    /// A request with no headers and an empty body.
    pub fn new(method: Method, url: impl Into<String>) -> Request {
        Request { method, url: url.into(), headers: Vec::new(), body: Vec::new() }
    }

    /// Adds a header.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Request {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Sets the body.
    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Request {
        self.body = body.into();
        self
    }

    /// Sets the body to `value` as JSON, with `content-type: application/json`.
    pub fn json<T: serde::Serialize + ?Sized>(self, value: &T) -> Result<Request, HttpError> {
        let body = serde_json::to_vec(value).map_err(|e| HttpError {
            kind: ErrorKind::InvalidRequest,
            message: format!("cannot encode the JSON body: {e}"),
        })?;
        Ok(self.header("content-type", "application/json").body(body))
    }

    /// Sends the request and reads the whole response; blocks until done.
    pub fn send(self) -> Result<Response, HttpError> {
        let url = Url::parse(&self.url)?;
        let err =
            |kind, what: String| HttpError { kind, message: format!("{} {}: {what}", self.method_name(), url.shown) };
        let invalid = |what: &str| err(ErrorKind::InvalidRequest, what.to_owned());

        let mut entries: Vec<(String, Vec<u8>)> =
            self.headers.iter().map(|(k, v)| (k.to_ascii_lowercase(), v.as_bytes().to_vec())).collect();
        // A known length instead of chunked encoding, which some servers refuse.
        let has_body = !self.body.is_empty() || matches!(self.method, Method::Post | Method::Put | Method::Patch);
        if has_body && !entries.iter().any(|(k, _)| k == "content-length") {
            entries.push(("content-length".into(), self.body.len().to_string().into_bytes()));
        }
        let fields =
            wt::Fields::from_list(&entries).map_err(|e| invalid(&format!("invalid or forbidden header: {e:?}")))?;
        let request = wt::OutgoingRequest::new(fields);
        request.set_method(&self.wit_method()).map_err(|()| invalid("invalid method"))?;
        request.set_scheme(Some(&url.scheme)).map_err(|()| invalid("invalid scheme"))?;
        request.set_authority(Some(&url.authority)).map_err(|()| invalid("invalid host"))?;
        request.set_path_with_query(Some(&url.path)).map_err(|()| invalid("invalid path"))?;
        let body = request.body().map_err(|()| invalid("body already taken"))?;

        let future = outgoing_handler::handle(request, None).map_err(|c| err(kind_of(&c), describe(&c)))?;
        // Stream the body; a refused request closes it early, and the reason
        // comes with the response below.
        let mut body_ok = true;
        if let Ok(stream) = body.write() {
            for chunk in self.body.chunks(4096) {
                if stream.blocking_write_and_flush(chunk).is_err() {
                    body_ok = false;
                    break;
                }
            }
            drop(stream);
        }
        if body_ok {
            let _ = wt::OutgoingBody::finish(body, None);
        }

        let response = loop {
            match future.get() {
                Some(r) => break r,
                None => future.subscribe().block(),
            }
        };
        let response = response
            .map_err(|()| err(ErrorKind::Network, "response already taken".into()))?
            .map_err(|c| err(kind_of(&c), describe(&c)))?;
        drop(future);

        let status = response.status();
        let headers = {
            let fields = response.headers();
            fields.entries().into_iter().map(|(k, v)| (k, String::from_utf8_lossy(&v).into_owned())).collect()
        };
        let incoming = response.consume().map_err(|()| err(ErrorKind::Network, "body already taken".into()))?;
        let mut data = Vec::new();
        {
            let stream = incoming.stream().map_err(|()| err(ErrorKind::Network, "body stream already taken".into()))?;
            loop {
                match stream.blocking_read(64 * 1024) {
                    Ok(chunk) => data.extend_from_slice(&chunk),
                    Err(StreamError::Closed) => break,
                    Err(StreamError::LastOperationFailed(e)) => {
                        let (kind, what) = match wt::http_error_code(&e) {
                            Some(c) => (kind_of(&c), describe(&c)),
                            None => {
                                let text = e.to_debug_string();
                                let text = text.lines().next().unwrap_or_default().trim().to_owned();
                                let kind = if text.contains("body size") {
                                    ErrorKind::TooLarge
                                } else if text.contains("timeout") {
                                    ErrorKind::Timeout
                                } else {
                                    ErrorKind::Network
                                };
                                (kind, text)
                            }
                        };
                        let what = match kind {
                            ErrorKind::TooLarge => {
                                format!("response body cut off: over the http_max_response limit ({what})")
                            }
                            ErrorKind::Timeout => {
                                format!("response body timed out: http_timeout or the task deadline passed ({what})")
                            }
                            _ => format!("reading the response body failed: {what}"),
                        };
                        return Err(err(kind, what));
                    }
                }
            }
        }
        drop(wt::IncomingBody::finish(incoming));
        drop(response);
        Ok(Response { status, headers, body: data })
    }

    fn wit_method(&self) -> wt::Method {
        match self.method {
            Method::Get => wt::Method::Get,
            Method::Head => wt::Method::Head,
            Method::Post => wt::Method::Post,
            Method::Put => wt::Method::Put,
            Method::Patch => wt::Method::Patch,
            Method::Delete => wt::Method::Delete,
        }
    }

    fn method_name(&self) -> &'static str {
        match self.method {
            Method::Get => "GET",
            Method::Head => "HEAD",
            Method::Post => "POST",
            Method::Put => "PUT",
            Method::Patch => "PATCH",
            Method::Delete => "DELETE",
        }
    }
}

fn kind_of(code: &wt::ErrorCode) -> ErrorKind {
    use wt::ErrorCode as C;
    match code {
        C::HttpRequestDenied | C::DestinationIpProhibited => ErrorKind::Denied,
        C::DnsTimeout
        | C::ConnectionTimeout
        | C::ConnectionReadTimeout
        | C::ConnectionWriteTimeout
        | C::HttpResponseTimeout => ErrorKind::Timeout,
        C::HttpResponseBodySize(_) => ErrorKind::TooLarge,
        C::HttpRequestUriInvalid | C::HttpRequestMethodInvalid | C::HttpRequestUriTooLong => ErrorKind::InvalidRequest,
        _ => ErrorKind::Network,
    }
}

fn describe(code: &wt::ErrorCode) -> String {
    use wt::ErrorCode as C;
    match code {
        C::HttpRequestDenied => "not allowed: the host refused this target (it must be listed in the task type's \
                                 allowed_outbound_hosts in runner.toml)"
            .to_owned(),
        C::ConnectionTimeout | C::HttpResponseTimeout | C::ConnectionReadTimeout => {
            "timed out (http_timeout or the task deadline passed)".to_owned()
        }
        C::HttpResponseBodySize(Some(n)) => {
            format!("response body of {n} bytes is over the http_max_response limit")
        }
        C::HttpResponseBodySize(None) => "response body is over the http_max_response limit".to_owned(),
        C::ConnectionRefused => "connection refused".to_owned(),
        C::ConnectionLimitReached => "no free outbound HTTP slot (http_concurrency) in time".to_owned(),
        C::DnsError(p) => format!("DNS lookup failed: {}", p.rcode.as_deref().unwrap_or("unknown error")),
        C::InternalError(Some(m)) => format!("host error: {m}"),
        other => format!("{other:?}"),
    }
}

/// The parts of an `http(s)://` URL that wasi:http wants.
struct Url {
    scheme: wt::Scheme,
    authority: String,
    path: String,
    /// For messages: the URL without query or fragment (they may carry secrets).
    shown: String,
}

impl Url {
    fn parse(url: &str) -> Result<Url, HttpError> {
        let bad = |why: &str| HttpError {
            kind: ErrorKind::InvalidRequest,
            message: format!("invalid URL {:?}: {why}", url.split(['?', '#']).next().unwrap_or(url)),
        };
        let (scheme, rest) = url.split_once("://").ok_or_else(|| bad("no scheme"))?;
        let scheme = match scheme.to_ascii_lowercase().as_str() {
            "http" => wt::Scheme::Http,
            "https" => wt::Scheme::Https,
            _ => return Err(bad("only http and https are supported")),
        };
        let rest = rest.split('#').next().unwrap_or_default();
        let end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, path) = rest.split_at(end);
        if authority.is_empty() || authority.contains('@') {
            return Err(bad("no host, or user info in the URL"));
        }
        let path = match path {
            "" => "/".to_owned(),
            p if p.starts_with('?') => format!("/{p}"),
            p => p.to_owned(),
        };
        let shown = url.split(['?', '#']).next().unwrap_or(url).to_owned();
        Ok(Url { scheme, authority: authority.to_owned(), path, shown })
    }
}
