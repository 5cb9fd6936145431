//! Hosts running workflow groups: ten thousand children over three hosts with one killed, a Redis restart mid-group, and a handler fanning out within its grants.

use std::time::Duration;

use super::{WAIT, callback, group, summary};
use crate::support::{Host, RedisServer, key, now_ms, stat, store, test_plugin, ty, wait_for};
use hourglass::group::FireWhen;
use hourglass::store::{NewChild, Sealed};
use redis::Commands;

/// Three hosts run 10,000 children of one group; one host is killed mid-way.
/// A child adds a sibling at run time, a few children are dead-lettered, and
/// the callback type is served by no host, so its one scheduling stays visible.
#[test]
fn ten_thousand_children_over_three_hosts_one_killed_fire_the_callback_once() {
    const N: usize = 10_000;
    let server = RedisServer::start();
    let mut c = server.client();
    let config = "[runner]\nlease = \"2s\"\n[types.work]\nmay_schedule = [\"work\", \"done\"]\n";
    let plugins = [("work", test_plugin("chaos"))];
    let hosts: Vec<Host> = (0..3).map(|_| Host::start(&server, &plugins, config)).collect();
    let rt = crate::support::tokio_runtime();
    let s = rt.block_on(store(&server));
    let g = group("done", "big");
    rt.block_on(s.group_open(&g, &callback("big", FireWhen::AllEnded))).unwrap();
    // The children fall due once the group is sealed (the joiner runs first),
    // so the group completes at a child's end, not at the seal.
    let later = now_ms() + 4_000;
    let ok: Vec<String> = (0..N - 5).map(|i| format!("w-{i}")).collect();
    let mut kids: Vec<NewChild> = ok
        .iter()
        .map(|id| NewChild { task_type: ty("work"), id: id.clone(), payload: b"sleep:1".to_vec(), due_ms: later })
        .collect();
    for i in 0..4 {
        kids.push(NewChild {
            task_type: ty("work"),
            id: format!("doomed-{i}"),
            payload: b"permanent:no".to_vec(),
            due_ms: later,
        });
    }
    kids.push(NewChild {
        task_type: ty("work"),
        id: "joiner".into(),
        payload: b"join:done:big:work:late:ok".to_vec(),
        due_ms: now_ms(),
    });
    rt.block_on(s.group_add(&g, &kids)).unwrap();

    // The child added at run time must be waited for: seal only once it joined.
    wait_for("the joiner to add its sibling", WAIT, || {
        rt.block_on(s.group_show(&g)).unwrap().filter(|v| v.added == N as u64 + 1).map(|_| ())
    });
    assert_eq!(rt.block_on(s.group_seal(&g)).unwrap(), Sealed::Sealed);
    wait_for("a third of the children to end", WAIT, || {
        (stat(&mut c, "work", "succeeded") > (N / 3) as i64).then_some(())
    });
    hosts[1].signal("KILL");
    assert!(summary(&mut c, "done", "big").is_none(), "the callback waits for the children still running");

    let sum = wait_for("the callback", Duration::from_secs(180), || summary(&mut c, "done", "big"));
    assert_eq!(sum["added"].as_u64(), Some(N as u64 + 1));
    assert_eq!(sum["succeeded"].as_u64(), Some(N as u64 + 1 - 4), "every child but the doomed ones, the late one too");
    assert_eq!(sum["dead"].as_u64(), Some(4));
    assert_eq!(sum["cancelled"].as_u64(), Some(0));
    assert_eq!(stat(&mut c, "done", "groups_completed"), 1, "completed exactly once");
    let view = rt.block_on(s.group_show(&g)).unwrap().unwrap();
    assert_eq!((view.state.as_str(), view.pending), ("done", 0));
    let members: usize = redis::cmd("HLEN").arg(key("work", "member")).query(&mut c).unwrap();
    assert_eq!(members, 0, "every child left its group");
    drop(hosts);
}

