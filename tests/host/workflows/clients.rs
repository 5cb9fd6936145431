//! Workflow groups built by clients: the CLI alone, and Python, Node, the CLI and Rust together on one group.

use std::process::Command;

use super::{WAIT, group, summary};
use crate::support::{Host, RedisServer, key, now_ms, stat, store, test_plugin, ty, wait_for};
use hourglass::store::NewChild;
use redis::Commands;

/// A client with nothing but the CLI: open, add, seal, show, cancel a child;
/// refusals and bad arguments are one line and a non-zero exit, and write nothing.
#[test]
fn the_cli_runs_a_group_and_refuses_bad_steps_in_one_line() {
    let redis = RedisServer::start();
    let mut c = redis.client();
    let ok = |args: &[&str]| {
        let out = crate::support::hourglass_on(&redis, args);
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    ok(&["group", "open", "order.ship", "o-17", "--payload", r#"{"order":"o-17"}"#]);
    ok(&["group", "add", "order.ship", "o-17", "order.reserve", "o-17"]);
    ok(&["group", "add", "order.ship", "o-17", "order.charge", "o-17", "--payload", r#"{"amount":4200}"#]);
    let sealed = ok(&["group", "seal", "order.ship", "o-17"]);
    assert!(sealed.contains("completes when its last pending child ends"), "{sealed}");
    let charge: Vec<u8> = c.hget(key("order.charge", "payload"), "o-17").unwrap();
    assert_eq!(charge, br#"{"amount":4200}"#, "the child is an ordinary task with its payload");

    // Cancelling a waiting child tells its group.
    ok(&["cancel", "order.charge", "o-17"]);
    let stats = ok(&["stats"]);
    assert!(stats.contains("GROUPS order.ship: 1 open, 0 completed"), "{stats}");
    let shown = ok(&["group", "show", "order.ship", "o-17", "--json"]);
    let view: serde_json::Value = serde_json::from_str(&shown).unwrap();
    assert_eq!((view["pending"].as_u64(), view["cancelled"].as_u64()), (Some(1), Some(1)), "{view}");

    // Refusals and bad arguments: one line naming the group, non-zero, nothing written.
    let before: Vec<(String, f64)> = c.zrange_withscores(key("order.mail", "due"), 0, -1).unwrap();
    let out = crate::support::hourglass_on(&redis, &["group", "add", "order.ship", "o-17", "order.mail", "late"]);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success());
    assert_eq!(err.trim(), r#"error: group order.ship/o-17: group "o-17" is sealed: no children can be added"#);
    let after: Vec<(String, f64)> = c.zrange_withscores(key("order.mail", "due"), 0, -1).unwrap();
    assert_eq!(before, after, "a refused add schedules nothing");
    let out = crate::support::hourglass_on(&redis, &["group", "show", "order.ship", "nope"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no group order.ship/nope"));
    for bad in [
        &["group", "open", "Bad", "g"][..],
        &["group", "open", "ship", "a\u{1}b"],
        &["group", "open", "ship", "g", "--when", "sometimes"],
        &["group", "add", "ship", "g", "step"],
    ] {
        let out = crate::support::hourglass_on(&redis, bad);
        assert!(!out.status.success(), "{bad:?} succeeded");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.trim().lines().count() <= 3 && err.contains("error"), "{bad:?}: {err}");
    }
    let keys: Vec<String> = c.keys("hourglass:{ship}:*").unwrap();
    assert!(keys.is_empty(), "bad arguments wrote {keys:?}");
}

/// Runs a Python program with the Python client (clients/python), the socket of `redis` as `sys.argv[1]`; its stdout.
pub(super) fn python(redis: &RedisServer, program: &str) -> String {
    let dir = crate::support::workspace_root().join("clients/python");
    let python = dir.join(".venv/bin/python");
    assert!(python.exists(), "no {}: run 'bash clients/test.sh --install-only'", python.display());
    let program = format!(
        "import sys, redis, hourglass_client as hg\nc = hg.Hourglass(redis.Redis(unix_socket_path=sys.argv[1]), shards={{'work': 3}})\n{program}"
    );
    client_output("python", Command::new(python).arg("-c").arg(program).arg(redis.socket()).env("PYTHONPATH", dir))
}

/// Runs a Node program with the Node client (clients/node), the socket of `redis` as `process.argv[1]`; its stdout.
pub(super) fn node(redis: &RedisServer, program: &str) -> String {
    let dir = crate::support::workspace_root().join("clients/node");
    assert!(
        dir.join("node_modules/ioredis").exists(),
        "no ioredis in {}: run 'bash clients/test.sh --install-only'",
        dir.display()
    );
    let program = format!(
        "const Redis = require('ioredis'); const hg = require('./index.js');\n\
         const r = new Redis({{ path: process.argv[1] }}); const c = new hg.Hourglass(r, {{ shards: {{ work: 3 }} }});\n\
         (async () => {{ {program} }})().then(() => r.disconnect(), (e) => {{ console.error(e); process.exit(1); }});"
    );
    client_output("node", Command::new("node").arg("-e").arg(program).arg(redis.socket()).current_dir(dir))
}

fn client_output(what: &str, command: &mut Command) -> String {
    let out = command.output().unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    assert!(out.status.success(), "{what}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// One group built by four clients, each running the host's own scripts:
/// Python opens it, Node, the CLI and the Rust API add children of a sharded
/// type (each routing them itself), Python adds more and seals it; a host
/// runs every child, and the callback is scheduled exactly once, counting all
/// of them. All route a sharded type's ids as the host does, a running task
/// cancelled from Node is stopped by its host, and a refusal reaches Python
/// and Node as their typed errors.
#[test]
fn python_node_the_cli_and_rust_build_one_group_and_its_callback_fires_once() {
    let server = RedisServer::start();
    let mut c = server.client();
    let host = Host::start(&server, &[("work", test_plugin("chaos"))], "[types.work]\nshards = 3\n");
    let config = host.dir.path().join("runner.toml");
    let cli = |args: &[&str]| {
        let mut all = vec!["--config", config.to_str().unwrap()];
        all.extend_from_slice(args);
        let out = crate::support::hourglass_on(&server, &all);
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };

    // Routing: ids the CLI schedules an hour out are where both clients look first.
    let ids: Vec<String> = (0..12).map(|i| format!("route-{i}")).collect();
    for id in &ids {
        cli(&["schedule", "work", id, "--in", "1h"]);
    }
    let listed = format!("{ids:?}");
    let py = python(
        &server,
        &format!(
            "for i in {listed}:\n  v = c.show('work', i)\n  assert v.state == 'scheduled' and v.task_type == c.shard_for('work', i), (i, v)\n  print(v.shard)"
        ),
    );
    let js = node(
        &server,
        &format!(
            "for (const i of {listed}) {{ const v = await c.show('work', i); if (v.state !== 'scheduled' || v.taskType !== c.shardFor('work', i)) throw new Error(i); console.log(v.shard); }}"
        ),
    );
    assert_eq!(py, js, "both clients name the same shards");
    let rt = crate::support::tokio_runtime();
    let s = rt.block_on(store(&server)).with_type_shards(&ty("work"), 3);
    let work = ty("work");
    let rust: Vec<String> =
        ids.iter().map(|id| s.shard_index(&s.shard_for(&work, id.as_bytes())).unwrap().to_string()).collect();
    assert_eq!(py, rust.join("\n"), "the clients route as the host does");
    let shards: std::collections::BTreeSet<&str> = py.lines().collect();
    assert_eq!(shards.len(), 3, "12 ids spread over the 3 shards: {py}");
    for id in &ids {
        cli(&["cancel", "work", id]);
    }

    // A running task cancelled from Node: its host stops the run, and Python sees it gone and counted.
    python(&server, "assert c.schedule('work', 'long-1', payload='sleep:30000')");
    wait_for("the long task to run", WAIT, || {
        (python(&server, "print(c.show('work', 'long-1').state)") == "running").then_some(())
    });
    let cancelled = node(&server, "const r = await c.cancel('work', 'long-1'); console.log(r.state, r.holder !== '');");
    assert_eq!(cancelled, "running true", "the cancel reached the run, and named its host");
    wait_for("its host to stop it", WAIT, || {
        let seen = python(&server, "print(c.show('work', 'long-1').state, c.stats('work').cancelled)");
        (seen == "unknown 1").then_some(())
    });

    // The children fall due a few seconds out, so none ends before every client added its own.
    let later = now_ms() + 3_000;
    python(&server, "assert c.group_open('done', 'mixed', callback_id='cb', payload='from python')");
    node(
        &server,
        &format!(
            "const a = await c.groupAdd('done', 'mixed', Array.from({{ length: 10 }}, (_, i) => ({{ taskType: 'work', id: `js-${{i}}`, payload: 'ok', dueMs: {later} }}))); if (a.joined !== 10) throw new Error(JSON.stringify(a));"
        ),
    );
    let cli_ids: Vec<String> = (0..10).map(|i| format!("cli-{i}")).collect();
    let mut add = vec!["group", "add", "done", "mixed", "work"];
    add.extend(cli_ids.iter().map(String::as_str));
    let at = later.to_string();
    add.extend(["--at", &at, "--payload", "ok"]);
    cli(&add);
    let rust_kids: Vec<NewChild> = (0..10)
        .map(|i| NewChild { task_type: work.clone(), id: format!("rs-{i}"), payload: b"ok".to_vec(), due_ms: later })
        .collect();
    assert_eq!(rt.block_on(s.group_add(&group("done", "mixed"), &rust_kids)).unwrap().joined, 10);
    python(
        &server,
        &format!(
            "a = c.group_add('done', 'mixed', [hg.Child('work', f'py-{{i}}', payload='ok', due_ms={later}) for i in range(10)])\nassert a.joined == 10, a\nassert c.group_seal('done', 'mixed').state == 'sealed'"
        ),
    );
    // Refusals are typed in both.
    python(
        &server,
        "try:\n  c.group_add('done', 'mixed', [hg.Child('work', 'late')])\n  raise SystemExit('added to a sealed group')\nexcept hg.GroupClosed:\n  pass",
    );
    node(
        &server,
        "try { await c.groupAdd('done', 'mixed', [{ taskType: 'work', id: 'late' }]); throw new Error('added'); } catch (e) { if (!(e instanceof hg.GroupClosed)) throw e; }",
    );

    let sum = wait_for("the callback", WAIT, || summary(&mut c, "done", "cb"));
    assert_eq!((sum["added"].as_u64(), sum["succeeded"].as_u64()), (Some(40), Some(40)), "{sum}");
    assert_eq!(sum["payload"], "from python");
    assert_eq!(stat(&mut c, "done", "groups_completed"), 1, "completed exactly once");
    let seen = python(&server, "v = c.group_show('done', 'mixed')\nprint(v.state, v.added, v.succeeded, v.fired)");
    assert_eq!(seen, "done 40 40 callback");
    let counted =
        python(&server, "s = c.stats('work')\nprint(s.succeeded, s.dead_total, s.due_now + s.scheduled_later)");
    assert_eq!(counted, "40 0 0", "every child succeeded, over the 3 shards, and nothing is left");
}

/// A host serving `work` (chaos, 3 shards) and `done` (noop) with events on, and `quiet` (chaos)
/// without, once it has created the events streams: work's 3 shards' and done's, and no other.
fn host_with_events() -> (RedisServer, Host) {
    let server = RedisServer::start();
    let host = Host::start(
        &server,
        &[("work", test_plugin("chaos")), ("done", crate::support::plugin("noop")), ("quiet", test_plugin("chaos"))],
        "[types.work]\nshards = 3\nevents = true\n[types.done]\nevents = true\n",
    );
    let mut c = server.client();
    let mut streams: Vec<String> = Vec::new();
    wait_for("the events streams", WAIT, || {
        streams = c.keys("hourglass:{*}:events").unwrap();
        (streams.len() == 4).then_some(())
    });
    assert!(!streams.iter().any(|k| k.contains("{quiet}")), "{streams:?}");
    (server, host)
}

/// A Node program waits for the end of tasks a host runs (issue 52): a success and a death (with its
/// error) as they happen, both again once they are over (from the events stream and from the dead
/// letters), a group's callback, and a type without events told apart.
#[test]
fn node_waits_until_tasks_a_host_runs_have_finished() {
    let (server, _host) = host_with_events();
    let out = node(
        &server,
        "await c.schedule('work', 'ok-1', { delayMs: 300, payload: 'ok' });\n\
         await c.schedule('work', 'bad-1', { delayMs: 300, payload: 'permanent:boom' });\n\
         const [a, b] = await Promise.all(['ok-1', 'bad-1'].map((id) => c.waitUntilFinished('work', id, { timeoutMs: 60000 })));\n\
         console.log(a.outcome, a.attempt, a.error, b.outcome, b.attempt, JSON.stringify(b.error));\n\
         const x = await c.waitUntilFinished('work', 'ok-1', { timeoutMs: 0 });\n\
         const y = await c.waitUntilFinished('work', 'bad-1', { timeoutMs: 0 });\n\
         console.log(x.outcome, x.finishedMs === a.finishedMs, y.outcome, y.attempt, y.error === b.error);\n\
         await c.groupOpen('done', 'g-1', { callbackId: 'cb-1' });\n\
         await c.groupAdd('done', 'g-1', [{ taskType: 'work', id: 'kid-1', payload: 'ok' }]);\n\
         console.log(['sealed', 'completed'].includes((await c.groupSeal('done', 'g-1')).state));\n\
         console.log((await c.waitUntilFinished('done', 'cb-1', { timeoutMs: 60000 })).outcome);\n\
         try { await c.waitUntilFinished('quiet', 'q-1'); } catch (e) { console.log(e.code); }",
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 5, "{out}");
    assert!(lines[0].starts_with("succeeded 1 null dead 1 \"") && lines[0].contains("boom"), "{out}");
    assert_eq!(&lines[1..], &["succeeded true dead 1 true", "true", "succeeded", "HG_NO_EVENTS"], "{out}");
}

/// A Python program waits for the end of tasks a host runs (issue 52): a success and a death (with its
/// error), both again once they are over (from the events stream and from the dead letters), a
/// group's callback waited for before its group completes, an unknown task, and a type without events.
#[test]
fn python_waits_for_the_end_of_tasks_a_host_runs() {
    let (server, _host) = host_with_events();
    let out = python(
        &server,
        "from datetime import timedelta\n\
         c.schedule('work', 'ok-1', delay_ms=300, payload='ok')\n\
         c.schedule('work', 'bad-1', delay=timedelta(seconds=2), payload='permanent:boom')\n\
         a = c.wait('work', 'ok-1', timeout=timedelta(seconds=60))\n\
         b = c.wait('work', 'bad-1', timeout_ms=60_000)\n\
         print(a.outcome, a.attempt, a.error, a.finished_ms > 0, b.outcome, b.attempt, repr(b.error))\n\
         x, y = c.wait('work', 'ok-1', timeout_ms=0), c.wait('work', 'bad-1', timeout_ms=0)\n\
         print(x == a, y.outcome, y.attempt, y.error == b.error)\n\
         c.group_open('done', 'g-1', callback_id='cb-1')\n\
         c.group_add('done', 'g-1', [hg.Child('work', 'kid-1', payload='ok', due_ms=hg.now_ms() + 3000)])\n\
         print(c.group_seal('done', 'g-1').state)\n\
         print(c.wait('done', 'cb-1', timeout_ms=60_000).outcome)\n\
         try:\n  c.wait('work', 'never', timeout_ms=1_000)\nexcept hg.UnknownTask as e:\n  print(e.code)\n\
         try:\n  c.wait('quiet', 'q-1')\nexcept hg.NoEvents as e:\n  print(e.code)",
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 6, "{out}");
    assert!(lines[0].starts_with("succeeded 1 None True dead 1 '") && lines[0].contains("boom"), "{out}");
    assert_eq!(lines[1], "True dead 1 True", "{out}");
    assert!(["sealed", "completed"].contains(&lines[2]), "{out}");
    assert_eq!(&lines[3..], &["succeeded", "HG_UNKNOWN_TASK", "HG_NO_EVENTS"], "{out}");
}
