//! Outbound HTTP: `allowed_outbound_hosts` (which targets a plugin may call) and the one TLS client configuration.
//!
//! An entry is `scheme://host[:port]`, modelled on Spin's allow-list:
//!
//! - scheme: `http`, `https` or `*` (either);
//! - host: a name (`api.example.com`), an IP literal (`10.0.0.7`, `[::1]`),
//!   `*.example.com` (any subdomain, not `example.com` itself) or `*` (any host);
//! - port: a number, `*` (any port) or nothing (the scheme's default: 80 or 443).
//!
//! Non-public targets (`localhost`, loopback, private, link-local, every
//! other special-purpose range, IPv6 forms carrying such an IPv4 address, and
//! this machine's own addresses) are only reached through an entry that
//! names the host exactly: a `*` never matches them, neither as a name nor
//! as the address a name resolves to.

use hourglass_task::sync::LockExt;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde::Deserialize;

/// The parsed allow-list of one task type; empty means no outbound HTTP.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(try_from = "Vec<String>")]
pub struct AllowedHosts(Vec<HostPattern>);

/// One `allowed_outbound_hosts` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPattern {
    text: String,
    scheme: SchemePattern,
    host: HostMatch,
    port: PortPattern,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SchemePattern {
    Http,
    Https,
    Any,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum HostMatch {
    /// A lower-case name or an IP literal (IPv6 without brackets).
    Exact(String),
    /// `*.suffix`: stored as `.suffix`.
    Subdomains(String),
    /// `*`.
    Any,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PortPattern {
    Default,
    Port(u16),
    Any,
}

/// A request target: scheme, host and port, e.g. `https://api.example.com:443`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// `http` or `https`.
    pub scheme: String,
    /// Lower-case host name or IP literal (IPv6 without brackets).
    pub host: String,
    /// The port, the scheme's default filled in.
    pub port: u16,
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "{}://[{}]:{}", self.scheme, self.host, self.port)
        } else {
            write!(f, "{}://{}:{}", self.scheme, self.host, self.port)
        }
    }
}

impl Target {
    /// Builds a target from a URI's parts; `None` when the scheme is not http(s).
    pub fn new(scheme: &str, host: &str, port: Option<u16>) -> Option<Target> {
        let scheme = scheme.to_ascii_lowercase();
        let default = match scheme.as_str() {
            "http" => 80,
            "https" => 443,
            _ => return None,
        };
        let host = host.trim_start_matches('[').trim_end_matches(']').trim_end_matches('.').to_ascii_lowercase();
        Some(Target { scheme, host, port: port.unwrap_or(default) })
    }

    /// Whether the host itself (before DNS) is a private or loopback one.
    pub fn is_private_name(&self) -> bool {
        if self.host == "localhost" || self.host.ends_with(".localhost") {
            return true;
        }
        self.host.parse::<IpAddr>().is_ok_and(is_private)
    }
}

/// How a target was allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allowed {
    /// By an entry naming its host exactly: private addresses are fine.
    Explicitly,
    /// Only through a `*` host: its addresses must be public.
    ByWildcard,
}

impl AllowedHosts {
    /// No entries: no outbound HTTP.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The entries as written.
    pub fn entries(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|p| p.text.as_str())
    }

    /// Whether `target` may be called, and how; `None` when no entry allows it.
    ///
    /// A private or loopback host name matches exact entries only.
    pub fn check(&self, target: &Target) -> Option<Allowed> {
        let private = target.is_private_name();
        let mut result = None;
        for p in &self.0 {
            if !p.scheme_matches(&target.scheme) || !p.port_matches(target) {
                continue;
            }
            match &p.host {
                HostMatch::Exact(h) if *h == target.host => return Some(Allowed::Explicitly),
                HostMatch::Exact(_) => {}
                HostMatch::Subdomains(suffix) if !private && target.host.ends_with(suffix.as_str()) => {
                    result = Some(Allowed::ByWildcard)
                }
                HostMatch::Subdomains(_) => {}
                HostMatch::Any if !private => result = Some(Allowed::ByWildcard),
                HostMatch::Any => {}
            }
        }
        result
    }
}

impl HostPattern {
    fn scheme_matches(&self, scheme: &str) -> bool {
        match self.scheme {
            SchemePattern::Http => scheme == "http",
            SchemePattern::Https => scheme == "https",
            SchemePattern::Any => true,
        }
    }

    fn port_matches(&self, target: &Target) -> bool {
        match self.port {
            PortPattern::Any => true,
            PortPattern::Port(p) => p == target.port,
            PortPattern::Default => {
                let default = if target.scheme == "https" { 443 } else { 80 };
                target.port == default
            }
        }
    }
}

