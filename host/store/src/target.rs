//! Where Redis is and how to reach it: one server or a Redis Cluster, ACL
//! credentials and TLS. Secrets never show in logs, errors or `Debug` output.
//!
//! Forms accepted for `--redis`, `HOURGLASS_REDIS_URL` and `[redis] url`:
//!
//! - `redis://host:port/db`, `rediss://host:port` (TLS), `redis+unix:///path.sock`
//! - `redis+cluster://host1:port1,host2:port2` (or `rediss+cluster://`): Redis Cluster seed nodes
//! - `redis+sentinel://[user:pass@]host1:26379,host2:26379/<master>[/<db>]` (or
//!   `rediss+sentinel://`, TLS to the sentinels and the master): the master that
//!   Redis Sentinel names, followed through failovers; the URL's credentials are
//!   the sentinels', the master's come from `[redis] username` / `password`
//!
//! In `runner.toml`, `[redis] cluster = ["redis://h1:7000", "redis://h2:7001"]` does the same,
//! and `[redis] sentinel = { master = "mymaster", nodes = ["redis://h1:26379"] }` names a Sentinel setup.
//! `[redis] username` / `password` (or `HOURGLASS_REDIS_USERNAME` / `HOURGLASS_REDIS_PASSWORD`,
//! which win) log in as an ACL user; `[redis] ca_file` trusts a private CA for `rediss://`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo, TlsCertificates};
use serde::Deserialize;

use crate::keys::KeyPrefix;

mod sentinel;
use sentinel::split_sentinel_url;
pub use sentinel::{SentinelConfig, SentinelSpec};

/// Environment variable that wins over `[redis] username`.
pub const USERNAME_ENV: &str = "HOURGLASS_REDIS_USERNAME";
/// Environment variable that wins over `[redis] password`.
pub const PASSWORD_ENV: &str = "HOURGLASS_REDIS_PASSWORD";
/// Environment variable that wins over `[redis] sentinel.password` (the sentinels' own).
pub const SENTINEL_PASSWORD_ENV: &str = "HOURGLASS_SENTINEL_PASSWORD";

/// One Redis server or a cluster, with credentials and TLS settings.
#[derive(Clone)]
pub struct Target {
    /// One URL for a single server; the seed URLs of a cluster.
    nodes: Vec<String>,
    cluster: bool,
    username: Option<String>,
    password: Option<Secret>,
    /// PEM of the CA to trust for `rediss://`.
    ca: Option<Vec<u8>>,
    /// Set when `nodes` are sentinels: the master they name is the server.
    sentinel: Option<SentinelSpec>,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.shown())
    }
}

impl Target {
    /// The target of `url` alone (credentials only from the URL, no CA file).
    pub fn parse(url: &str) -> Result<Target> {
        if let Some((nodes, sentinel)) = split_sentinel_url(url)? {
            let target =
                Target { nodes, cluster: false, username: None, password: None, ca: None, sentinel: Some(sentinel) };
            target.check_urls()?;
            return Ok(target);
        }
        let (nodes, cluster) = split_cluster_url(url)?;
        let target = Target { nodes, cluster, username: None, password: None, ca: None, sentinel: None };
        target.check_urls()?;
        Ok(target)
    }

