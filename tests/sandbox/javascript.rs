//! JavaScript on both engines (QuickJS-ng, the default, and StarlingMonkey): runaways stopped, state kept from the next task, the warm-up rules, and attacks only an interpreter invites.
//!
//! Every test runs `plugins/js/chaos/handler.js` as built on each engine
//! (`js.chaos`, `js-sm.chaos`), the way `runtime.rs`, `isolation.rs`,
//! `warm_up.rs` and `containment.rs` run the Rust `chaos` plugin: a
//! handler whose payload picks what it does. Each probe that plants state
//! is also run where the state is meant to survive (`instance_reuse`), so a
//! peek that cannot fail proves nothing.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use crate::isolation::{ISOLATED, Mode};
use crate::runtime::runtime;
use crate::support::{Host, RedisServer, RunNow, capture_logs, now_ms, plugin, polyglot_plugin, stat, wait_for};
use bytesize::ByteSize;
use hourglass::config::TypePolicy;
use hourglass::runtime::interpreter::Interpreter;
use hourglass::runtime::{Component, Failure, Handler, TaskRun};
use hourglass::task::ClaimedTask;
use redis::Commands;

/// The chaos handler on each engine: its plugin name and the engine the host must see in it.
const ENGINES: [(&str, Interpreter); 2] =
    [("js.chaos", Interpreter::QuickJs), ("js-sm.chaos", Interpreter::StarlingMonkey)];

/// `name` loaded once per test binary (each engine's compile is seconds to tens of seconds).
fn component(name: &str) -> Component {
    static LOADED: OnceLock<Mutex<HashMap<String, Component>>> = OnceLock::new();
    let loaded = LOADED.get_or_init(Mutex::default);
    let mut loaded = loaded.lock().unwrap();
    loaded
        .entry(name.to_owned())
        .or_insert_with(|| runtime().load(&polyglot_plugin(name)).unwrap_or_else(|e| panic!("load {name}: {e:#}")))
        .clone()
}

fn policy(mode: Mode, timeout: Duration, memory: ByteSize) -> TypePolicy {
    TypePolicy {
        timeout,
        memory_limit: memory,
        instance_reuse: if mode == Mode::Reuse { 8 } else { 0 },
        instance_reset: matches!(mode, Mode::Reset | Mode::ResetCold),
        instance_warm_up: mode != Mode::ResetCold,
        may_schedule: vec!["noop".parse().unwrap()],
        ..TypePolicy::default()
    }
}

/// A handler of `name` in `mode` (5 s, 64 MiB), its config `config`.
fn handler(name: &str, mode: Mode, config: &[(&str, &str)]) -> Handler {
    handler_with(name, &policy(mode, Duration::from_secs(5), ByteSize::mib(64)), config)
}

fn handler_with(name: &str, policy: &TypePolicy, config: &[(&str, &str)]) -> Handler {
    handler_of(component(name), policy, config)
}

fn handler_of(component: Component, policy: &TypePolicy, config: &[(&str, &str)]) -> Handler {
    let config: BTreeMap<String, String> = config.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    Handler::new(component, "chaos", &policy.sandbox(), Arc::new(config))
}

fn task(payload: &str) -> ClaimedTask {
    ClaimedTask {
        task_type: "chaos".parse().unwrap(),
        id: b"j-1".to_vec(),
        payload: payload.as_bytes().to_vec(),
        attempt: 1,
        due_ms: 1_700_000_000_000,
        token: 1,
        claim: 1,
    }
}

/// The text of a run that failed with `Failure::Error` or `Failure::Permanent`; "" when it succeeded.
fn failure(run: &TaskRun) -> String {
    match &run.result {
        Ok(()) => String::new(),
        Err(Failure::Error(m) | Failure::Permanent(m)) => m.clone(),
        Err(other) => other.to_string(),
    }
}

#[test]
fn the_host_names_each_engine() {
    for (name, engine) in ENGINES {
        assert_eq!(component(name).interpreter(), engine, "{name}");
        let report = runtime().check(&polyglot_plugin(name)).unwrap();
        assert!(report.to_string().contains(&format!("engine:  {engine}")), "{name}: {report}");
    }
    assert_eq!(component("py.echo").interpreter(), Interpreter::CPython);
    assert_eq!(runtime().load(&plugin("noop")).unwrap().interpreter(), Interpreter::None);
}

