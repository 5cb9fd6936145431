//! TLS: `rediss://` with a private CA file, an untrusted certificate named in the error,
//! and a Redis Cluster over TLS.

use std::process::Command;

use super::cluster::{Cluster, free_port_pair, spread_types};
use super::{LONG, hourglass, runs, zadd_now};
use crate::support::{Host, RedisServer, now_ms, plugin, stat, wait_for};
use redis::Commands;

/// A private CA and a server certificate it signed for `localhost` / 127.0.0.1, made with openssl.
pub(super) struct Certs {
    dir: tempfile::TempDir,
}

impl Certs {
    fn make() -> Certs {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let openssl = |args: &[&str]| {
            let out = Command::new("openssl").args(args).current_dir(d).output().expect("openssl");
            assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        };
        openssl(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=hourglass-test-ca",
        ]);
        openssl(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "srv.key",
            "-out",
            "srv.csr",
            "-subj",
            "/CN=localhost",
        ]);
        std::fs::write(d.join("ext"), "subjectAltName=DNS:localhost,IP:127.0.0.1\n").unwrap();
        openssl(&[
            "x509",
            "-req",
            "-in",
            "srv.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "srv.pem",
            "-days",
            "2",
            "-extfile",
            "ext",
        ]);
        Certs { dir }
    }

    fn path(&self, file: &str) -> String {
        self.dir.path().join(file).to_str().unwrap().to_owned()
    }

    /// The CA's PEM, for `[redis] ca_file` and `redis-cli --cacert`.
    pub(super) fn ca(&self) -> String {
        self.path("ca.pem")
    }

    /// `redis-server` arguments serving TLS with the server certificate (clients need no certificate).
    pub(super) fn server_args(&self) -> Vec<String> {
        let mut args =
            vec!["--tls-cert-file".to_owned(), self.path("srv.pem"), "--tls-key-file".to_owned(), self.path("srv.key")];
        args.extend(["--tls-ca-cert-file".to_owned(), self.ca(), "--tls-auth-clients".to_owned(), "no".to_owned()]);
        args
    }
}

/// A redis-server with TLS on a free loopback port (and its plain unix socket, for the test); its `rediss://` URL.
fn tls_server(certs: &Certs) -> (RedisServer, String) {
    let port = free_port_pair().to_string();
    let mut args = vec!["--tls-port".to_owned(), port.clone(), "--bind".to_owned(), "127.0.0.1".to_owned()];
    args.extend(certs.server_args());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    (RedisServer::start_with(&args), format!("rediss://127.0.0.1:{port}"))
}

#[test]
fn rediss_with_a_private_ca_file() {
    let certs = Certs::make();
    let (redis, url) = tls_server(&certs);
    let host = Host::start_at(&url, &[("noop", plugin("noop"))], &format!("ca_file = \"{}\"\n[runner]\n", certs.ca()));
    let mut conn = redis.client();
    zadd_now(&mut conn, "noop", "over-tls");
    wait_for("the task, claimed over TLS", LONG, || (stat(&mut conn, "noop", "succeeded") == 1).then_some(()));
    assert_eq!(host.runs_of(&host.log(), "noop", "over-tls"), 1);
}

/// A one-line connect error that names the refused certificate, not a timeout, and no credentials.
fn assert_certificate_error(ok: bool, stderr: &str, shown: &str) {
    assert!(!ok, "connected without trusting the CA: {stderr}");
    // The cluster client logs a warning per seed before the error itself.
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "not one error line: {stderr}");
    let err = errors[0];
    assert!(err.contains("cannot connect to Redis at") && err.contains(shown), "{err}");
    assert!(err.contains("certificate") && err.contains("UnknownIssuer"), "the cause is not named: {err}");
    assert!(!err.contains("no answer") && !err.contains("timed out"), "{err}");
    assert!(!stderr.contains("secret-pw"), "the password was printed: {stderr}");
}

#[test]
fn rediss_with_an_untrusted_certificate_fails_naming_the_certificate() {
    let certs = Certs::make();
    let (_redis, url) = tls_server(&certs);
    // No ca_file: the system's roots do not know the private CA.
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("runner.toml");
    let with_password = url.replace("rediss://", "rediss://user:secret-pw@");
    std::fs::write(
        &config,
        format!("[redis]\nurl = \"{with_password}\"\n[runner]\nplugins_dir = \"{}\"\n", dir.path().display()),
    )
    .unwrap();
    let (ok, _, err) = hourglass(&config, &["stats"], &[]);
    assert_certificate_error(ok, &err, &url);
    let (ok, _, err) = hourglass(&config, &["run"], &[]);
    assert_certificate_error(ok, &err, &url);
}

#[test]
fn cluster_over_tls_with_a_private_ca_file() {
    let certs = Certs::make();
    let cluster = Cluster::start_with(3, 0, Some(&certs));
    let types = spread_types(&cluster);
    let plugins: Vec<(&str, std::path::PathBuf)> = types.iter().map(|t| (t.as_str(), plugin("noop"))).collect();
    let url = cluster.url();
    assert!(url.starts_with("rediss+cluster://"), "{url}");
    let host = Host::start_at(&url, &plugins, &format!("ca_file = \"{}\"\n[runner]\nhost_id = \"tls1\"\n", certs.ca()));
    host.wait_log("keyspace notifications on every cluster master", LONG);
    let now = now_ms();
    let mut conns: Vec<(String, redis::Connection)> = Vec::new();
    for t in &types {
        let mut conn = cluster.node_conn(cluster.master_of(&format!("hourglass:{{{t}}}:due")));
        for i in 0..100 {
            let _: () = conn.zadd(format!("hourglass:{{{t}}}:due"), format!("{t}-{i}"), now + i64::from(i)).unwrap();
        }
        conns.push((t.clone(), conn));
    }
    for (t, conn) in &mut conns {
        wait_for("every task of the type, over TLS", LONG, || (stat(conn, t, "succeeded") == 100).then_some(()));
    }
    for t in &types {
        let runs = runs(&[&host], t);
        assert_eq!(runs.len(), 100);
        assert!(runs.values().all(|&n| n == 1), "a {t} task ran twice");
    }
    // `[redis] cluster` lists rediss:// seeds as well; the CLI reaches every master over TLS.
    let dir = tempfile::tempdir().unwrap();
    let seeds: Vec<String> = url["rediss+cluster://".len()..].split(',').map(|s| format!("\"rediss://{s}\"")).collect();
    let listed = dir.path().join("listed.toml");
    std::fs::write(&listed, format!("[redis]\ncluster = [{}]\nca_file = \"{}\"\n", seeds.join(", "), certs.ca()))
        .unwrap();
    let (ok, out, err) = hourglass(&listed, &["stats"], &[]);
    assert!(ok, "{err}");
    for t in &types {
        assert!(out.contains(t.as_str()), "{t} missing from stats:\n{out}");
    }
    // Without the CA, the refused certificate is named, not a timeout.
    let untrusted = dir.path().join("untrusted.toml");
    std::fs::write(&untrusted, format!("[redis]\nurl = \"{url}\"\n")).unwrap();
    let (ok, _, err) = hourglass(&untrusted, &["stats"], &[]);
    assert_certificate_error(ok, &err, url["rediss+cluster://".len()..].split(',').next().unwrap());
}
