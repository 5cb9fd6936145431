//! Bad data in Redis never loses a task: for every script and every key it
//! touches, a value of the wrong type (and a number that is not one) makes
//! the script fail with an error naming the key and write nothing; once the
//! key is fixed, everything completes.
//!
//! Each case starts from a fresh Redis state with tasks in flight, moves the
//! real key aside (as an operator who renames the bad value away would get
//! it back), plants the bad value, snapshots every other key with `DUMP`,
//! runs the script through `Store`, checks the error and that the snapshot is
//! unchanged, then restores the key and drives the tasks to their end.
//!
//! The task scripts are swept in `scripts`, the workflow group steps in
//! `groups`; here, what a running host does with a wrong-typed key.

mod graphs;
mod groups;
mod scripts;

use std::collections::BTreeMap;
use std::time::Duration;

use crate::support::{RedisServer, key};
use hourglass::store::ClaimLimits;
use redis::Commands;

/// The kinds of value a client can leave at a key.
const KINDS: [&str; 6] = ["string", "list", "set", "hash", "zset", "stream"];
const IDS: [&str; 5] = ["w-1", "w-2", "w-3", "w-4", "w-5"];

/// What a case plants at its key.
#[derive(Debug, Clone, Copy)]
enum Bad {
    /// A value of this kind where another kind belongs.
    Kind(&'static str),
    /// A string that is not a number where a counter is kept.
    NotANumber,
    /// A hash field that is not a number where a counter field is kept.
    FieldNotANumber(&'static str),
}

fn plant(c: &mut redis::Connection, k: &str, bad: Bad) {
    if !matches!(bad, Bad::FieldNotANumber(_)) {
        let _: () = redis::cmd("DEL").arg(k).query(c).unwrap();
    }
    let cmd = match bad {
        Bad::Kind("string") => redis::cmd("SET").arg(k).arg("oops").clone(),
        Bad::Kind("list") => redis::cmd("RPUSH").arg(k).arg("oops").clone(),
        Bad::Kind("set") => redis::cmd("SADD").arg(k).arg("oops").clone(),
        Bad::Kind("hash") => redis::cmd("HSET").arg(k).arg("oops").arg("1").clone(),
        Bad::Kind("zset") => redis::cmd("ZADD").arg(k).arg(1).arg("oops").clone(),
        Bad::Kind("stream") => redis::cmd("XADD").arg(k).arg("*").arg("oops").arg("1").clone(),
        Bad::Kind(other) => panic!("unknown kind {other}"),
        Bad::NotANumber => redis::cmd("SET").arg(k).arg("seven").clone(),
        Bad::FieldNotANumber(field) => redis::cmd("HSET").arg(k).arg(field).arg("seven").clone(),
    };
    let _: () = cmd.query(c).unwrap();
}

/// Every key and its DUMP, but for the ones in `skip`.
fn snapshot(c: &mut redis::Connection, skip: &[&str]) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let keys: Vec<Vec<u8>> = redis::cmd("KEYS").arg("*").query(c).unwrap();
    keys.into_iter()
        .filter(|k| !skip.iter().any(|s| s.as_bytes() == k.as_slice()))
        .map(|k| {
            let dump: Vec<u8> = redis::cmd("DUMP").arg(&k).query(c).unwrap();
            (k, dump)
        })
        .collect()
}

fn limits() -> ClaimLimits {
    ClaimLimits { max_tasks: 100, lease: Duration::from_secs(60), ..ClaimLimits::default() }
}

#[test]
fn a_wrong_typed_key_faults_its_type_only_and_the_tasks_run_once_it_is_fixed() {
    use crate::support::{Host, admin_addr, get, plugin, sample, stat, wait_for};
    let redis = RedisServer::start();
    let host = Host::start(
        &redis,
        &[("wt", plugin("noop")), ("wt2", plugin("noop")), ("fine", plugin("noop"))],
        "[admin]\nenabled = true\nlisten = \"127.0.0.1:0\"\n",
    );
    let addr = admin_addr(&host);
    let mut c = redis.client();
    // The report: a string where the payload hash belongs, then five tasks.
    let _: () = c.set(key("wt", "payload"), "oops").unwrap();
    let _: () = c.set(key("wt2", "seq"), "not a number").unwrap();
    let now = crate::support::now_ms();
    for id in IDS {
        let _: () = c.zadd(key("wt", "due"), id, now).unwrap();
        let _: () = c.zadd(key("wt2", "due"), id, now).unwrap();
        let _: () = c.zadd(key("fine", "due"), id, now).unwrap();
    }
    let wait = Duration::from_secs(60);
    wait_for("the sound type to run", wait, || (stat(&mut c, "fine", "succeeded") == 5).then_some(()));
    wait_for("both broken types to be reported", wait, || {
        let log = host.log();
        (log.contains("hourglass:{wt}:payload holds a string, not a hash") && log.contains("hourglass:{wt2}:seq holds"))
            .then_some(())
    });
    // A few claim attempts later, the tasks are still all due, none lost.
    std::thread::sleep(Duration::from_millis(500));
    for t in ["wt", "wt2"] {
        let due: usize = c.zcard(key(t, "due")).unwrap();
        assert_eq!(due, 5, "{t}: tasks left the due set");
        assert_eq!(stat(&mut c, t, "succeeded"), 0);
    }
    let log = host.log();
    assert_eq!(log.matches("type faulted (claim)").count(), 2, "each fault is logged once:\n{log}");
    assert!(!log.contains("Redis is unreachable"), "a data fault was reported as an outage:\n{log}");
    let metrics = get(&addr, "/metrics").body;
    assert_eq!(sample(&metrics, "hourglass_type_faulted", &["type=\"wt\""]), Some(1.0));
    assert_eq!(sample(&metrics, "hourglass_type_faulted", &["type=\"wt2\""]), Some(1.0));
    let ready = get(&addr, "/readyz");
    assert_eq!(ready.status, 200, "one type's bad data must not make the host unready: {}", ready.body);
    assert!(ready.body.contains("faulted: wt: claim: hourglass:{wt}:payload"), "{}", ready.body);
    let dashboard = get(&addr, "/").body;
    assert!(dashboard.contains("Faulted types") && dashboard.contains("hourglass:{wt}:payload holds a string"));
    let stats = std::process::Command::new(env!("CARGO_BIN_EXE_hourglass"))
        .args(["--redis", &redis.url(), "stats"])
        .output()
        .unwrap();
    let stats = String::from_utf8_lossy(&stats.stdout);
    assert!(stats.contains("FAULTED wt: hourglass:{wt}:payload holds a string, not a hash"), "{stats}");

    // The fix: the bad values go; the types resume by themselves.
    let _: () = c.del(key("wt", "payload")).unwrap();
    let _: () = c.del(key("wt2", "seq")).unwrap();
    wait_for("the fixed types to run", wait, || {
        (stat(&mut c, "wt", "succeeded") == 5 && stat(&mut c, "wt2", "succeeded") == 5).then_some(())
    });
    wait_for("the fault to clear", wait, || host.log().contains("type fault (claim) cleared").then_some(()));
    let metrics = get(&addr, "/metrics").body;
    assert_eq!(sample(&metrics, "hourglass_type_faulted", &["type=\"wt\""]), Some(0.0));
}