/// What WHATWG's UTF-8 decoder makes of `bytes`: `fatal` refuses invalid input, the others replace each
/// invalid sequence's maximal subpart with U+FFFD (as Rust's `from_utf8_lossy` does); all but `kept`
/// drop a leading byte order mark.
fn whatwg_decode(bytes: &[u8]) -> (Option<String>, String, String) {
    let kept = String::from_utf8_lossy(bytes).into_owned();
    let unmarked =
        |s: &str| s.strip_prefix('\u{feff}').filter(|_| bytes.starts_with(b"\xef\xbb\xbf")).unwrap_or(s).to_owned();
    let fatal = std::str::from_utf8(bytes).ok().map(unmarked);
    (fatal, unmarked(&kept), kept)
}

#[test]
fn text_decoder_and_encoder_read_and_write_utf8_as_the_standard_does_on_both_engines() {
    let mut vectors: Vec<(String, Vec<u8>)> = [
        &b""[..],
        b"plain {\"order_id\": 1}",
        "h\u{e9}llo \u{65e5}\u{672c} \u{1f600}".as_bytes(),
        b"\xef\xbb\xbfmarked",
        b"\xef\xbb\xbf",
        b"\xff",
        b"\x80",
        b"\xc0\x80",
        b"\xc1\xbf",
        b"\xe0\x80\x80",
        b"\xed\xa0\x80",
        b"\xf4\x90\x80\x80",
        b"\xf5\x80",
        b"\xe2\x82",
        b"\xe2\x82A",
        b"\xf0\x9f\x98",
        b"a\xffb\xe2\x82\xacc\xf0\x9f\x98\x80d\xc3",
        "\u{fffe}\u{ffff}\u{10ffff}".as_bytes(),
    ]
    .iter()
    .map(|v| (format!("{:?}", String::from_utf8_lossy(v)), v.to_vec()))
    .collect();
    // Long inputs cross the decoder's chunks of 8,192, a character split over a boundary included.
    let ascii = "x".repeat(20_000).into_bytes();
    let mixed = "\u{e9}\u{20ac}\u{1f600}a".repeat(3_000).into_bytes();
    let mut broken = mixed.clone();
    broken[15_001] = 0xff;
    vectors.extend([
        ("20,000 ASCII".into(), ascii),
        ("30,000 mixed".into(), mixed),
        ("one bad byte in 30,000".into(), broken),
    ]);

    for (name, _) in ENGINES {
        let h = handler(name, Mode::Reset, &[]);
        for (label, bytes) in &vectors {
            let mut t = task("");
            t.payload = [&b"utf8:"[..], bytes].concat();
            let run = h.run_now(&t);
            assert_eq!(run.result, Ok(()), "{name} {label}: {}", failure(&run));
            let out: HashMap<String, Vec<u8>> =
                run.followups.iter().map(|f| (String::from_utf8(f.id.clone()).unwrap(), f.payload.clone())).collect();
            let (fatal, lossy, kept) = whatwg_decode(bytes);
            match fatal {
                Some(text) => {
                    assert_eq!(out.get("fatal").map(|b| b.as_slice()), Some(text.as_bytes()), "{name} {label}: fatal")
                }
                None => assert_eq!(
                    out.get("fatal-error").map(|b| b.as_slice()),
                    Some(&b"TypeError"[..]),
                    "{name} {label}: fatal"
                ),
            }
            assert_eq!(out["lossy"], lossy.as_bytes(), "{name} {label}: replacing");
            assert_eq!(out["kept"], kept.as_bytes(), "{name} {label}: ignoreBOM");
            assert_eq!(out["surrogates"], "a\u{fffd}b\u{fffd}c\u{1f600}\u{fffd}".as_bytes(), "{name}: lone surrogates");
        }
    }
}

