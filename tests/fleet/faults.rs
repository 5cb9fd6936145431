//! Faults from outside: a host paused or cut off from Redis, Redis stalled, a host clock step.
//!
//! Real `hourglass run` processes on a private Redis run tasks of the chaos
//! plugin while one fault is injected. Each test prints one line the docs quote,
//! `FAULT <name>: scheduled N, completed N, lost 0, run twice K (held by faulted host H), recovery M ms`,
//! and asserts that no task is lost, each is committed once, and only a task
//! the faulted host held runs twice, its late outcome fenced. Times are
//! reported, never asserted. `HOURGLASS_FAULTS_TASKS` sets N; `tests/faults.sh`
//! runs them all and sums up.
//!
//! The network partition (`partition`), the host clock step (`clock`), a host paused mid-graph (`graph`)
//! and Redis failing over behind Sentinel (`failover`) are child modules.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::{Host, RedisServer, redis_now, stat, wait_for};

mod clock;
mod failover;
mod graph;
mod partition;

const LONG: Duration = Duration::from_secs(120);
const TYPE: &str = "work";
const FENCED: &str = "outcome ignored: the lease had expired and the task was claimed again";

/// Tasks per fault: small by default (each test well under a minute on two busy cores).
fn tasks() -> usize {
    std::env::var("HOURGLASS_FAULTS_TASKS").ok().and_then(|n| n.parse().ok()).filter(|&n| n >= 20).unwrap_or(300)
}

/// A host's config: a 1 s lease so faults outlast it quickly, a run timeout
/// longer than any fault (a paused run resumes rather than times out), and
/// the events stream, whose entry ids are Redis-clock commit times.
fn config(host_id: &str, n: usize) -> String {
    format!(
        "[runner]\nhost_id = \"{host_id}\"\nlease = \"1s\"\n[types.{TYPE}]\nconcurrency = 8\ntimeout = \"60s\"\nevents = true\nevents_maxlen = {}\n",
        (2 * n).max(10_000)
    )
}

fn plugins() -> Vec<(&'static str, PathBuf)> {
    vec![(TYPE, crate::support::test_plugin("chaos"))]
}

/// `w0..w<n>` due now (by Redis's clock), each sleeping `sleep_ms` in the plugin.
fn schedule(conn: &mut redis::Connection, n: usize, sleep_ms: u64) {
    let now = redis_now(conn);
    schedule_at(conn, (0..n).map(|i| (format!("w{i}"), now)), sleep_ms);
}

fn schedule_at(conn: &mut redis::Connection, tasks: impl Iterator<Item = (String, i64)>, sleep_ms: u64) {
    let mut pipe = redis::pipe();
    for (id, due) in tasks {
        pipe.cmd("HSET").arg(crate::support::key(TYPE, "payload")).arg(&id).arg(format!("sleep:{sleep_ms}")).ignore();
        pipe.cmd("ZADD").arg(crate::support::key(TYPE, "due")).arg(due).arg(&id).ignore();
    }
    let _: () = pipe.query(conn).unwrap();
}

/// How long `n` tasks may take: generous, and more for a larger run (one host may do them all).
fn long_for(n: usize) -> Duration {
    LONG + Duration::from_millis(50 * n as u64)
}

/// Tasks still due or leased.
fn left(conn: &mut redis::Connection) -> usize {
    crate::support::zcard(conn, &crate::support::key(TYPE, "due")) + crate::support::leases(conn, TYPE).len()
}

/// Waits until every task ran and nothing is due or leased.
fn wait_all_done(conn: &mut redis::Connection, n: usize) {
    wait_for(&format!("all {n} tasks to succeed"), long_for(n), || {
        (stat(conn, TYPE, "succeeded") >= n as i64 && left(conn) == 0).then_some(())
    });
}

/// Runs per task id: the `succeeded` lines the hosts logged. The handler's
/// success is logged before its outcome is written, so a fenced run counts too.
fn runs(logs: &[&str]) -> HashMap<String, usize> {
    let mut runs = HashMap::new();
    let needle = format!("task_type={TYPE} ");
    for line in logs.iter().flat_map(|l| l.lines()) {
        if line.contains("succeeded") && !line.contains(FENCED) && line.contains(&needle) {
            *runs.entry(task_id(line)).or_default() += 1;
        }
    }
    runs
}

