//! Redis Sentinel targets: the `redis+sentinel://` URL, the `[redis] sentinel` table, and the clients of the sentinels and of the nodes they list.

use anyhow::{Result, anyhow, bail};
use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo};
use serde::Deserialize;

use super::{Secret, Target, install_crypto_provider, redact_url, scrub};

/// The master a Sentinel setup names, and how to reach the sentinels and it.
#[derive(Clone)]
pub struct SentinelSpec {
    /// The master's name, as the sentinels monitor it.
    pub master: String,
    /// The sentinels' own ACL user and password (the master's are the target's).
    pub(super) username: Option<String>,
    pub(super) password: Option<Secret>,
    /// Reach the master over TLS (trusting the target's CA).
    pub(super) master_tls: bool,
    /// The database number on the master.
    pub(super) db: i64,
}

/// `[redis] sentinel`: where the master is, as Redis Sentinel says, followed through failovers.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SentinelConfig {
    /// The master's name, as the sentinels monitor it (`sentinel monitor <name> ...`).
    pub master: String,
    /// The sentinels: `redis://host:26379`, or `rediss://` for TLS (trusting `ca_file`); one or more.
    pub nodes: Vec<String>,
    /// The sentinels' ACL user, when they have one (the master's is `[redis] username`).
    #[serde(default)]
    pub username: Option<String>,
    /// The sentinels' password (`requirepass` in sentinel.conf); `HOURGLASS_SENTINEL_PASSWORD` wins over it.
    #[serde(default)]
    pub password: Option<Secret>,
    /// Reach the master over TLS, trusting `ca_file` (the sentinels' scheme is their own).
    #[serde(default)]
    pub master_tls: bool,
    /// The database number on the master.
    #[serde(default)]
    pub db: i64,
}

impl SentinelConfig {
    pub(super) fn spec(&self) -> Result<SentinelSpec> {
        if self.master.trim().is_empty() {
            bail!("redis.sentinel.master is empty: name the master as the sentinels monitor it");
        }
        if self.nodes.is_empty() {
            bail!("redis.sentinel.nodes is empty: list at least one sentinel (redis://host:26379)");
        }
        for node in &self.nodes {
            if node.contains("+sentinel://") || node.contains(',') {
                bail!("redis.sentinel.nodes lists one sentinel URL per entry, not {}", redact_url(node));
            }
        }
        Ok(SentinelSpec {
            master: self.master.clone(),
            username: self.username.clone(),
            password: self.password.clone(),
            master_tls: self.master_tls,
            db: self.db,
        })
    }
}

impl Target {
    /// A client of the sentinels that names the master (Sentinel targets
    /// only): the sentinels' credentials and TLS from their URLs and the
    /// spec, the master's from the target.
    pub fn sentinel_client(&self) -> Result<Option<redis::sentinel::SentinelClient>> {
        use redis::sentinel::{SentinelClientBuilder, SentinelServerType};
        let Some(spec) = &self.sentinel else { return Ok(None) };
        install_crypto_provider();
        let infos = self.nodes.iter().map(|u| self.sentinel_info(u)).collect::<Result<Vec<_>>>()?;
        let addrs = infos.iter().map(|i| i.addr().clone());
        let fail = |e: redis::RedisError| {
            anyhow!("cannot set up the Sentinel client for {}: {}", self.shown(), self.scrub(&e.to_string()))
        };
        let mut builder = SentinelClientBuilder::new(addrs, &spec.master, SentinelServerType::Master).map_err(fail)?;
        // The sentinels' login: the spec's, else the first URL's.
        let url_login =
            infos.iter().map(|i| i.redis_settings()).find(|r| r.password().is_some() || r.username().is_some());
        let username = spec.username.clone().or_else(|| url_login.and_then(|r| r.username().map(str::to_owned)));
        let password = spec
            .password
            .as_ref()
            .map(|p| p.expose().to_owned())
            .or_else(|| url_login.and_then(|r| r.password().map(str::to_owned)));
        if let Some(user) = username {
            builder = builder.set_client_to_sentinel_username(user);
        }
        if let Some(password) = password {
            builder = builder.set_client_to_sentinel_password(password);
        }
        let sentinels_tls = infos.iter().any(|i| matches!(i.addr(), ConnectionAddr::TcpTls { .. }));
        if let Some(certs) = self.certificates().filter(|_| sentinels_tls) {
            builder = builder.set_client_to_sentinel_certificates(certs);
        }
        if let Some(user) = &self.username {
            builder = builder.set_client_to_redis_username(user);
        }
        if let Some(password) = &self.password {
            builder = builder.set_client_to_redis_password(password.expose());
        }
        builder = builder.set_client_to_redis_db(spec.db);
        if spec.master_tls {
            builder = builder.set_client_to_redis_tls_mode(redis::TlsMode::Secure);
            if let Some(certs) = self.certificates() {
                builder = builder.set_client_to_redis_certificates(certs);
            }
        }
        builder.build().map(Some).map_err(fail)
    }

    /// A client of the data node at `host:port` of a Sentinel setup (a
    /// replica the sentinels list), with the master's credentials, database and TLS.
    pub fn sentinel_node_client(&self, host: &str, port: u16) -> Result<redis::Client> {
        let spec = self.sentinel.as_ref().ok_or_else(|| anyhow!("not a Sentinel target"))?;
        let scheme = if spec.master_tls { "rediss" } else { "redis" };
        let host = if host.contains(':') { format!("[{host}]") } else { host.to_owned() };
        let info = self.info(&format!("{scheme}://{host}:{port}/{}", spec.db))?;
        install_crypto_provider();
        let client = match self.certificates().filter(|_| spec.master_tls) {
            Some(certs) => redis::Client::build_with_tls(info, certs),
            None => redis::Client::open(info),
        };
        client.map_err(|e| anyhow!("cannot set up a client of {host}:{port}: {}", self.scrub(&e.to_string())))
    }

