//! A host cut off from Redis by a network partition (a veth pair in a network namespace taken down).

use std::process::Command;

use super::{Report, Wrapped, config, lose_h1_for_a_while, pause_h1_for_a_while, tasks_of};
use crate::support::RedisServer;

/// A network namespace with a veth pair to the root namespace, removed on drop.
pub(super) struct Netns {
    pub(super) ns: String,
    root_if: String,
    /// The root namespace's end of the pair.
    pub(super) root_addr: String,
    /// The namespace's end.
    pub(super) ns_addr: String,
}

impl Netns {
    fn ip(args: &[&str]) -> Result<(), String> {
        let out = Command::new("ip").args(args).output().map_err(|e| format!("cannot run ip: {e}"))?;
        match out.status.success() {
            true => Ok(()),
            false => Err(format!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim())),
        }
    }

    /// Names and a /30 of 10.213.0.0/16 unique to this call: tests of one
    /// process run in parallel, and a failed create removes what it named.
    pub(super) fn create() -> Result<Netns, String> {
        static CREATING: std::sync::Mutex<u32> = std::sync::Mutex::new(0);
        let mut made = CREATING.lock().unwrap_or_else(|p| p.into_inner());
        *made += 1;
        let (pid, k) = (std::process::id(), *made);
        let used = Command::new("ip").args(["-o", "-4", "addr"]).output().map_err(|e| format!("cannot run ip: {e}"))?;
        let used = String::from_utf8_lossy(&used.stdout).into_owned();
        let subnet = (0..250u32)
            .map(|k| (pid + k) % 250)
            .find(|k| !used.contains(&format!("10.213.{k}.")))
            .ok_or("no free 10.213.x.0/30")?;
        // Interface names have 15 bytes at most: "hg", 7 digits, "x", the call, "r".
        let net = Netns {
            ns: format!("hgfaults-{pid}-{k}"),
            root_if: format!("hg{pid}x{k}r"),
            root_addr: format!("10.213.{subnet}.1"),
            ns_addr: format!("10.213.{subnet}.2"),
        };
        let ns_if = format!("hg{pid}x{k}n");
        let ns_addr = format!("{}/30", net.ns_addr);
        Netns::ip(&["netns", "add", &net.ns])?;
        // From here on, drop removes what was made, also when a step fails.
        Netns::ip(&["link", "add", &net.root_if, "type", "veth", "peer", "name", &ns_if])?;
        Netns::ip(&["link", "set", &ns_if, "netns", &net.ns])?;
        Netns::ip(&["addr", "add", &format!("{}/30", net.root_addr), "dev", &net.root_if])?;
        Netns::ip(&["link", "set", &net.root_if, "up"])?;
        Netns::ip(&["netns", "exec", &net.ns, "ip", "addr", "add", &ns_addr, "dev", &ns_if])?;
        Netns::ip(&["netns", "exec", &net.ns, "ip", "link", "set", &ns_if, "up"])?;
        Ok(net)
    }

    pub(super) fn link(&self, state: &str) {
        Netns::ip(&["link", "set", &self.root_if, state]).unwrap();
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Netns::ip(&["link", "del", &self.root_if]);
        let _ = Netns::ip(&["netns", "del", &self.ns]);
    }
}

#[test]
fn a_host_cut_off_from_redis_loses_nothing_and_its_late_outcomes_are_fenced() {
    let name = "host cut off from Redis (network partition)";
    if partition_h1_for_a_while(name, 200).is_none() {
        // No network namespaces (not root?): the same fault by SIGSTOP, said out loud.
        pause_h1_for_a_while(&format!("{name} (fallback: SIGSTOP)"));
    }
}

/// Runs longer than the lease (3 s against 1 s): h1, cut off, cannot renew,
/// so it stops its runs a sixth of the lease before their leases run out,
/// and h2 runs those tasks once: what a handler would have done after the
/// stop does not happen twice. Runs that ended before the stop are fenced.
#[test]
fn a_host_cut_off_from_redis_stops_its_runs_before_their_leases_run_out() {
    // A paused host can stop nothing, so SIGSTOP is no stand-in here.
    let Some(report) = partition_h1_for_a_while("host cut off from Redis, runs of 3 s (network partition)", 3000)
    else {
        eprintln!("SKIPPED: no network namespaces here, so no partition to stop runs in");
        return;
    };
    assert!(report.stopped > 0, "h1 stopped none of the {} runs it held at the cut", report.held);
}

/// h1 reaches Redis only over a veth pair that `cut` takes down; `None`
/// (said out loud) where network namespaces cannot be made (not root?).
fn partition_h1_for_a_while(name: &str, run_ms: u64) -> Option<Report> {
    let net = match Netns::create() {
        Ok(net) => net,
        Err(why) => {
            // No network namespaces (not root?): the same fault by SIGSTOP, said out loud.
            eprintln!("no network partition possible ({why})");
            return None;
        }
    };
    // Redis listens on the root side of the veth pair (h1's only way to it) and
    // on its unix socket (h2's).
    let port = std::net::TcpListener::bind((net.root_addr.as_str(), 0)).unwrap().local_addr().unwrap().port();
    let redis =
        RedisServer::start_with(&["--port", &port.to_string(), "--bind", &net.root_addr, "--protected-mode", "no"]);
    let url = format!("redis://{}:{port}", net.root_addr);
    let h1 = Wrapped::start(&url, &config("h1", tasks_of(run_ms)), &["ip", "netns", "exec", &net.ns], &[]);
    let cut = || net.link("down");
    let heal = || net.link("up");
    Some(lose_h1_for_a_while(name, &redis, &h1, &cut, &heal, run_ms, &super::schedule))
}