/// Ids whose outcome the host logging `log` wrote too late: fenced.
fn fenced(log: &str) -> HashSet<String> {
    log.lines().filter(|l| l.contains(FENCED)).map(task_id).collect()
}

/// Ids whose runs the host logging `log` stopped because it lost their
/// leases (a renewal found them reaped, or none reached Redis in time): the
/// `ids=a,b,c` of its "… are stopped" lines. Such a run writes no outcome.
fn stopped(log: &str) -> HashSet<String> {
    log.lines()
        .filter(|l| l.contains("their runs are stopped") || l.contains("the runs of these tasks are stopped"))
        .filter_map(|l| l.split(" ids=").nth(1).and_then(|r| r.split(' ').next()))
        .flat_map(|ids| ids.split(',').map(str::to_owned))
        .collect()
}

fn task_id(line: &str) -> String {
    line.split("task_id=").nth(1).and_then(|r| r.split(' ').next()).unwrap_or_default().to_owned()
}

/// The committed successes from the events stream: id → commit times (the
/// entry id's ms, Redis's clock), `started_ms` (the host's clock) and `due_ms`.
struct Commit {
    at_ms: i64,
    started_ms: i64,
    due_ms: i64,
}

fn commits(conn: &mut redis::Connection) -> HashMap<String, Vec<Commit>> {
    let entries: Vec<(String, HashMap<String, String>)> =
        redis::cmd("XRANGE").arg(crate::support::key(TYPE, "events")).arg("-").arg("+").query(conn).unwrap();
    let mut out: HashMap<String, Vec<Commit>> = HashMap::new();
    for (entry, f) in entries.into_iter().filter(|(_, f)| f.get("outcome").map(String::as_str) == Some("succeeded")) {
        let ms = |k: &str| f.get(k).and_then(|v| v.parse().ok()).unwrap_or_default();
        let at_ms = entry.split('-').next().unwrap().parse().unwrap();
        out.entry(f["id"].clone()).or_default().push(Commit {
            at_ms,
            started_ms: ms("started_ms"),
            due_ms: ms("due_ms"),
        });
    }
    out
}

/// What a fault cost, in the docs' words.
struct Report {
    name: String,
    scheduled: usize,
    completed: usize,
    lost: usize,
    twice: usize,
    held: usize,
    /// Runs of tasks held at the fault that their host stopped (no outcome written).
    stopped: usize,
    recovery_ms: i64,
}

impl Report {
    fn print(&self) {
        eprintln!(
            "FAULT {}: scheduled {}, completed {}, lost {}, run twice {} (held by faulted host {}, stopped by it {}), recovery {} ms",
            self.name, self.scheduled, self.completed, self.lost, self.twice, self.held, self.stopped, self.recovery_ms
        );
    }
}

/// Checks the outcome of a fault once all work is done, and reports it.
/// `held`: id → holder at the fault's start, of the faulted hosts only;
/// `logs`: host id → its log. A task ran twice only if a faulted host held it,
/// and that host's late outcome was fenced.
fn check(
    name: &str,
    conn: &mut redis::Connection,
    n: usize,
    held: &HashMap<String, String>,
    logs: &HashMap<&str, String>,
    recovery_ms: i64,
) -> Report {
    let commits = commits(conn);
    let lost: Vec<String> = (0..n).map(|i| format!("w{i}")).filter(|id| !commits.contains_key(id)).collect();
    let runs = runs(&logs.values().map(String::as_str).collect::<Vec<_>>());
    let twice: Vec<(&String, &usize)> = runs.iter().filter(|(_, k)| **k > 1).collect();
    let report = Report {
        name: name.to_owned(),
        scheduled: n,
        completed: commits.len(),
        lost: lost.len(),
        twice: twice.len(),
        held: held.len(),
        stopped: held
            .iter()
            // Listed as stopped, and its handler did not end after all (a run
            // ending as it was stopped keeps its outcome, which is fenced).
            .filter(|(id, holder)| {
                logs.get(holder.as_str())
                    .is_some_and(|l| stopped(l).contains(*id) && !self::runs(&[l]).contains_key(*id))
            })
            .count(),
        recovery_ms,
    };
    report.print();
    assert!(lost.is_empty(), "{name}: {} tasks never committed, e.g. {:?}", lost.len(), &lost[..lost.len().min(10)]);
    assert_eq!(stat(conn, TYPE, "succeeded"), n as i64, "{name}: each task must be committed exactly once");
    let committed_twice: Vec<&String> = commits.iter().filter(|(_, c)| c.len() > 1).map(|(id, _)| id).collect();
    assert!(committed_twice.is_empty(), "{name}: committed more than once: {committed_twice:?}");
    assert_eq!(stat(conn, TYPE, "dead"), 0, "{name}: tasks were dead-lettered");
    for (id, k) in &twice {
        let holder = held.get(*id).unwrap_or_else(|| panic!("{name}: {id} ran {k} times but no faulted host held it"));
        assert!(
            fenced(&logs[holder.as_str()]).contains(*id),
            "{name}: {id} ran {k} times; {holder}'s outcome was not fenced"
        );
    }
    report
}