impl TryFrom<Vec<String>> for AllowedHosts {
    type Error = String;

    fn try_from(entries: Vec<String>) -> Result<Self, Self::Error> {
        entries.iter().map(|e| e.parse()).collect::<Result<Vec<_>, _>>().map(AllowedHosts)
    }
}

impl std::str::FromStr for HostPattern {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = |why: &str| {
            format!(
                "invalid allowed_outbound_hosts entry {text:?}: {why} (expected scheme://host[:port], \
                 e.g. \"https://api.example.com\", \"http://*.internal:8080\", \"https://example.com:*\")"
            )
        };
        let (scheme, rest) = text.split_once("://").ok_or_else(|| bad("no scheme"))?;
        let scheme = match scheme.to_ascii_lowercase().as_str() {
            "http" => SchemePattern::Http,
            "https" => SchemePattern::Https,
            "*" => SchemePattern::Any,
            _ => return Err(bad("the scheme must be http, https or *")),
        };
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if rest.contains(['/', '?', '#', '@']) {
            return Err(bad("no path, query or user info allowed"));
        }
        // Split host and port, minding IPv6 brackets.
        let (host, port) = if let Some(after) = rest.strip_prefix('[') {
            let (ip, tail) = after.split_once(']').ok_or_else(|| bad("unclosed ["))?;
            let port = match tail {
                "" => None,
                t => Some(t.strip_prefix(':').ok_or_else(|| bad("junk after ]"))?),
            };
            ip.parse::<Ipv6Addr>().map_err(|_| bad("invalid IPv6 address"))?;
            (ip.to_owned(), port)
        } else {
            match rest.rsplit_once(':') {
                Some((h, p)) => (h.to_owned(), Some(p)),
                None => (rest.to_owned(), None),
            }
        };
        let port = match port {
            None => PortPattern::Default,
            Some("*") => PortPattern::Any,
            Some(p) => PortPattern::Port(p.parse().map_err(|_| bad("invalid port"))?),
        };
        let host = host.to_ascii_lowercase();
        let host = if host == "*" {
            HostMatch::Any
        } else if let Some(suffix) = host.strip_prefix("*.") {
            check_name(suffix).map_err(|w| bad(&w))?;
            HostMatch::Subdomains(format!(".{suffix}"))
        } else {
            if host.parse::<IpAddr>().is_err() {
                check_name(&host).map_err(|w| bad(&w))?;
            }
            HostMatch::Exact(host)
        };
        Ok(HostPattern { text: text.to_owned(), scheme, host, port })
    }
}

fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 253
        && name
            .split('.')
            .all(|label| !label.is_empty() && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
    if ok { Ok(()) } else { Err(format!("{name:?} is not a host name (`*` only as a whole label at the start)")) }
}

/// Whether `ip` is a loopback, private or otherwise non-public address, one
/// that a `*` entry never reaches.
pub fn is_private(ip: IpAddr) -> bool {
    not_public(ip).is_some()
}

/// Why `ip` is not a public unicast address, or `None` when it is.
///
/// Anything in the IANA special-purpose registries counts (loopback,
/// private, shared, link-local, documentation, benchmarking, reserved,
/// multicast, ...), IPv6 forms that carry an IPv4 address (mapped,
/// compatible, NAT64, 6to4, Teredo) are judged by, or refused for, what they
/// carry, and so is every address of this machine's own interfaces.
pub fn not_public(ip: IpAddr) -> Option<&'static str> {
    let special = match ip {
        IpAddr::V4(v4) => special_v4(v4),
        IpAddr::V6(v6) => special_v6(v6),
    };
    special.or_else(|| own_addresses().contains(&ip).then_some("an address of this machine"))
}

fn special_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, c, _] = ip.octets();
    let why = match (a, b, c) {
        (0, ..) => "\"this network\" 0.0.0.0/8",
        (10, ..) => "private 10.0.0.0/8",
        (100, 64..=127, _) => "shared address space 100.64.0.0/10",
        (127, ..) => "loopback 127.0.0.0/8",
        (169, 254, _) => "link-local 169.254.0.0/16",
        (172, 16..=31, _) => "private 172.16.0.0/12",
        (192, 0, 0) => "IETF protocol assignments 192.0.0.0/24",
        (192, 0, 2) => "documentation 192.0.2.0/24 (TEST-NET-1)",
        (192, 88, 99) => "6to4 relay anycast 192.88.99.0/24",
        (192, 168, _) => "private 192.168.0.0/16",
        (198, 18..=19, _) => "benchmarking 198.18.0.0/15",
        (198, 51, 100) => "documentation 198.51.100.0/24 (TEST-NET-2)",
        (203, 0, 113) => "documentation 203.0.113.0/24 (TEST-NET-3)",
        (224..=239, ..) => "multicast 224.0.0.0/4",
        (240..=255, ..) => "reserved 240.0.0.0/4",
        _ => return None,
    };
    Some(why)
}

