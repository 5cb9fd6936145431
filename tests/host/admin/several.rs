//! Several hosts on one server: one `runner.toml`, an admin port each (`--admin-listen`), and the systemd unit that runs them.

use std::process::Command;
use std::time::Duration;

use clap::Parser;
use hourglass::cli::{Cli, Command as Sub};

use crate::support::{Host, RedisServer, admin_addr, free_port, get, hourglass_bin, plugin};

#[test]
fn two_hosts_share_one_config_with_an_admin_port_each() {
    let redis = RedisServer::start();
    let port = free_port();
    let config = format!("[admin]\nenabled = true\nlisten = \"127.0.0.1:{port}\"\n");
    let first = Host::start(&redis, &[("noop", plugin("noop"))], &config);
    assert_eq!(admin_addr(&first), format!("127.0.0.1:{port}"));
    // The same file again, as a second systemd instance would read it: the flag's port wins.
    let second = Host::start_with_env(
        &redis,
        &[("noop", plugin("noop"))],
        &config,
        &[("HOURGLASS_ADMIN_LISTEN", "127.0.0.1:0")],
    );
    let second_addr = admin_addr(&second);
    assert_ne!(second_addr, admin_addr(&first));
    for addr in [admin_addr(&first), second_addr.clone()] {
        assert_eq!(get(&addr, "/healthz").status, 200, "{addr}");
    }
    // An edit of the file neither moves the second host's admin server nor
    // reads as a change waiting for a restart.
    std::fs::write(
        second.dir.path().join("runner.toml"),
        std::fs::read_to_string(second.dir.path().join("runner.toml")).unwrap() + "\n[defaults]\nmax_attempts = 4\n",
    )
    .unwrap();
    second.wait_log("runner.toml reloaded", Duration::from_secs(30));
    assert!(!second.log().contains("the change to [admin]"), "{}", second.log());
    assert_eq!(get(&second_addr, "/healthz").status, 200);
    // Without a port of its own, a third host cannot start beside the first: the case the flag is for.
    let out = Command::new(hourglass_bin())
        .arg("--config")
        .arg(first.dir.path().join("runner.toml"))
        .arg("run")
        .env_remove("HOURGLASS_REDIS_URL")
        .env_remove("HOURGLASS_ADMIN_LISTEN")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains(&format!("cannot listen on admin.listen = 127.0.0.1:{port}")), "{err}");
}

#[test]
fn a_bad_admin_listen_is_one_line_naming_the_flag() {
    let run = |value: &str| {
        let out = Command::new(hourglass_bin())
            .args(["--redis", "redis://127.0.0.1:1", "run", "--admin-listen", value])
            .env_remove("HOURGLASS_ADMIN_LISTEN")
            .output()
            .unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).trim_end().to_owned())
    };
    let (code, err) = run("nowhere");
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--admin-listen") && err.contains("nowhere") && !err.contains('\n'), "{err}");
    // Not loopback and no admin.token: refused before anything connects.
    let (code, err) = run("0.0.0.0:9091");
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("--admin-listen") && err.contains("admin.token") && !err.contains('\n'), "{err}");
}

#[test]
fn the_systemd_unit_runs_a_host_whose_admin_port_is_its_instance_name() {
    let unit =
        std::fs::read_to_string(crate::support::workspace_root().join("deploy/systemd/hourglass@.service")).unwrap();
    let value = |key: &str| {
        let prefix = format!("{key}=");
        unit.lines().find_map(|l| l.strip_prefix(&prefix)).unwrap_or_else(|| panic!("no {key}= in the unit"))
    };
    // What systemd runs for `hourglass@9091`, through the binary's own parser.
    let exec = value("ExecStart").replace("%i", "9091");
    let mut words = exec.split_whitespace();
    assert!(words.next().unwrap().ends_with("/hourglass"));
    let cli = Cli::try_parse_from(std::iter::once("hourglass").chain(words)).expect("the unit's command line parses");
    assert_eq!(cli.config.as_deref(), Some(std::path::Path::new("/etc/hourglass/runner.toml")));
    match cli.command {
        Sub::Run(args) => assert_eq!(args.admin_listen, Some("127.0.0.1:9091".parse().unwrap())),
        other => panic!("the unit runs {other:?}, not `run`"),
    }
    let (name, format) = value("Environment").split_once('=').unwrap();
    assert_eq!(name, "HOURGLASS_LOG_FORMAT");
    assert!(["text", "json", "auto"].contains(&format), "{format}");
    assert_eq!(value("KillSignal"), "SIGTERM");
}
