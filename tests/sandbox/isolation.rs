//! Nothing one task leaves in its instance reaches the next: probes of every kind of state, written as an attacker would.
//!
//! A fresh state per task is the sandbox's promise (docs/sandbox.md,
//! "Isolation"), whether the instance is new (`instance_reset = false`) or
//! a kept one reset to its checkpoint (the default). Each probe first
//! *plants* something (a secret in memory, a mutable global, a funcref in a
//! table, grown memory and tables, dropped segments, an open host resource,
//! a partial output line, follow-ups) and then *peeks* from a later task, in
//! both modes. Every probe is also run where the state is meant to survive
//! (one instance kept with `instance_reuse`), to show that the peek would
//! see it: a probe that cannot fail proves nothing.
//!
//! The swap test pushes the host's memory to swap while a handler holds a
//! secret (issue 50): a dirty page that is swapped out must be reset like
//! one in memory.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::runtime::{chaos, runtime};
use crate::support::{Host, RedisServer, RunNow, capture_logs, now_ms, plugin, stat, test_plugin, wait_for};
use bytesize::ByteSize;
use hourglass::config::TypePolicy;
use hourglass::runtime::{Component, Failure, Handler, TaskRun};
use hourglass::task::ClaimedTask;
use redis::Commands;

/// Where a probe's runs get their instance (javascript.rs's probes use them too).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// The default: one kept instance, reset after each task to its checkpoint,
    /// taken after a warm-up call.
    Reset,
    /// Reset to a checkpoint taken right after instantiation (`instance_warm_up = false`).
    ResetCold,
    /// A new instance for every task (`instance_reset = false`).
    Fresh,
    /// One instance kept as it is for up to 8 tasks (`instance_reuse = 8`): the control.
    Reuse,
}

/// The modes that promise a fresh state.
pub(crate) const ISOLATED: [Mode; 3] = [Mode::Reset, Mode::ResetCold, Mode::Fresh];

/// A handler of `component` with a 5 s deadline, in `mode`.
fn handler(component: Component, mode: Mode) -> Handler {
    handler_with(component, mode, Duration::from_secs(5))
}

fn handler_with(component: Component, mode: Mode, timeout: Duration) -> Handler {
    let policy = TypePolicy {
        timeout,
        memory_limit: ByteSize::mib(64),
        instance_reuse: if mode == Mode::Reuse { 8 } else { 0 },
        instance_reset: matches!(mode, Mode::Reset | Mode::ResetCold),
        instance_warm_up: mode != Mode::ResetCold,
        may_schedule: vec!["noop".parse().unwrap()],
        ..TypePolicy::default()
    };
    Handler::new(component, "probe", &policy.sandbox(), Arc::new(BTreeMap::new()))
}

fn task(payload: &str) -> ClaimedTask {
    ClaimedTask {
        task_type: "probe".parse().unwrap(),
        id: b"p-1".to_vec(),
        payload: payload.as_bytes().to_vec(),
        attempt: 1,
        due_ms: 1_700_000_000_000,
        token: 1,
        claim: 1,
    }
}

// --- globals, tables and data pages: a component written by hand -----------

/// What the hand-written probe's peek found, as bits of its `retry-after` value.
const GLOBAL: u64 = 1;
const TABLE: u64 = 2;
const DATA_PAGE: u64 = 4;
const MEMORY: u64 = 8;
const GROWN: u64 = 16;

/// A component whose `handle` reads its payload's first byte: `s` plants a
/// mutable global, a funcref (`table.set`), a byte of its data segment and
/// a word of memory, grows its memory and table by one, and drops its
/// passive data and element segments; `t` plants them and traps; `l` plants
/// them and loops until stopped; `p` peeks and fails with
/// `retry-after(bits)` naming what it found (see [`GLOBAL`] ...), or
/// succeeds when everything is as built; `d` copies from both passive
/// segments, which traps once they were dropped.
/// Rust does not emit `table.set` or mutable globals of its own, so this one
/// is WebAssembly text.
fn state_probe() -> Component {
    static C: OnceLock<Component> = OnceLock::new();
    C.get_or_init(|| {
        let wasm = wat::parse_str(STATE_PROBE_WAT).expect("the probe's text parses");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state-probe.wasm");
        std::fs::write(&path, &wasm).unwrap();
        runtime().load(&path).expect("load the state probe")
    })
    .clone()
}