fn special_v6(ip: Ipv6Addr) -> Option<&'static str> {
    let s = ip.segments();
    let embedded = |hi: usize| Ipv4Addr::new((s[hi] >> 8) as u8, s[hi] as u8, (s[hi + 1] >> 8) as u8, s[hi + 1] as u8);
    if ip.is_unspecified() {
        return Some("unspecified ::");
    }
    if ip.is_loopback() {
        return Some("loopback ::1");
    }
    if let Some(v4) = ip.to_ipv4_mapped() {
        return special_v4(v4).map(|_| "IPv4-mapped IPv6 of a non-public IPv4 address");
    }
    // ::a.b.c.d, the deprecated IPv4-compatible form: some stacks still route it as IPv4.
    if s[..6] == [0; 6] {
        return Some("IPv4-compatible IPv6 ::/96");
    }
    let why = match s[0] {
        0x0064 if s[1] == 0xff9b => "NAT64 64:ff9b::/96 and 64:ff9b:1::/48 (carry an IPv4 address)",
        0x0100 if s[1..4] == [0, 0, 0] => "discard-only 100::/64",
        0x2001 if s[1] == 0 => "Teredo 2001::/32 (carries an IPv4 address)",
        0x2001 if s[1] < 0x0200 => "IETF protocol assignments 2001::/23",
        0x2001 if s[1] == 0x0db8 => "documentation 2001:db8::/32",
        0x2002 => match special_v4(embedded(1)) {
            Some(_) => "6to4 2002::/16 of a non-public IPv4 address",
            None => return None,
        },
        0x3fff if s[1] < 0x1000 => "documentation 3fff::/20",
        0x5f00 => "segment routing 5f00::/16",
        x if x & 0xfe00 == 0xfc00 => "unique local fc00::/7",
        x if x & 0xffc0 == 0xfe80 => "link-local fe80::/10",
        x if x & 0xffc0 == 0xfec0 => "site-local fec0::/10",
        x if x & 0xff00 == 0xff00 => "multicast ff00::/8",
        _ => return None,
    };
    Some(why)
}

/// The addresses of this machine's interfaces, looked up at most every few seconds.
fn own_addresses() -> Vec<IpAddr> {
    use std::sync::Mutex;
    use std::time::{Duration, Instant};
    static CACHE: Mutex<Option<(Instant, Vec<IpAddr>)>> = Mutex::new(None);
    const FRESH: Duration = Duration::from_secs(5);
    let mut cache = CACHE.lock_unpoisoned();
    match &*cache {
        Some((at, addrs)) if at.elapsed() < FRESH => addrs.clone(),
        _ => {
            // An interface list that cannot be read refuses nothing extra; the ranges above still apply.
            let addrs: Vec<IpAddr> =
                if_addrs::get_if_addrs().map(|l| l.into_iter().map(|i| i.ip()).collect()).unwrap_or_default();
            *cache = Some((Instant::now(), addrs.clone()));
            addrs
        }
    }
}