#[test]
fn failures_map_one_to_one_and_runaways_are_stopped_on_both_engines() {
    for (name, engine) in ENGINES {
        let h = handler(name, Mode::Reset, &[]);
        assert_eq!(h.run_now(&task("ok")).result, Ok(()), "{name}");
        assert_eq!(h.run_now(&task("error:try later")).result, Err(Failure::Error("try later".into())), "{name}");
        assert_eq!(h.run_now(&task("permanent:bad order")).result, Err(Failure::Permanent("bad order".into())));
        assert_eq!(
            h.run_now(&task("retry-after:1500")).result,
            Err(Failure::RetryAfter(Duration::from_millis(1500))),
            "{name}: a retry-after of a plain number"
        );
        let thrown = failure(&h.run_now(&task("throw:boom")));
        if engine == Interpreter::QuickJs {
            // The QuickJS build's entry fails the attempt with what was thrown (plugins/js/quickjs/entry.js).
            assert_eq!(thrown, "Error: boom", "{name}");
        } else {
            // StarlingMonkey aborts the instance; the message is on stderr, in the host's log.
            assert!(!thrown.is_empty() && !thrown.contains('\n'), "{name}: {thrown}");
        }

        let quick = handler_with(name, &policy(Mode::Reset, Duration::from_secs(1), ByteSize::mib(64)), &[]);
        assert_eq!(failure(&quick.run_now(&task("loop"))), "deadline of 1s exceeded", "{name}");
        assert_eq!(
            failure(&quick.run_now(&task("eval:for (;;) {}"))),
            "deadline of 1s exceeded",
            "{name}: eval'd loop"
        );
        let small = handler_with(name, &policy(Mode::Reset, Duration::from_secs(10), ByteSize::mib(32)), &[]);
        let bomb = failure(&small.run_now(&task("membomb")));
        assert!(!bomb.is_empty() && !bomb.contains('\n'), "{name}: the memory bomb: {bomb:?}");
        let deep = failure(&h.run_now(&task("stackoverflow")));
        assert!(!deep.is_empty() && !deep.contains('\n'), "{name}: the stack overflow: {deep:?}");
        // Each instance that misbehaved is dropped; the next task starts as built.
        for h in [&h, &quick, &small] {
            assert_eq!(h.run_now(&task("peek")).result, Ok(()), "{name}");
            assert_eq!(h.run_now(&task("ok")).result, Ok(()), "{name}");
        }
    }
}

#[test]
fn nothing_a_script_keeps_or_pollutes_reaches_the_next_task() {
    for (name, _) in ENGINES {
        for mode in ISOLATED {
            let h = handler(name, mode, &[]);
            for plant in ["stash:alpha", "pollute", "eval:globalThis.__stash = 'eval'; Object.prototype.isAdmin = 1"] {
                // (An eval fails with what it returned, after planting.)
                let planted = h.run_now(&task(plant));
                assert!(planted.result.is_ok() || plant.starts_with("eval"), "{name} {mode:?}: {plant}: {planted:?}");
                let peek = h.run_now(&task("peek"));
                assert_eq!(
                    peek.result,
                    Ok(()),
                    "{name} {mode:?}: after {plant}, the next task saw: {}",
                    failure(&peek)
                );
            }
        }
        // The control: kept as it is, the same instance shows every kind of state planted.
        let h = handler(name, Mode::Reuse, &[]);
        assert_eq!(h.run_now(&task("stash:alpha")).result, Ok(()));
        assert_eq!(h.run_now(&task("pollute")).result, Ok(()));
        let seen = failure(&h.run_now(&task("peek")));
        for kind in [
            "module variable alpha",
            "closure alpha",
            "globalThis.__stash alpha",
            "Object.prototype alpha",
            "Array.prototype alpha",
            "String.prototype alpha",
            "JSON alpha",
            "a buffer of",
            "Object.prototype.isAdmin",
            "JSON swapped",
            "Array.prototype.map swapped",
            "Math.random swapped",
            "TextDecoder swapped",
        ] {
            assert!(seen.contains(kind), "{name}: the reused instance's peek missed {kind:?}: {seen}");
        }
    }
}

#[test]
fn math_random_and_crypto_are_new_in_every_task() {
    for (name, _) in ENGINES {
        for mode in ISOLATED {
            let h = handler(name, mode, &[]);
            let draws: HashSet<String> = (0..4).map(|_| failure(&h.run_now(&task("hash-seed")))).collect();
            assert!(draws.iter().all(|d| d.starts_with("hash-seed 0.")), "{name} {mode:?}: {draws:?}");
            assert_eq!(draws.len(), 4, "{name} {mode:?}: tasks drew the same numbers: {draws:?}");
        }
    }
}

#[test]
fn eval_and_import_of_attacker_text_reach_nothing_of_the_host() {
    for (name, engine) in ENGINES {
        let h = handler(name, Mode::Reset, &[]);
        if engine == Interpreter::QuickJs {
            // What QuickJS lacks says so (plugins/js/quickjs/prelude.js), rather than being undefined.
            let fetch = failure(&h.run_now(&task("eval:fetch('http://127.0.0.1:1/')")));
            assert!(fetch.starts_with("eval threw Error: fetch is not available"), "{fetch}");
        }
        // What a script could reach the host through, were the engine's extras compiled in.
        let reach = failure(&h.run_now(&task(
            "eval:[typeof std, typeof os, typeof process, typeof require, typeof Deno, typeof scriptArgs].join()",
        )));
        assert_eq!(reach, "eval returned undefined,undefined,undefined,undefined,undefined,undefined", "{name}");
        // The global object reached the roundabout way is the sandbox's own.
        let global = failure(&h.run_now(&task("eval:Function('return this')() === globalThis")));
        assert_eq!(global, "eval returned true", "{name}");
        for specifier in ["std", "os", "node:fs", "/etc/passwd", "file:///etc/passwd", "../../../../etc/passwd"] {
            // It fails, whether the script saw the import refused or the engine aborted it.
            let (run, logs) = capture_logs(|| h.run_now(&task(&format!("import:{specifier}"))));
            assert!(!failure(&run).is_empty(), "{name}: {specifier}: {run:?}");
            assert!(!logs.contains("resolved"), "{name}: import({specifier:?}) resolved:\n{logs}");
        }
        assert_eq!(h.run_now(&task("peek")).result, Ok(()), "{name}");
    }
}