/// The first commit of a task `held` at the fault, in ms after `t0_ms` (Redis clock).
fn first_commit_after(conn: &mut redis::Connection, held: &HashMap<String, String>, t0_ms: i64) -> i64 {
    let commits = commits(conn);
    held.keys().filter_map(|id| commits.get(id)).flatten().map(|c| c.at_ms - t0_ms).min().unwrap_or(-1)
}

// ---------------------------------------------------------------- a host process of our own

/// An `hourglass run` under a wrapper command (`ip netns exec`) or with extra
/// environment (libfaketime), which `crate::support::Host` does not offer; killed on drop.
struct Wrapped {
    child: Child,
    // Holds the config, plugins and log while the host runs.
    _dir: tempfile::TempDir,
    log: PathBuf,
}

impl Wrapped {
    fn start(url: &str, config: &str, wrapper: &[&str], env: &[(&str, &str)]) -> Wrapped {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("plugins")).unwrap();
        for (task_type, wasm) in plugins() {
            std::fs::copy(wasm, dir.path().join("plugins").join(format!("{task_type}.wasm"))).unwrap();
        }
        let cache = crate::support::workspace_root().join("target/test-plugin-cache");
        let config = config.replacen("[runner]\n", &format!("[runner]\ncache_dir = \"{}\"\n", cache.display()), 1);
        std::fs::write(dir.path().join("runner.toml"), format!("[redis]\nurl = \"{url}\"\n{config}")).unwrap();
        let log = dir.path().join("host.log");
        let (program, pre) = match wrapper {
            [] => (crate::support::hourglass_bin(), Vec::new()),
            [first, rest @ ..] => (
                PathBuf::from(first),
                rest.iter()
                    .map(|s| s.to_string())
                    .chain([crate::support::hourglass_bin().display().to_string()])
                    .collect(),
            ),
        };
        let mut cmd = Command::new(program);
        cmd.args(pre).arg("--config").arg(dir.path().join("runner.toml")).arg("run");
        cmd.env("HOURGLASS_LOG", "info,hourglass=debug").env("NO_COLOR", "1").env_remove("HOURGLASS_REDIS_URL");
        cmd.envs(env.iter().copied());
        let file = std::fs::File::create(&log).unwrap();
        let child = cmd.stdout(Stdio::null()).stderr(file).spawn().expect("start hourglass");
        let mut host = Wrapped { child, _dir: dir, log };
        let deadline = Instant::now() + Duration::from_secs(60);
        while !host.log().contains("hourglass is running") {
            let exited = host.child.try_wait().unwrap();
            assert!(exited.is_none(), "host exited at start ({exited:?}); log:\n{}", host.log());
            assert!(Instant::now() < deadline, "host did not start; log:\n{}", host.log());
            std::thread::sleep(Duration::from_millis(20));
        }
        host
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill").arg(format!("-{signal}")).arg(self.child.id().to_string()).status().unwrap();
        assert!(status.success(), "kill -{signal} failed");
    }

    /// Waits until the kernel shows the process stopped (SIGSTOP is delivered asynchronously).
    fn wait_stopped(&self) {
        let stat = format!("/proc/{}/stat", self.child.id());
        wait_for("the host to stop", LONG, || {
            let s = std::fs::read_to_string(&stat).unwrap_or_default();
            // The state follows the command name in parentheses.
            (s.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('T'))).then_some(())
        });
    }
}