/// One TLS client configuration (ring, webpki roots) for the process.
pub fn tls_connector() -> tokio_rustls::TlsConnector {
    static CONFIG: std::sync::OnceLock<std::sync::Arc<rustls::ClientConfig>> = std::sync::OnceLock::new();
    let config = CONFIG.get_or_init(|| {
        let roots = rustls::RootCertStore { roots: webpki_roots::TLS_SERVER_ROOTS.into() };
        // An explicit provider: other crates may enable a second one, and then
        // rustls cannot pick a default on its own.
        let config =
            rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .expect("ring supports the default TLS versions")
                .with_root_certificates(roots)
                .with_no_client_auth();
        std::sync::Arc::new(config)
    });
    tokio_rustls::TlsConnector::from(config.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(entries: &[&str]) -> AllowedHosts {
        AllowedHosts::try_from(entries.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
    }

    fn target(url: &str) -> Target {
        let uri: http::Uri = url.parse().unwrap();
        Target::new(uri.scheme_str().unwrap(), uri.host().unwrap(), uri.port_u16()).unwrap()
    }

    #[test]
    fn exact_wildcard_and_ports() {
        let l = list(&["https://api.example.com", "http://*.internal:8080", "https://example.com:*"]);
        assert_eq!(l.check(&target("https://api.example.com/x")), Some(Allowed::Explicitly));
        assert_eq!(l.check(&target("https://API.example.com:443")), Some(Allowed::Explicitly));
        assert_eq!(l.check(&target("https://api.example.com:8443")), None);
        assert_eq!(l.check(&target("http://api.example.com")), None);
        assert_eq!(l.check(&target("http://a.b.internal:8080")), Some(Allowed::ByWildcard));
        assert_eq!(l.check(&target("http://internal:8080")), None);
        assert_eq!(l.check(&target("http://a.internal:8081")), None);
        assert_eq!(l.check(&target("https://example.com:9999")), Some(Allowed::Explicitly));
        assert_eq!(l.check(&target("https://evil.com")), None);
        assert_eq!(list(&[]).check(&target("https://api.example.com")), None);
    }

    #[test]
    fn private_targets_need_an_exact_entry() {
        let l = list(&["*://*:*"]);
        assert_eq!(l.check(&target("https://example.org")), Some(Allowed::ByWildcard));
        for t in [
            "http://127.0.0.1:80",
            "http://localhost:8080",
            "http://[::1]:80",
            "http://10.1.2.3",
            "http://172.20.0.1",
            "http://192.168.1.1",
            "http://169.254.169.254",
            "http://[fd00::1]",
            "http://[::ffff:127.0.0.1]",
        ] {
            assert_eq!(l.check(&target(t)), None, "{t}");
        }
        let l = list(&["http://127.0.0.1:*", "http://[::1]:8080", "http://localhost:9000"]);
        assert_eq!(l.check(&target("http://127.0.0.1:1234")), Some(Allowed::Explicitly));
        assert_eq!(l.check(&target("http://[::1]:8080")), Some(Allowed::Explicitly));
        assert_eq!(l.check(&target("http://localhost:9000")), Some(Allowed::Explicitly));
        assert_eq!(l.check(&target("http://127.0.0.2:1234")), None);
    }

    #[test]
    fn bad_entries_are_refused() {
        for bad in [
            "api.example.com",
            "ftp://x.com",
            "https://x.com/path",
            "https://x.com:port",
            "https://a.*.com",
            "https://",
        ] {
            let err = bad.parse::<HostPattern>().unwrap_err();
            assert!(err.contains("invalid allowed_outbound_hosts entry"), "{bad}: {err}");
        }
    }

    #[test]
    fn private_addresses() {
        for ip in [
            "127.0.0.1",
            "10.0.0.1",
            "172.31.255.255",
            "192.168.0.1",
            "169.254.1.1",
            "0.0.0.0",
            "100.64.0.1",
            "::1",
            "fe80::1",
            "fc00::1",
        ] {
            assert!(is_private(ip.parse().unwrap()), "{ip}");
        }
        for ip in ["8.8.8.8", "172.32.0.1", "2606:4700::1111", "100.128.0.1", "2002:808:808::1"] {
            assert!(!is_private(ip.parse().unwrap()), "{ip}");
        }
    }

    #[test]
    fn special_purpose_ranges_and_embedded_ipv4_are_not_public() {
        for (ip, why) in [
            ("192.0.2.2", "TEST-NET-1"),
            ("198.51.100.7", "TEST-NET-2"),
            ("203.0.113.9", "TEST-NET-3"),
            ("198.18.0.1", "benchmarking"),
            ("192.0.0.8", "IETF"),
            ("224.0.0.1", "multicast"),
            ("255.255.255.255", "reserved"),
            ("::127.0.0.1", "IPv4-compatible"),
            ("::ffff:10.0.0.1", "IPv4-mapped"),
            ("64:ff9b::7f00:1", "NAT64"),
            ("64:ff9b:1::a00:1", "NAT64"),
            ("2002:7f00:1::1", "6to4"),
            ("2001:0:4136:e378::1", "Teredo"),
            ("2001:db8::1", "documentation"),
            ("ff02::1", "multicast"),
            ("100::1", "discard"),
        ] {
            let got = not_public(ip.parse().unwrap());
            assert!(got.is_some_and(|w| w.contains(why)), "{ip}: {got:?}");
        }
    }

    #[test]
    fn this_machines_own_addresses_are_not_public() {
        for ip in own_addresses() {
            assert!(not_public(ip).is_some(), "{ip}");
        }
    }
}