#[test]
fn a_warm_up_reaches_no_task_and_a_failing_one_costs_none() {
    // Loaded anew for each case: whether a warm-up is usable is a property of the loaded component.
    let fresh = |name: &str, warm_up: &str| {
        let component = runtime().load(&polyglot_plugin(name)).unwrap();
        handler_of(component, &policy(Mode::Reset, Duration::from_secs(5), ByteSize::mib(64)), &[("warm-up", warm_up)])
    };
    for (name, _) in ENGINES {
        for warm_up in ["schedule:noop:from-warm-up", "log", "stdout"] {
            let h = fresh(name, warm_up);
            let (run, logs) = capture_logs(|| h.run_now(&task("ok")));
            assert_eq!(run.result, Ok(()), "{name}: {warm_up}");
            assert!(run.followups.is_empty(), "{name}: {warm_up}: the warm-up's follow-up reached a task");
            assert!(!logs.contains("chaos log") && !logs.contains("hello from"), "{name}: {warm_up} logged:\n{logs}");
        }
        for warm_up in ["throw:no payload", "loop", "membomb", "stackoverflow"] {
            let h = fresh(name, warm_up);
            for _ in 0..3 {
                assert_eq!(h.run_now(&task("ok")).result, Ok(()), "{name}: {warm_up}: a task paid for its warm-up");
            }
        }
        // The same commands in a real task do what they say: the checks above can fail.
        let h = fresh(name, "");
        assert_eq!(h.run_now(&task("schedule:noop:from-task")).followups.len(), 1, "{name}");
        let (_, logs) = capture_logs(|| (h.run_now(&task("log")), h.run_now(&task("stdout"))));
        assert!(logs.contains("chaos log at info") && logs.contains("hello from stdout"), "{name}: {logs}");
    }
}

/// Schedules `tasks` of `t` (id, payload), due now.
fn schedule(conn: &mut redis::Connection, t: &str, tasks: &[(String, String)]) {
    let now = now_ms();
    let mut pipe = redis::pipe();
    for (id, payload) in tasks {
        pipe.hset(format!("hourglass:{{{t}}}:payload"), id, payload).ignore();
        pipe.zadd(format!("hourglass:{{{t}}}:due"), id, now).ignore();
    }
    let _: () = pipe.query(conn).unwrap();
}