/// Redis restarts (from its append-only file) while a group's children run:
/// nothing is lost, and the callback fires once with every child counted.
#[test]
fn a_redis_restart_mid_group_loses_no_child_and_no_callback() {
    let mut server = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let mut c = server.client();
    let config = "[runner]\nlease = \"2s\"\n";
    let host = Host::start(&server, &[("work", test_plugin("chaos"))], config);
    let rt = crate::support::tokio_runtime();
    let s = rt.block_on(store(&server));
    let g = group("done", "restart");
    rt.block_on(s.group_open(&g, &callback("restart", FireWhen::AllEnded))).unwrap();
    let kids: Vec<NewChild> = (0..400)
        .map(|i| NewChild {
            task_type: ty("work"),
            id: format!("r-{i}"),
            payload: b"sleep:20".to_vec(),
            due_ms: now_ms(),
        })
        .collect();
    rt.block_on(s.group_add(&g, &kids)).unwrap();
    rt.block_on(s.group_seal(&g)).unwrap();
    wait_for("some children to end", WAIT, || (stat(&mut c, "work", "succeeded") > 20).then_some(()));
    server.restart(&["--appendonly", "yes", "--appendfsync", "always"]);
    let mut c = server.client();
    let sum = wait_for("the callback", Duration::from_secs(180), || summary(&mut c, "done", "restart"));
    assert_eq!((sum["added"].as_u64(), sum["succeeded"].as_u64()), (Some(400), Some(400)));
    assert_eq!(stat(&mut c, "done", "groups_completed"), 1);
    drop(host);
}

/// A handler fans out through the SDK: opens a group, adds children, seals
/// it; all committed with its ack, and only where runner.toml grants it.
#[test]
fn a_handler_fans_out_and_the_grants_bound_it() {
    let server = RedisServer::start();
    let mut c = server.client();
    let config = "[admin]\nenabled = true\nlisten = \"127.0.0.1:0\"\n[types.fan]\nmay_schedule = [\"done\", \"work\"]\n\
                  [types.rogue]\nmay_schedule = [\"work\"]\n[types.work]\nevents = true\n";
    let plugins = [("fan", test_plugin("chaos")), ("work", test_plugin("chaos")), ("rogue", test_plugin("chaos"))];
    let host = Host::start(&server, &plugins, config);
    crate::support::schedule_now(&mut c, "fan", "f1", "fanout:done:g1:work:5:ok");
    let sum = wait_for("the callback", WAIT, || summary(&mut c, "done", "g1"));
    assert_eq!((sum["added"].as_u64(), sum["succeeded"].as_u64()), (Some(5), Some(5)));
    assert_eq!(sum["payload"], "from chaos");
    assert_eq!(stat(&mut c, "work", "succeeded"), 5);
    // Each child's completion event names its group.
    let events: redis::streams::StreamRangeReply = c.xrange_all(key("work", "events")).unwrap();
    assert_eq!(events.ids.len(), 5);
    for e in &events.ids {
        assert_eq!(e.get::<String>("group").as_deref(), Some("g1"), "{:?}", e.map);
    }

    // Without a grant for the callback's type the run fails, and nothing is opened.
    crate::support::schedule_now(&mut c, "rogue", "r1", "fanout:done:g2:work:5:ok");
    host.wait_log("may not schedule \"done\" tasks", WAIT);
    let rt = crate::support::tokio_runtime();
    let s = rt.block_on(store(&server));
    assert!(rt.block_on(s.group_show(&group("done", "g2"))).unwrap().is_none());
    let metrics = crate::support::get(&crate::support::admin_addr(&host), "/metrics").body;
    assert!(
        crate::support::sample(&metrics, "hourglass_groups_opened_total", &["type=\"done\""]).is_some_and(|v| v >= 1.0)
    );
    assert!(
        crate::support::sample(
            &metrics,
            "hourglass_groups_completed_total",
            &["type=\"done\"", "callback=\"callback\""]
        )
        .is_some_and(|v| v >= 1.0),
        "{metrics}"
    );

    // The dashboard: a group's page, and the open groups of its callback's type.
    let addr = crate::support::admin_addr(&host);
    let page = crate::support::get(&addr, "/group?type=done&group=g1");
    assert_eq!(page.status, 200);
    assert!(
        page.body.contains("data-state=done")
            && page.body.contains("5 succeeded · 0 dead · 0 cancelled · 0 pending, of 5 added")
            && page.body.contains("data-succeeded=5 style=\"width:100.00%\""),
        "{}",
        page.body
    );
    assert_eq!(crate::support::get(&addr, "/group?type=done&group=nope").status, 404);
    assert_eq!(crate::support::get(&addr, "/group?type=Bad&group=g1").status, 400);
    rt.block_on(s.group_open(&group("done", "still-open"), &callback("x", FireWhen::AllEnded))).unwrap();
    let listing = crate::support::get(&addr, "/?type=done").body;
    assert!(listing.contains("Open workflow groups") && listing.contains("still-open"), "{listing}");
    wait_for("the sampled gauge of open groups", WAIT, || {
        let metrics = crate::support::get(&addr, "/metrics").body;
        (crate::support::sample(&metrics, "hourglass_groups_open", &["type=\"done\""]) == Some(1.0)).then_some(())
    });
}