    /// The target of `[redis]`, where `url_override` (`--redis` / `HOURGLASS_REDIS_URL`) wins
    /// over `url` and `cluster`, and the environment's credentials win over the file's.
    pub fn resolve(config: &RedisConfig, url_override: Option<&str>) -> Result<Target> {
        let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        // One URL (the flag's, else the file's when it names no sentinel table or cluster list).
        let from_url = |url: &str| -> Result<(Vec<String>, bool, Option<SentinelSpec>)> {
            if let Some((nodes, spec)) = split_sentinel_url(url)? {
                return Ok((nodes, false, Some(spec)));
            }
            let (nodes, cluster) = split_cluster_url(url)?;
            Ok((nodes, cluster, None))
        };
        let (nodes, cluster, sentinel) = match (url_override, &config.sentinel) {
            (Some(url), _) => from_url(url)?,
            (None, Some(s)) => {
                if !config.cluster.is_empty() {
                    bail!("[redis] names both sentinel and cluster: a Sentinel setup has one master, a cluster many");
                }
                // `host:26379` is read as `redis://host:26379`, as redis-cli and the clients take it.
                let nodes = s.nodes.iter().map(|n| if n.contains("://") { n.clone() } else { format!("redis://{n}") });
                (nodes.collect(), false, Some(s.spec()?))
            }
            (None, None) if !config.cluster.is_empty() => {
                for seed in &config.cluster {
                    if seed.contains("+cluster://") || seed.contains(',') {
                        bail!("redis.cluster lists one node URL per entry, not {}", redact_url(seed));
                    }
                }
                (config.cluster.clone(), true, None)
            }
            (None, None) => from_url(&config.url)?,
        };
        let sentinel = sentinel.map(|mut spec| {
            if let Some(password) = env(SENTINEL_PASSWORD_ENV) {
                spec.password = Some(Secret::new(password));
            }
            spec
        });
        let username = env(USERNAME_ENV).or_else(|| config.username.clone());
        let password = env(PASSWORD_ENV).map(Secret::new).or_else(|| config.password.clone());
        let ca = match &config.ca_file {
            Some(path) => {
                Some(std::fs::read(path).with_context(|| format!("cannot read redis.ca_file {}", path.display()))?)
            }
            None => None,
        };
        let target = Target { nodes, cluster, username, password, ca, sentinel };
        target.check_urls()?;
        let tls = target.nodes.iter().all(|u| u.starts_with("rediss://"))
            || target.sentinel.as_ref().is_some_and(|s| s.master_tls);
        if target.ca.is_some() && !tls {
            bail!("redis.ca_file is set, but the Redis URL is not rediss:// (TLS)");
        }
        Ok(target)
    }

    /// The Sentinel setup this target reaches its master through, if any.
    pub fn sentinel(&self) -> Option<&SentinelSpec> {
        self.sentinel.as_ref()
    }