#[test]
fn hostile_javascript_fails_only_its_own_tasks_and_the_host_stays_in_its_bound() {
    let redis = RedisServer::start();
    let mut plugins = vec![("noop", plugin("noop"))];
    plugins.extend(ENGINES.iter().map(|(name, _)| (*name, polyglot_plugin(name))));
    let mut config = String::from(
        "[runner]\nconcurrency = 8\n[defaults]\nconcurrency = 4\nmemory_limit = \"32MiB\"\nhost_memory_limit = \"4MiB\"\n",
    );
    for (name, _) in ENGINES {
        config += &format!(
            "[types.\"{name}\"]\ntimeout = \"2s\"\nmax_attempts = 1\nconcurrency = 2\nmay_schedule = [\"noop\"]\n"
        );
    }
    let host = Host::start(&redis, &plugins, &config);
    // The start log names each plugin's engine.
    let log = host.log();
    for (name, engine) in ENGINES {
        let loaded = log.lines().find(|l| l.contains("plugin loaded") && l.contains(&format!("{name}.wasm")));
        assert!(loaded.is_some_and(|l| l.contains(engine.as_str())), "{name}: {loaded:?}");
    }
    let mut conn = redis.client();
    let noops = |conn: &mut redis::Connection, from: usize, n: usize, spread: i64| {
        let now = now_ms();
        let mut pipe = redis::pipe();
        for i in from..from + n {
            pipe.zadd("hourglass:{noop}:due", format!("n{i}"), now + spread * (i - from) as i64 / n as i64).ignore();
        }
        let _: () = pipe.query(conn).unwrap();
    };
    noops(&mut conn, 0, 200, 0);
    wait_for("the first ordinary tasks", Duration::from_secs(120), || {
        (stat(&mut conn, "noop", "succeeded") >= 200).then_some(())
    });
    let rss_before = host.proc_status("VmRSS:");

    let commands = [
        "loop",
        "membomb",
        "stackoverflow",
        "eval:for (;;) {}",
        "eval:let a = []; for (;;) a.push('x'.repeat(1 << 16))",
        "followups-big:1000",
        // 256 KiB of log lines, four times a run's 64 KiB: StarlingMonkey takes about 0.4 ms a call.
        "log-flood:262144",
        "pollute",
        "throw:hostile",
    ];
    let tasks: Vec<(String, String)> =
        (0..2).flat_map(|round| commands.iter().map(move |c| (format!("h{round}-{c}"), c.to_string()))).collect();
    for (name, _) in ENGINES {
        schedule(&mut conn, name, &tasks);
    }
    noops(&mut conn, 200, 2000, 4000);
    wait_for("every hostile task to end and every ordinary one to succeed", Duration::from_secs(300), || {
        let ended = ENGINES.iter().all(|(name, _)| {
            let dead = crate::support::zcard(&mut conn, &format!("hourglass:{{{name}}}:dead"));
            dead + stat(&mut conn, name, "succeeded") as usize >= tasks.len()
        });
        (ended && stat(&mut conn, "noop", "succeeded") >= 2200).then_some(())
    });
    assert_eq!(stat(&mut conn, "noop", "succeeded"), 2200, "an ordinary task ran twice or failed");
    assert_eq!(stat(&mut conn, "noop", "failed"), 0, "an ordinary task failed beside the hostile ones");
    for (name, _) in ENGINES {
        let errors: HashMap<String, String> = conn.hgetall(format!("hourglass:{{{name}}}:errors")).unwrap();
        for round in 0..2 {
            let error = |c: &str| errors.get(&format!("h{round}-{c}")).cloned().unwrap_or_default();
            assert_eq!(error("loop"), "deadline of 2s exceeded", "{name}");
            assert_eq!(error("eval:for (;;) {}"), "deadline of 2s exceeded", "{name}");
            assert!(error("followups-big:1000").starts_with("host memory budget exceeded"), "{name}: {errors:?}");
            for c in ["membomb", "stackoverflow", "throw:hostile"] {
                assert!(!error(c).is_empty(), "{name}: {c} did not fail: {errors:?}");
            }
        }
        // The log flood and the pollution succeed: lines past the cap are dropped, the pollution is reset.
        assert_eq!(stat(&mut conn, name, "succeeded"), 4, "{name}: {errors:?}");
        let outbox: usize = conn.hlen(format!("hourglass:{{{name}}}:outbox")).unwrap();
        assert_eq!(outbox, 0, "{name}: a run over its budget committed follow-ups");
    }
    // On one server a settle delivers follow-ups itself: none of the flood's reached noop (had
    // one, it would wait there, run with its payload, or have counted past the 2,200).
    let waiting: Option<f64> = conn.zscore("hourglass:{noop}:due", "big-0").unwrap();
    let payload: bool = conn.hexists("hourglass:{noop}:payload", "big-0").unwrap();
    assert!(waiting.is_none() && !payload, "a run over its budget delivered a follow-up");
    // docs/sandbox.md's bound: concurrency × (memory_limit + host_memory_limit + one host-call
    // argument's copy, at most the run's own memory): 8 × (32 + 4 + 32) MiB over the idle host.
    let peak = host.proc_status("VmHWM:");
    let bound_kb = 8 * (32 + 4 + 32) * 1024;
    assert!(
        peak < rss_before + bound_kb,
        "peak RSS {peak} kB, {rss_before} kB before: over the bound of {bound_kb} kB"
    );
}

/// A memory of no bytes (QuickJS's components have one) once left a zero-length image in the slot of
/// a reset instance, and the next new instance in that slot failed to instantiate ("Invalid argument":
/// an mmap of zero bytes) until the patch in vendor/ kept such a memory imageless.
#[test]
fn the_slots_of_reset_instances_serve_new_instances_after_them() {
    for (name, _) in ENGINES {
        for round in 0..3 {
            for mode in [Mode::ResetCold, Mode::Reset, Mode::Fresh] {
                let h = handler(name, mode, &[]);
                for i in 0..20 {
                    let run = h.run_now(&task(if i % 2 == 0 { "hash-seed" } else { "ok" }));
                    let text = failure(&run);
                    assert!(
                        text.is_empty() || text.starts_with("hash-seed"),
                        "{name} round {round} {mode:?} run {i}: {text}"
                    );
                }
            }
        }
    }
}