impl Drop for Wrapped {
    fn drop(&mut self) {
        // A stopped process dies of SIGKILL too; no SIGCONT needed.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------- 1 and 2: one host lost for a while

/// h1 and h2 run `n` tasks (`start` schedules them: `w0..w<n>`, each
/// sleeping `run_ms`); while h1 holds leases, `cut` takes it away (SIGSTOP,
/// or its network link down) until h2 has done everything, then `heal` gives
/// it back and its late outcomes must be fenced.
fn lose_h1_for_a_while(
    name: &str,
    redis: &RedisServer,
    h1: &Wrapped,
    cut: &dyn Fn(),
    heal: &dyn Fn(),
    run_ms: u64,
    start: &dyn Fn(&mut redis::Connection, usize, u64),
) -> Report {
    let n = tasks_of(run_ms);
    let h2 = Host::start(redis, &plugins(), &config("h2", n));
    let mut conn = redis.client();
    start(&mut conn, n, run_ms);
    // Cut h1 off while it holds leases, in the thick of the work; try again
    // in the rare case its hands were empty at that moment.
    let (t0_ms, held) = loop {
        wait_for("h1 to hold leases", LONG, || {
            let holds = crate::support::leases(&mut conn, TYPE).values().any(|h| h == "h1");
            (holds && stat(&mut conn, TYPE, "succeeded") >= (n / 10) as i64).then_some(())
        });
        let t0_ms = redis_now(&mut conn);
        cut();
        // What h1 sent before the cut has reached Redis by now.
        std::thread::sleep(Duration::from_millis(200));
        let held: HashMap<String, String> =
            crate::support::leases(&mut conn, TYPE).into_iter().filter(|(_, holder)| holder == "h1").collect();
        if !held.is_empty() {
            break (t0_ms, held);
        }
        heal();
        assert!(stat(&mut conn, TYPE, "succeeded") < n as i64, "h1 never held a lease at the cut");
    };
    // When h1's claims were reaped (its tasks due again), by polling from the cut.
    let mut reaped_ms = None;
    wait_for(&format!("all {n} tasks to succeed"), long_for(n), || {
        if reaped_ms.is_none() && !crate::support::leases(&mut conn, TYPE).values().any(|h| h == "h1") {
            reaped_ms = Some(redis_now(&mut conn) - t0_ms);
        }
        (stat(&mut conn, TYPE, "succeeded") >= n as i64 && left(&mut conn) == 0).then_some(())
    });
    // Recovery: from the cut until the first task h1 held was committed by h2
    // (h1 could not commit anything meanwhile), by Redis's clock.
    let recovery_ms = first_commit_after(&mut conn, &held, t0_ms);
    // A reaped task is due again at its claim's earliest due time, ahead of the tasks that
    // fell due after it: recovery is about the lease plus one run.
    eprintln!("  ({name}: h1's claims reaped after {} ms, by polling)", reaped_ms.unwrap_or(-1));
    heal();
    // Every task h1 held was taken over by h2: h1's late outcome must be
    // fenced, unless h1 stopped the run when it learned the lease was gone.
    // (A run stopped just as its handler ended keeps its outcome: then its
    // success is in the log, and the fence is waited for.)
    wait_for("h1's late outcomes fenced or its runs stopped", LONG, || {
        let log = h1.log();
        let (fenced, stopped, ran) = (fenced(&log), stopped(&log), runs(&[&log]));
        held.keys().all(|id| fenced.contains(id) || (stopped.contains(id) && !ran.contains_key(id))).then_some(())
    });
    let logs = HashMap::from([("h1", h1.log()), ("h2", h2.log())]);
    let fenced_h1 = fenced(&logs["h1"]);
    let stray: Vec<&String> = fenced_h1.iter().filter(|id| !held.contains_key(*id)).collect();
    assert!(stray.is_empty(), "{name}: h1 was fenced on tasks it did not hold at the cut: {stray:?}");
    check(name, &mut conn, n, &held, &logs, recovery_ms)
}

/// The harness's tasks for runs of `run_ms`: runs longer than the lease get
/// fewer tasks, so the test takes about as long.
fn tasks_of(run_ms: u64) -> usize {
    if run_ms > 1000 { 40 } else { tasks() }
}

/// h1 loses its leases by SIGSTOP, and SIGCONT brings it back.
fn pause_h1_for_a_while(name: &str) -> Report {
    let redis = RedisServer::start();
    let h1 = Wrapped::start(&redis.url(), &config("h1", tasks()), &[], &[]);
    let cut = || {
        h1.signal("STOP");
        h1.wait_stopped();
    };
    let heal = || h1.signal("CONT");
    lose_h1_for_a_while(name, &redis, &h1, &cut, &heal, 200, &schedule)
}

#[test]
fn a_host_paused_past_its_lease_loses_nothing_and_its_late_outcomes_are_fenced() {
    pause_h1_for_a_while("host paused (SIGSTOP) past its lease");
}

// ---------------------------------------------------------------- 3: Redis stalled

#[test]
fn redis_stalled_past_the_lease_loses_nothing_and_late_outcomes_are_fenced() {
    const STALL_S: u64 = 3;
    let n = tasks();
    let redis = RedisServer::start_with(&["--enable-debug-command", "local"]);
    let hosts: Vec<Host> = ["h1", "h2"].iter().map(|id| Host::start(&redis, &plugins(), &config(id, n))).collect();
    let mut conn = redis.client();
    schedule(&mut conn, n, 200);
    wait_for("both hosts to hold leases", LONG, || {
        let holders: HashSet<String> = crate::support::leases(&mut conn, TYPE).into_values().collect();
        (holders.len() == 2 && stat(&mut conn, TYPE, "succeeded") >= (n / 10) as i64).then_some(())
    });
    // Redis freezes for longer than the lease; its clock runs on, so every lease
    // held now has expired when it answers again.
    // Redis's clock and every lease (the store's holders script, as
    // crate::support::leases runs it), read at one instant with the stall: in the same MULTI.
    let ((secs, micros), holders, ()): ((i64, i64), redis::Value, ()) = redis::pipe()
        .atomic()
        .cmd("TIME")
        .cmd("EVAL")
        .arg(hourglass::store::holders_source())
        .arg(2)
        .arg(crate::support::key(TYPE, "tokens"))
        .arg(crate::support::key(TYPE, "claimed"))
        .arg(crate::support::ALL_IDS)
        .cmd("DEBUG")
        .arg("SLEEP")
        .arg(STALL_S)
        .query(&mut conn)
        .unwrap();
    let t0_ms = secs * 1000 + micros / 1000;
    let held: HashMap<String, String> = crate::support::lease_map(holders);
    assert!(!held.is_empty(), "nothing was leased at the stall");
    wait_all_done(&mut conn, n);
    // Recovery: from the stall's start until the first task leased at it was
    // committed (by its holder or by a host that claimed it again), Redis's clock.
    let recovery_ms = first_commit_after(&mut conn, &held, t0_ms);
    // A run of a task leased at the stall may still be settling: wait until each
    // task that ran twice shows its fence in its holder's log.
    let logs = || HashMap::from([("h1", hosts[0].log()), ("h2", hosts[1].log())]);
    wait_for("fences of the tasks that ran twice", LONG, || {
        let logs = logs();
        let twice = runs(&logs.values().map(String::as_str).collect::<Vec<_>>());
        twice
            .iter()
            .filter(|(_, k)| **k > 1)
            .all(|(id, _)| held.get(id).is_none_or(|holder| fenced(&logs[holder.as_str()]).contains(id)))
            .then_some(())
    });
    let logs = logs();
    let fences = fenced(&logs["h1"]).len() + fenced(&logs["h2"]).len();
    let stops = stopped(&logs["h1"]).len() + stopped(&logs["h2"]).len();
    eprintln!(
        "  (stall of {STALL_S}s: {} leased at the stall, {fences} late outcomes fenced, {stops} runs stopped)",
        held.len()
    );
    check(&format!("Redis stalled (DEBUG SLEEP {STALL_S}s) past the lease"), &mut conn, n, &held, &logs, recovery_ms);
}