    /// Whether this is a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        self.cluster
    }

    /// The URL of a single server:
    /// `None` for a cluster and for a Sentinel setup (whose URLs are the sentinels').
    pub fn single_url(&self) -> Option<&str> {
        (!self.cluster && self.sentinel.is_none()).then(|| self.nodes[0].as_str())
    }

    /// A description safe for logs and errors: no credentials, no query.
    pub fn shown(&self) -> String {
        let urls: Vec<String> = self.nodes.iter().map(|u| redact_url(u)).collect();
        match &self.sentinel {
            Some(s) => format!("master '{}' of Sentinel {}", s.master, urls.join(",")),
            None if self.cluster => format!("cluster {}", urls.join(",")),
            None => urls.join(","),
        }
    }

    fn check_urls(&self) -> Result<()> {
        if self.nodes.is_empty() {
            bail!("no Redis URL");
        }
        for url in &self.nodes {
            self.info(url)?;
        }
        Ok(())
    }

    /// Connection info of `url` with this target's credentials applied.
    fn info(&self, url: &str) -> Result<ConnectionInfo> {
        let shown = redact_url(url);
        let info = url
            .into_connection_info()
            .map_err(|e| anyhow!("invalid Redis URL {shown}: {}", scrub(&e.to_string(), url, &shown)))?;
        let mut settings = info.redis_settings().clone();
        if let Some(user) = &self.username {
            settings = settings.set_username(user);
        }
        if let Some(password) = &self.password {
            settings = settings.set_password(password.expose());
        }
        Ok(info.set_redis_settings(settings))
    }

    fn certificates(&self) -> Option<TlsCertificates> {
        self.ca.as_ref().map(|pem| TlsCertificates { client_tls: None, root_cert: Some(pem.clone()) })
    }

    fn client_of(&self, info: ConnectionInfo) -> Result<redis::Client> {
        install_crypto_provider();
        let client = match self.certificates() {
            Some(certs) => redis::Client::build_with_tls(info, certs),
            None => redis::Client::open(info),
        };
        client
            .map_err(|e| anyhow!("cannot set up the Redis client for {}: {}", self.shown(), self.scrub(&e.to_string())))
    }

    /// A client of the single server, or of the first seed of a cluster.
    pub fn client(&self) -> Result<redis::Client> {
        self.client_of(self.info(&self.nodes[0])?)
    }

    /// A client of one cluster node at `host:port`, with the seeds' scheme, credentials and TLS.
    pub fn node_client(&self, host: &str, port: u16) -> Result<redis::Client> {
        let seed = self.info(&self.nodes[0])?;
        let addr = match seed.addr() {
            ConnectionAddr::TcpTls { insecure, .. } => {
                ConnectionAddr::TcpTls { host: host.to_owned(), port, insecure: *insecure, tls_params: None }
            }
            _ => ConnectionAddr::Tcp(host.to_owned(), port),
        };
        self.client_of(seed.set_addr(addr))
    }

    /// A cluster client over the seed nodes.
    pub fn cluster_client(
        &self,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> Result<redis::cluster::ClusterClient> {
        install_crypto_provider();
        let seeds = self.nodes.iter().map(|u| self.info(u)).collect::<Result<Vec<_>>>()?;
        let mut builder = redis::cluster::ClusterClientBuilder::new(seeds)
            .connection_timeout(connect_timeout)
            .response_timeout(response_timeout)
            .retries(6)
            .max_retry_wait(1000)
            .min_retry_wait(50);
        if let Some(certs) = self.certificates() {
            builder = builder.certs(certs);
        }
        builder.build().map_err(|e| {
            anyhow!("cannot set up the cluster client for {}: {}", self.shown(), self.scrub(&e.to_string()))
        })
    }

    /// `text` with every URL and the password replaced by safe forms.
    pub fn scrub(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for url in &self.nodes {
            out = scrub(&out, url, &redact_url(url));
        }
        let sentinel_password = self.sentinel.as_ref().and_then(|s| s.password.as_ref());
        for p in self.password.iter().chain(sentinel_password) {
            if !p.expose().is_empty() {
                out = out.replace(p.expose(), "<redacted>");
            }
        }
        out
    }
}

/// The port of `url` when it names a loopback TCP address
/// (`redis://127.0.0.1:6379`): where this host may start a server of its own
/// (`[redis] managed`). `None` for any other address; an error naming the
/// URL (its password hidden) when it does not parse.
pub fn loopback_port(url: &str) -> Result<Option<u16>> {
    let info = redis::IntoConnectionInfo::into_connection_info(url)
        .with_context(|| format!("invalid Redis URL {}", redact_url(url)))?;
    Ok(match info.addr() {
        redis::ConnectionAddr::Tcp(host, port)
            if matches!(host.as_str(), "127.0.0.1" | "localhost" | "::1" | "[::1]") =>
        {
            Some(*port)
        }
        _ => None,
    })
}

fn scrub(text: &str, url: &str, shown: &str) -> String {
    if url.is_empty() { text.to_owned() } else { text.replace(url, shown) }
}

/// `redis+cluster://[user:pass@]h1:p1,h2:p2` → seed URLs; any other URL → itself.
fn split_cluster_url(url: &str) -> Result<(Vec<String>, bool)> {
    let (scheme, rest) = match url.split_once("://") {
        Some(("redis+cluster", rest)) => ("redis", rest),
        Some(("rediss+cluster", rest)) => ("rediss", rest),
        _ => return Ok((vec![url.to_owned()], false)),
    };
    let (rest, query) = match rest.split_once('?') {
        Some((r, q)) => (r, format!("?{q}")),
        None => (rest, String::new()),
    };
    let (auth, hosts) = match rest.rfind('@') {
        Some(at) => (&rest[..=at], &rest[at + 1..]),
        None => ("", rest),
    };
    let hosts = hosts.trim_end_matches('/');
    let nodes: Vec<String> =
        hosts.split(',').filter(|h| !h.is_empty()).map(|h| format!("{scheme}://{auth}{h}{query}")).collect();
    if nodes.is_empty() {
        bail!("{} names no cluster node", redact_url(url));
    }
    Ok((nodes, true))
}