    /// Connection info of a sentinel's URL as written (its own credentials, if any).
    fn sentinel_info(&self, url: &str) -> Result<ConnectionInfo> {
        let shown = redact_url(url);
        url.into_connection_info()
            .map_err(|e| anyhow!("invalid sentinel URL {shown}: {}", scrub(&e.to_string(), url, &shown)))
    }
}

/// `redis+sentinel://[user:pass@]h1:p1,h2:p2/<master>[/<db>]` → the
/// sentinels' URLs (with the URL's credentials) and the master's spec;
/// `rediss+sentinel://` reaches both over TLS. `None` for any other URL.
pub(super) fn split_sentinel_url(url: &str) -> Result<Option<(Vec<String>, SentinelSpec)>> {
    let (scheme, rest) = match url.split_once("://") {
        Some(("redis+sentinel", rest)) => ("redis", rest),
        Some(("rediss+sentinel", rest)) => ("rediss", rest),
        _ => return Ok(None),
    };
    let shown = redact_url(url);
    let rest = rest.split_once('?').map_or(rest, |(r, _)| r);
    let (auth, rest) = match rest.rfind('@') {
        Some(at) => (&rest[..=at], &rest[at + 1..]),
        None => ("", rest),
    };
    let (hosts, path) = rest.split_once('/').unwrap_or((rest, ""));
    let mut path = path.split('/').filter(|p| !p.is_empty());
    let Some(master) = path.next() else {
        bail!("{shown} names no master: write redis+sentinel://host:26379/<master name>");
    };
    let db = match path.next() {
        Some(db) => db
            .parse::<i64>()
            .map_err(|_| anyhow!("{shown}: the database after the master's name is not a number: {db}"))?,
        None => 0,
    };
    let nodes: Vec<String> =
        hosts.split(',').filter(|h| !h.is_empty()).map(|h| format!("{scheme}://{auth}{h}")).collect();
    if nodes.is_empty() {
        bail!("{shown} names no sentinel");
    }
    let spec =
        SentinelSpec { master: master.to_owned(), username: None, password: None, master_tls: scheme == "rediss", db };
    Ok(Some((nodes, spec)))
}

#[cfg(test)]
mod tests {
    use super::super::RedisConfig;
    use super::*;

    #[test]
    fn sentinel_urls_name_the_sentinels_and_the_master() {
        let t = Target::parse("redis+sentinel://u:secret@a:26379,b:26380/mymaster/2").unwrap();
        assert_eq!(t.nodes, vec!["redis://u:secret@a:26379", "redis://u:secret@b:26380"]);
        let spec = t.sentinel().unwrap();
        assert_eq!((spec.master.as_str(), spec.db, spec.master_tls), ("mymaster", 2, false));
        assert_eq!(t.shown(), "master 'mymaster' of Sentinel redis://a:26379,redis://b:26380");
        assert!(t.single_url().is_none() && !t.is_cluster());
        assert!(Target::parse("rediss+sentinel://a:26379/m").unwrap().sentinel().unwrap().master_tls);
        for (bad, says) in [
            ("redis+sentinel://a:26379", "names no master"),
            ("redis+sentinel://a:26379/", "names no master"),
            ("redis+sentinel:///m", "names no sentinel"),
            ("redis+sentinel://a:26379/m/x", "not a number"),
        ] {
            let err = format!("{:#}", Target::parse(bad).err().unwrap_or_else(|| panic!("{bad} parsed")));
            assert!(err.contains(says) && !err.contains('\n'), "{bad}: {err}");
        }
        // The flag's URL and the file's url both take the form.
        let config = RedisConfig { url: "redis+sentinel://a:26379/m".into(), ..RedisConfig::default() };
        assert!(Target::resolve(&config, None).unwrap().sentinel().is_some());
        assert!(Target::resolve(&RedisConfig::default(), Some("redis+sentinel://a:1/m")).unwrap().sentinel().is_some());
    }

    #[test]
    fn the_sentinel_table_is_checked() {
        let parse = |text: &str| -> Result<Target> {
            let config: RedisConfig = toml::from_str(text)?;
            Target::resolve(&config, None)
        };
        let t = parse("sentinel = { master = \"m\", nodes = [\"redis://a:26379\", \"b:26380\"], password = \"s3\" }")
            .unwrap();
        assert_eq!(t.sentinel().unwrap().master, "m");
        assert_eq!(t.shown(), "master 'm' of Sentinel redis://a:26379,redis://b:26380");
        assert!(!format!("{t:?}").contains("s3"));
        assert_eq!(t.scrub("wrong password s3"), "wrong password <redacted>");
        for (bad, says) in [
            ("sentinel = { master = \"\", nodes = [\"redis://a:1\"] }", "sentinel.master is empty"),
            ("sentinel = { master = \"m\", nodes = [] }", "sentinel.nodes is empty"),
            ("sentinel = { master = \"m\", nodes = [\"redis://a:1,b:2\"] }", "one sentinel URL per entry"),
            (
                "cluster = [\"redis://a:1\"]\nsentinel = { master = \"m\", nodes = [\"redis://a:1\"] }",
                "both sentinel and cluster",
            ),
            ("sentinel = { master = \"m\", nodes = [\"redis://a:1\"], mastr = 1 }", "unknown field"),
        ] {
            let err = format!("{:#}", parse(bad).err().unwrap_or_else(|| panic!("{bad} parsed")));
            assert!(err.contains(says), "{bad}: {err}");
        }
    }
}
