//! A hostile plugin's progress reports: a flood of them beside ordinary tasks is written a few times a
//! second, costs the host no memory beyond the documented bound, and fails nobody.

use std::time::Duration;

use super::containment::{hostile, noop_stream, wait_all_settled};
use crate::support::{Host, RedisServer, plugin, stat, test_plugin, wait_for};
use redis::Commands;

const LONG: Duration = Duration::from_secs(120);

#[test]
fn a_progress_flood_is_written_a_few_times_a_second_and_fails_nobody() {
    let redis = RedisServer::start();
    let host = Host::start(
        &redis,
        &[("noop", plugin("noop")), ("chaos", test_plugin("chaos"))],
        "[runner]\nconcurrency = 8\n[defaults]\nconcurrency = 4\nmemory_limit = \"16MiB\"\nhost_memory_limit = \"4MiB\"\n\
         [types.chaos]\ntimeout = \"60s\"\nmax_attempts = 1\nevents = true\nevents_maxlen = 100000\n",
    );
    let mut conn = redis.client();
    noop_stream(&mut conn, 200, 0);
    wait_all_settled(&mut conn, 200, 0);
    let rss_before = host.proc_status("VmRSS:");

    // Four handlers report a million times each, as fast as they can.
    let floods: Vec<(String, String)> =
        (0..4).map(|i| (format!("flood-{i}"), "progress-flood:1000000".to_owned())).collect();
    hostile(&mut conn, &floods);
    noop_stream(&mut conn, 2000, 3000);
    wait_for("the floods to end", LONG, || (stat(&mut conn, "chaos", "succeeded") == 4).then_some(()));
    wait_all_settled(&mut conn, 2200, 0);

    // Redis saw the latest report of each run at most once per 250 ms of its
    // run (plus the first): a few, not a million (none when the run ended
    // before the writer's turn: its settle keeps or drops the last one).
    let events: redis::streams::StreamRangeReply = conn.xrange_all("hourglass:{chaos}:events").unwrap();
    for (id, _) in &floods {
        let of_it: Vec<_> = events.ids.iter().filter(|e| e.get::<String>("id").as_deref() == Some(id)).collect();
        let reports = of_it.iter().filter(|e| e.get::<String>("outcome").as_deref() == Some("progress")).count();
        let end = of_it.iter().find(|e| e.get::<String>("outcome").as_deref() == Some("succeeded")).expect("ended");
        let ms = |f: &str| end.get::<i64>(f).unwrap_or_default();
        let ran_ms = ms("finished_ms") - ms("started_ms");
        let most = ran_ms / 250 + 2;
        assert!(reports <= most as usize, "{id}: {reports} reports stored in {ran_ms} ms of run");
    }
    let left: usize = conn.hlen("hourglass:{chaos}:progress").unwrap();
    assert_eq!(left, 0, "ended tasks kept their progress");

    // The documented bound (docs/sandbox.md): concurrency × (memory_limit +
    // host_memory_limit + a host call's transient copy), 8 × (16 + 4 + 16) MiB.
    let peak = host.proc_status("VmHWM:");
    let bound_kb = 8 * (16 + 4 + 16) * 1024;
    assert!(peak < rss_before + bound_kb, "peak RSS {peak} kB, {rss_before} kB before: over {bound_kb} kB");
}