/// rustls needs one process-wide crypto provider; ring is the one compiled in.
fn install_crypto_provider() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// `url` without credentials or query (which may hold a password), for messages.
pub fn redact_url(url: &str) -> String {
    let url = url.split_once('?').map_or(url, |(base, _)| base);
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}://{}", &rest[at + 1..]),
        None => url.to_owned(),
    }
}

/// The `[redis]` table.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RedisConfig {
    /// Redis URL (`redis://host:port/db`, `redis+unix:///path.sock`); `--redis` and `HOURGLASS_REDIS_URL` win over it.
    pub url: String,
    /// Prefix of every key Hourglass reads or writes (`<prefix>:{<type>}:due`).
    pub prefix: KeyPrefix,
    /// Start a private `redis-server` when nothing answers at `url` (quick start).
    pub managed: bool,
    /// Data folder of the managed `redis-server` (append-only file), relative to the config file.
    pub data_dir: PathBuf,
    /// Redis Cluster seed nodes (`redis://host:port` or `rediss://`); when set, `url` is not used.
    pub cluster: Vec<String>,
    /// ACL user name; `HOURGLASS_REDIS_USERNAME` wins over it.
    pub username: Option<String>,
    /// Password (of `username`, or of the `default` user); `HOURGLASS_REDIS_PASSWORD` wins over it. Never logged.
    pub password: Option<Secret>,
    /// PEM file of the CA that signed the server's certificate, for `rediss://`; relative to the config file.
    pub ca_file: Option<PathBuf>,
    /// Redis Sentinel: the master's name and the sentinels that name it; when set, `url` is not used.
    pub sentinel: Option<SentinelConfig>,
}

impl Default for RedisConfig {
    fn default() -> Self {
        RedisConfig {
            url: "redis://127.0.0.1:6379".into(),
            prefix: KeyPrefix::default(),
            managed: false,
            data_dir: PathBuf::from(".hourglass/redis"),
            cluster: Vec::new(),
            username: None,
            password: None,
            ca_file: None,
            sentinel: None,
        }
    }
}

/// A string that is never printed (its `Debug` is `<redacted>`).
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(s: impl Into<String>) -> Secret {
        Secret(s.into())
    }

    /// The secret itself, to hand to the Redis client only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_credentials_and_query() {
        assert_eq!(redact_url("redis://user:secret@host:6379/0"), "redis://host:6379/0");
        assert_eq!(redact_url("redis://:secret@host"), "redis://host");
        assert_eq!(redact_url("redis://host:6379"), "redis://host:6379");
        assert_eq!(redact_url("redis+unix:///tmp/r.sock?pass=x"), "redis+unix:///tmp/r.sock");
    }

    #[test]
    fn cluster_urls_split_into_seeds() {
        let (nodes, cluster) = split_cluster_url("redis+cluster://u:p@127.0.0.1:7000,127.0.0.1:7001").unwrap();
        assert!(cluster);
        assert_eq!(nodes, vec!["redis://u:p@127.0.0.1:7000", "redis://u:p@127.0.0.1:7001"]);
        let (nodes, cluster) = split_cluster_url("redis://h:1").unwrap();
        assert!(!cluster);
        assert_eq!(nodes, vec!["redis://h:1"]);
        let t = Target::parse("rediss+cluster://u:secret@a:1,b:2").unwrap();
        assert_eq!(t.shown(), "cluster rediss://a:1,rediss://b:2");
    }

    #[test]
    fn secrets_do_not_print() {
        let config = RedisConfig { password: Some(Secret::new("hunter2")), ..RedisConfig::default() };
        assert!(!format!("{config:?}").contains("hunter2"));
        let t = Target::resolve(&config, None).unwrap();
        assert!(!format!("{t:?}").contains("hunter2"));
        assert_eq!(t.scrub("bad password hunter2"), "bad password <redacted>");
    }
}