const STATE_PROBE_WAT: &str = r#"
(component
  (core module $m
    (memory (export "memory") 1)
    (global $planted (mut i64) (i64.const 0))
    (global $heap (mut i32) (i32.const 8192))
    (table $t 1 funcref)
    (func $plant_me (result i32) (i32.const 7))
    (elem declare func $plant_me)
    (elem $passive_elem func $plant_me)
    (data (i32.const 1024) "DATA-AS-BUILT")
    (data $passive_data "PASSIVE")
    (func (export "cabi_realloc") (param i32 i32 i32 i32) (result i32)
      (local $p i32)
      ;; a bump allocator: the host lowers the task's lists and strings here
      (local.set $p (i32.and (i32.add (global.get $heap) (i32.sub (local.get 2) (i32.const 1)))
                             (i32.sub (i32.const 0) (local.get 2))))
      (global.set $heap (i32.add (local.get $p) (local.get 3)))
      (local.get $p))
    (func $plant
      (global.set $planted (i64.const 42))
      (table.set $t (i32.const 0) (ref.func $plant_me))
      (i32.store8 (i32.const 1024) (i32.const 0x53))
      (i64.store (i32.const 4096) (i64.const 0x5445524345532121))
      (drop (memory.grow (i32.const 1)))
      (i64.store (i32.const 65536) (i64.const 0x5445524345532121))
      (drop (table.grow $t (ref.func $plant_me) (i32.const 1)))
      (data.drop $passive_data)
      (elem.drop $passive_elem))
    ;; handle(id, task-type, payload, attempt, due-ms) -> pointer to result<_, failure>
    (func (export "handle") (param i32 i32 i32 i32 i32 i32 i32 i64) (result i32)
      (local $cmd i32) (local $found i64)
      (if (local.get 5) (then (local.set $cmd (i32.load8_u (local.get 4)))))
      (if (i32.eq (local.get $cmd) (i32.const 0x73)) (then (call $plant)))
      (if (i32.eq (local.get $cmd) (i32.const 0x74)) (then (call $plant) (unreachable)))
      (if (i32.eq (local.get $cmd) (i32.const 0x6c)) (then (call $plant) (loop $spin (br $spin))))
      (if (i32.eq (local.get $cmd) (i32.const 0x64))
        (then
          (memory.init $passive_data (i32.const 2048) (i32.const 0) (i32.const 7))
          (table.init $t $passive_elem (i32.const 0) (i32.const 0) (i32.const 1))))
      (if (i32.eq (local.get $cmd) (i32.const 0x70))
        (then
          (if (i64.ne (global.get $planted) (i64.const 0))
            (then (local.set $found (i64.or (local.get $found) (i64.const 1)))))
          (if (i32.eqz (ref.is_null (table.get $t (i32.const 0))))
            (then (local.set $found (i64.or (local.get $found) (i64.const 2)))))
          (if (i32.ne (i32.load8_u (i32.const 1024)) (i32.const 0x44))
            (then (local.set $found (i64.or (local.get $found) (i64.const 4)))))
          (if (i64.ne (i64.load (i32.const 4096)) (i64.const 0))
            (then (local.set $found (i64.or (local.get $found) (i64.const 8)))))
          (if (i32.or (i32.ne (memory.size) (i32.const 1)) (i32.ne (table.size $t) (i32.const 1)))
            (then (local.set $found (i64.or (local.get $found) (i64.const 16)))))))
      ;; result<_, failure> at 256: tag, then failure's tag at 264 and its u64 at 272
      (if (i64.eqz (local.get $found))
        (then (i32.store8 (i32.const 256) (i32.const 0)))
        (else
          (i32.store8 (i32.const 256) (i32.const 1))
          (i32.store8 (i32.const 264) (i32.const 0))
          (i64.store (i32.const 272) (local.get $found))))
      (i32.const 256)))
  (core instance $i (instantiate $m))
  (type $task' (record (field "id" (list u8)) (field "task-type" string) (field "payload" (list u8))
                       (field "attempt" u32) (field "due-ms" u64)))
  (export $task "task" (type $task'))
  (type $failure' (variant (case "retry-after" u64) (case "permanent" string) (case "error" string)))
  (export $failure "failure" (type $failure'))
  (func $handle (param "task" $task) (result (result (error $failure)))
    (canon lift (core func $i "handle") (memory (core memory $i "memory")) (realloc (core func $i "cabi_realloc"))))
  (export "handle" (func $handle)))
"#;

/// What a peek of the state probe found: 0 when the instance was as built.
fn found(run: &TaskRun) -> u64 {
    match &run.result {
        Ok(()) => 0,
        Err(Failure::RetryAfter(bits)) => bits.as_millis() as u64,
        other => panic!("the peek did not run: {other:?}"),
    }
}

#[test]
fn globals_tables_and_data_pages_start_as_built_in_every_instance() {
    for mode in ISOLATED {
        let h = handler(state_probe(), mode);
        assert_eq!(h.run_now(&task("s")).result, Ok(()));
        assert_eq!(found(&h.run_now(&task("p"))), 0, "{mode:?}: an instance saw what the last task planted");
        assert_eq!(h.run_now(&task("s")).result, Ok(()));
        assert_eq!(h.run_now(&task("d")).result, Ok(()), "{mode:?}: an instance saw the last task's segment drops");
        // Many slots and many plants: whichever instance the next task gets.
        for _ in 0..20 {
            assert_eq!(h.run_now(&task("s")).result, Ok(()));
        }
        for _ in 0..20 {
            assert_eq!(found(&h.run_now(&task("p"))), 0, "{mode:?}");
        }
    }

    // The peek sees all of it where state is kept on purpose (`instance_reuse`).
    let kept = handler(state_probe(), Mode::Reuse);
    assert_eq!(kept.run_now(&task("s")).result, Ok(()));
    assert_eq!(found(&kept.run_now(&task("p"))), GLOBAL | TABLE | DATA_PAGE | MEMORY | GROWN);
    // (The peek's failure discarded that instance: plant again for the segment check.)
    assert_eq!(kept.run_now(&task("s")).result, Ok(()));
    assert!(kept.run_now(&task("d")).result.is_err(), "the copy from dropped segments did not trap");
}

#[test]
fn a_trap_a_timeout_or_a_cancel_drops_a_kept_instance() {
    for mode in [Mode::Reset, Mode::Reuse] {
        let kept = handler(state_probe(), mode);
        // A trap.
        let trapped = kept.run_now(&task("t"));
        assert!(matches!(trapped.result, Err(Failure::Error(_))), "{trapped:?}");
        assert_eq!(found(&kept.run_now(&task("p"))), 0, "{mode:?}: a kept instance outlived its trap");

        // A timeout: the deadline stops the loop.
        let short = handler_with(state_probe(), mode, Duration::from_millis(300));
        let timed_out = short.run_now(&task("l"));
        assert!(
            matches!(&timed_out.result, Err(Failure::Error(e)) if e.contains("deadline") || e.contains("timed out")),
            "{timed_out:?}"
        );
        assert_eq!(found(&short.run_now(&task("p"))), 0, "{mode:?}: a kept instance outlived its timeout");

        // A cancel: the run's future is dropped while the guest spins.
        let rt = crate::support::tokio_runtime();
        let cancelled = rt.block_on(async {
            tokio::time::timeout(Duration::from_millis(200), kept.run(&task("l"), Default::default())).await
        });
        assert!(cancelled.is_err(), "the spinning run ended by itself");
        assert_eq!(found(&kept.run_now(&task("p"))), 0, "{mode:?}: a kept instance outlived its cancel");
    }

    // And a success does keep a reused instance: the probe would have seen a survivor.
    let kept = handler(state_probe(), Mode::Reuse);
    assert_eq!(kept.run_now(&task("s")).result, Ok(()));
    assert_ne!(found(&kept.run_now(&task("p"))), 0);
}

#[test]
fn a_plugin_whose_instances_cannot_be_reset_gets_a_new_instance_per_task() {
    // A global holding a GC reference is what a checkpoint refuses to record.
    let wat = STATE_PROBE_WAT.replace(
        "(global $planted (mut i64) (i64.const 0))",
        "(global $planted (mut i64) (i64.const 0)) (global $gc (mut externref) (ref.null extern))",
    );
    let wasm = wat::parse_str(&wat).expect("the probe's text parses");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gc-probe.wasm");
    std::fs::write(&path, &wasm).unwrap();
    let component = runtime().load(&path).expect("load the probe");
    let h = handler(component.clone(), Mode::Reset);
    for _ in 0..3 {
        assert_eq!(h.run_now(&task("s")).result, Ok(()));
        assert_eq!(found(&h.run_now(&task("p"))), 0);
    }
    let why = component.reset_refused().expect("the checkpoint was refused");
    assert!(why.contains("GC"), "{why}");
}

#[test]
fn a_hot_reload_starts_from_the_new_plugin_as_built() {
    // A reload swaps the component; the old one's planted state must not show.
    for mode in [Mode::Reset, Mode::Reuse] {
        let old = handler(state_probe(), mode);
        assert_eq!(old.run_now(&task("s")).result, Ok(()));
        let reloaded = {
            let wasm = wat::parse_str(STATE_PROBE_WAT).unwrap();
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("state-probe-v2.wasm");
            std::fs::write(&path, &wasm).unwrap();
            handler(runtime().load(&path).unwrap(), mode)
        };
        assert_eq!(found(&reloaded.run_now(&task("p"))), 0);
    }
}

// --- memory, WASI and host resources: the chaos plugin ---------------------

/// A chaos run's error text; panics on any other outcome.
fn error_text(run: &TaskRun) -> String {
    match &run.result {
        Err(Failure::Error(text)) => text.clone(),
        other => panic!("expected an error, got {other:?}"),
    }
}

#[test]
fn linear_memory_heap_bss_and_data_start_clean_in_every_instance() {
    for mode in ISOLATED {
        let h = handler(chaos(), mode);
        for round in 0..10 {
            assert_eq!(h.run_now(&task(&format!("stash:round{round}:0"))).result, Ok(()));
            let peek = h.run_now(&task("peek"));
            assert_eq!(peek.result, Ok(()), "{mode:?}, round {round}: an instance read an earlier task's memory");
        }
    }
    let kept = handler(chaos(), Mode::Reuse);
    assert_eq!(kept.run_now(&task("stash:kept:0")).result, Ok(()));
    match kept.run_now(&task("peek")).result {
        Err(Failure::Permanent(found)) => assert!(found.contains("SECRET-OF-TASK-kept"), "{found}"),
        other => panic!("the peek missed a stash in a kept instance: {other:?}"),
    }
}

#[test]
fn wasi_state_env_output_and_random_start_fresh() {
    for mode in ISOLATED {
        let h = handler(chaos(), mode);
        // Env and preopens are the host's to give, and it gives none, whatever ran before.
        assert_eq!(h.run_now(&task("stash:env:0")).result, Ok(()));
        assert_eq!(error_text(&h.run_now(&task("env"))), "env: vars=0 path=false args=0");
        assert!(error_text(&h.run_now(&task("readfile"))).starts_with("readfile failed"));

        // An unfinished output line is the task's own: the next task's lines never carry it.
        let (first, first_logs) = capture_logs(|| h.run_now(&task("stdout-partial:A1")));
        assert_eq!(first.result, Ok(()));
        assert!(first_logs.contains("PARTIAL-A1") && first_logs.contains("PARTIAL-ERR-A1"), "{first_logs}");
        let (second, second_logs) = capture_logs(|| h.run_now(&task("stdout")));
        assert_eq!(second.result, Ok(()));
        assert!(second_logs.contains("hello from stdout"), "{second_logs}");
        assert!(
            !second_logs.contains("PARTIAL"),
            "{mode:?}: an earlier task's output reached a later one:\n{second_logs}"
        );

        // Random state: each task's instance draws its own hash keys.
        let seeds: std::collections::HashSet<String> =
            (0..4).map(|_| error_text(&h.run_now(&task("hash-seed")))).collect();
        assert_eq!(seeds.len(), 4, "{mode:?}: tasks shared random state: {seeds:?}");
    }
}

#[test]
fn host_resources_and_followups_end_with_their_task() {
    for mode in ISOLATED {
        let h = handler(chaos(), mode);
        // 16 header fields left open, then a forged handle in the next task.
        assert!(error_text(&h.run_now(&task("fields:16:10"))).starts_with("fields: kept 16"));
        let text = error_text(&h.run_now(&task("handles:1")));
        assert!(
            text.contains("unknown handle index 1"),
            "{mode:?}: a later task used an earlier task's resource: {text}"
        );

        // Outgoing requests with their bodies half written, left open: the same.
        // (Its own drops trap at the end, with the resources still open: it fails either way.)
        assert!(h.run_now(&task("bodies:4")).result.is_err());
        let text = error_text(&h.run_now(&task("handles:1")));
        assert!(
            text.contains("unknown handle index 1"),
            "{mode:?}: a later task used an earlier task's request: {text}"
        );

        // A run that returns with resources still open: the next task cannot name them.
        assert_eq!(h.run_now(&task("leak-fields:2")).result, Ok(()));
        let text = error_text(&h.run_now(&task("handles:1")));
        assert!(text.contains("unknown handle index 1"), "{mode:?}: a later task used a leaked resource: {text}");

        // Follow-ups buffered by a failed run are gone; the next run starts with none.
        assert!(h.run_now(&task("schedule-then-fail")).followups.is_empty());
        let next = h.run_now(&task("ok"));
        assert_eq!(next.result, Ok(()));
        assert!(next.followups.is_empty() && next.groups.is_empty());
    }

    // The probe sees a handle where one is kept on purpose (`instance_reuse`).
    let kept = handler(chaos(), Mode::Reuse);
    assert_eq!(kept.run_now(&task("leak-fields:2")).result, Ok(()));
    let text = error_text(&kept.run_now(&task("handles:1")));
    assert!(text.contains("is alive"), "the forged handle missed a kept resource: {text}");
}

// --- swap: issue 50 ---------------------------------------------------------

/// Rounds of a stash held through a page-out, then peeks in both types.
const SWAP_ROUNDS: usize = 6;
const PEEKS_PER_TYPE: usize = 5;
/// How long a stash holds its instance: the page-out happens meanwhile.
const HOLD_MS: u64 = 1500;

#[test]
fn no_later_task_reads_an_earlier_tasks_memory_after_it_was_swapped_out() {
    if !is_root() {
        eprintln!("skipped: needs root to enable swap and page another process out (process_madvise)");
        return;
    }
    let _swap = SwapFile::ensure();
    let redis = RedisServer::start();
    let chaos = test_plugin("chaos");
    // Two types served by one plugin file, and an ordinary stream beside them; the shipped defaults otherwise.
    let host = Host::start(&redis, &[("vault.a", chaos.clone()), ("vault.b", chaos), ("noop", plugin("noop"))], "");
    let mut conn = redis.client();
    let noops = 400;
    let mut pipe = redis::pipe();
    let now = now_ms();
    for i in 0..noops {
        pipe.zadd("hourglass:{noop}:due", format!("n{i}"), now + i * 40).ignore();
    }
    let _: () = pipe.query(&mut conn).unwrap();

    let mut swapped_kib = 0;
    for round in 0..SWAP_ROUNDS {
        let stash_type = if round % 2 == 0 { "vault.a" } else { "vault.b" };
        let id = format!("stash-{round}");
        schedule(&mut conn, stash_type, &id, &format!("stash:{round}:{HOLD_MS}"));
        wait_for("the stash to hold its instance", Duration::from_secs(30), || {
            crate::support::leases(&mut conn, stash_type).contains_key(&id).then_some(())
        });
        std::thread::sleep(Duration::from_millis(200));
        page_out(host.pid());
        swapped_kib = swapped_kib.max(host.proc_status("VmSwap:"));
        wait_for("the stash to end", Duration::from_secs(30), || ended(&mut conn, stash_type, &id).then_some(()));
        for t in ["vault.a", "vault.b"] {
            for p in 0..PEEKS_PER_TYPE {
                schedule(&mut conn, t, &format!("peek-{round}-{p}"), "peek");
            }
        }
        wait_for("every peek to end", Duration::from_secs(60), || {
            let all = ["vault.a", "vault.b"]
                .iter()
                .all(|t| (0..PEEKS_PER_TYPE).all(|p| ended(&mut conn, t, &format!("peek-{round}-{p}"))));
            all.then_some(())
        });
    }
    assert!(swapped_kib >= 1024, "the page-outs moved only {swapped_kib} KiB to swap: the test proved nothing");

    let mut remnants = Vec::new();
    for t in ["vault.a", "vault.b"] {
        let errors: BTreeMap<String, String> = conn.hgetall(format!("hourglass:{{{t}}}:errors")).unwrap();
        remnants.extend(
            errors.into_iter().filter(|(id, _)| id.starts_with("peek-")).map(|(id, e)| format!("{t} {id}: {e}")),
        );
    }
    assert!(remnants.is_empty(), "later tasks read an earlier task's memory:\n{}", remnants.join("\n"));
    let peeks = stat(&mut conn, "vault.a", "succeeded") + stat(&mut conn, "vault.b", "succeeded");
    assert_eq!(peeks as usize, SWAP_ROUNDS * (1 + 2 * PEEKS_PER_TYPE), "every stash and peek succeeds");
    wait_for("the ordinary stream", Duration::from_secs(60), || {
        (stat(&mut conn, "noop", "succeeded") == noops).then_some(())
    });
    assert_eq!(stat(&mut conn, "noop", "failed"), 0);
    assert!(host.log().contains("instance memory reset"), "the host did not say which reset it uses");
}

/// Whether task `id` of `task_type` is neither waiting nor running.
fn ended(conn: &mut redis::Connection, task_type: &str, id: &str) -> bool {
    let waiting: Option<f64> = conn.zscore(format!("hourglass:{{{task_type}}}:due"), id).unwrap();
    waiting.is_none() && !crate::support::leases(conn, task_type).contains_key(id)
}

fn schedule(conn: &mut redis::Connection, task_type: &str, id: &str, payload: &str) {
    crate::support::schedule_now(conn, task_type, id, payload);
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("Uid:")).map(|l| l.split_whitespace().nth(1) == Some("0")))
        .unwrap_or(false)
}

/// Swap for the test's length: the machine's own when it has some,
/// otherwise a 1 GiB swap file that is turned off and removed on drop.
struct SwapFile(Option<tempfile::TempDir>);

impl SwapFile {
    fn ensure() -> SwapFile {
        if swap_total_kib() > 0 {
            return SwapFile(None);
        }
        // Next to the build (a real disk file system; tmpfs cannot hold swap).
        let dir = tempfile::tempdir_in(crate::support::workspace_root().join("target")).unwrap();
        let file = dir.path().join("swapfile");
        run("fallocate", &["-l", "1G", file.to_str().unwrap()]);
        std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        run("mkswap", &[file.to_str().unwrap()]);
        run("swapon", &[file.to_str().unwrap()]);
        assert!(swap_total_kib() > 0, "swapon did not add swap");
        SwapFile(Some(dir))
    }
}

impl Drop for SwapFile {
    fn drop(&mut self) {
        if let Some(dir) = &self.0 {
            let _ = std::process::Command::new("swapoff").arg(dir.path().join("swapfile")).status();
        }
    }
}

fn swap_total_kib() -> u64 {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let line = meminfo.lines().find(|l| l.starts_with("SwapTotal:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn run(program: &str, args: &[&str]) {
    let out = std::process::Command::new(program).args(args).output().unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(out.status.success(), "{program} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// What memory pressure does: every private writable mapping of process
/// `pid` is pushed to swap with `process_madvise(MADV_PAGEOUT)`.
#[allow(unsafe_code)] // two syscalls with no safe wrapper; they touch no memory of this process but the iovec.
fn page_out(pid: u32) {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::c_int, 0) };
    assert!(pidfd >= 0, "pidfd_open: {}", std::io::Error::last_os_error());
    let mut advised = 0usize;
    for line in maps.lines() {
        let mut fields = line.split_whitespace();
        let (Some(range), Some(perms)) = (fields.next(), fields.next()) else { continue };
        if !perms.starts_with("rw") || !perms.ends_with('p') {
            continue;
        }
        let (start, end) = range.split_once('-').unwrap();
        let (start, end) = (usize::from_str_radix(start, 16).unwrap(), usize::from_str_radix(end, 16).unwrap());
        let iov = libc::iovec { iov_base: start as *mut libc::c_void, iov_len: end - start };
        // SAFETY: the iovec names ranges of the other process; the kernel reads only the iovec here.
        let n = unsafe {
            libc::syscall(libc::SYS_process_madvise, pidfd, &iov as *const libc::iovec, 1, libc::MADV_PAGEOUT, 0)
        };
        if n > 0 {
            advised += n as usize;
        }
    }
    // SAFETY: closing the descriptor opened above.
    unsafe { libc::close(pidfd as libc::c_int) };
    assert!(advised > 0, "process_madvise advised nothing: {}", std::io::Error::last_os_error());
}
