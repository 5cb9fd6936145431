//! `hourglass-bench` (what `hourglass bench` runs): one tiny run of each scenario, checking correctness only
//! (nothing lost, nothing run twice, the JSON has its fields). Performance is
//! measured by the benchmark itself (BENCHMARKS.md), never asserted here.

#[path = "../../tests/support/mod.rs"]
mod support;

use std::process::Command;

use serde_json::Value;
use support::{RedisServer, plugin};

/// Runs `hourglass-bench <args> --json` and returns one JSON object per line of stdout.
fn bench(redis: Option<&RedisServer>, args: &[&str]) -> Vec<Value> {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hourglass-bench"));
    cmd.args(args).arg("--json").arg("--plugin").arg(plugin("noop"));
    match redis {
        Some(r) => cmd.arg("--redis").arg(r.url()),
        None => cmd.arg("--spawn-redis"),
    };
    let out = cmd.env_remove("HOURGLASS_REDIS_URL").env("HOURGLASS_LOG", "warn").output().expect("run hourglass-bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "bench {args:?} failed: {}\nstdout: {stdout}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"))).collect()
}

fn assert_clean(run: &Value, fields: &[&str]) {
    for f in fields {
        assert!(run.get(*f).is_some_and(|v| !v.is_null()), "{f} missing in {run}");
    }
    assert_eq!(run["lost"], 0, "tasks lost: {run}");
    assert_eq!(run["doubled"], 0, "tasks run twice: {run}");
}

#[test]
fn burst_runs_every_task_once() {
    let redis = RedisServer::start();
    let runs = bench(Some(&redis), &["burst", "--tasks", "2000"]);
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0]["scenario"], "burst");
    assert_eq!(runs[0]["tasks"], 2000);
    assert_clean(&runs[0], &["tasks_per_s", "seconds", "load_average"]);
    assert_costs(&runs[0]);
}

/// The per-task costs a burst reports were measured: every task took at least a claim and a settle.
fn assert_costs(run: &Value) {
    for f in ["redis_us_per_task", "redis_cpu_us_per_task", "host_cpu_us_per_task"] {
        assert!(run[f].as_f64().is_some_and(|v| v > 0.0), "{f} not measured: {run}");
    }
    let scripts = run["scripts_per_task"].as_f64().unwrap_or(0.0);
    assert!(scripts > 0.0 && scripts < 2.0, "claims and settles are batched, so under 2 scripts per task: {run}");
}

#[test]
fn burst_runs_with_the_config_files_concurrency() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("bench.toml");
    std::fs::write(&config, "[runner]\nconcurrency = 40\nbatch_size = 8\n[defaults]\nconcurrency = 20\n").unwrap();
    let runs = bench(None, &["--config", config.to_str().unwrap(), "burst", "--tasks", "2000"]);
    assert_eq!(
        (&runs[0]["concurrency"], &runs[0]["type_concurrency"], &runs[0]["batch_size"]),
        (&40.into(), &20.into(), &8.into())
    );
    assert_clean(&runs[0], &["tasks_per_s"]);
    let runs = bench(None, &["--config", config.to_str().unwrap(), "burst", "--tasks", "2000", "--concurrency", "64"]);
    assert_eq!((&runs[0]["concurrency"], &runs[0]["type_concurrency"]), (&64.into(), &64.into()), "the flag wins");
}

#[test]
fn burst_with_instance_reuse_on_a_spawned_redis() {
    let runs = bench(None, &["burst", "--tasks", "2000", "--reuse", "16"]);
    assert_eq!(runs[0]["instance_reuse"], 16);
    assert_clean(&runs[0], &["tasks_per_s"]);
}

#[test]
fn burst_on_three_hosts_and_four_types_shares_the_work() {
    let redis = RedisServer::start();
    let runs = bench(Some(&redis), &["burst", "--tasks", "3000", "--hosts", "3", "--types", "4"]);
    assert_eq!(runs[0]["hosts"], 3);
    assert_eq!(runs[0]["types"], 4);
    assert_clean(&runs[0], &["tasks_per_s"]);
    let per_host: Vec<u64> =
        runs[0]["acked_per_host"].as_array().expect("acked_per_host").iter().map(|v| v.as_u64().unwrap()).collect();
    assert_eq!(per_host.len(), 3, "{}", runs[0]);
    assert_eq!(per_host.iter().sum::<u64>(), 3000, "every task acked by exactly one host: {}", runs[0]);
}

#[test]
fn burst_on_a_spawned_cluster_runs_every_task_once() {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hourglass-bench"));
    // Two types of three shards each: six slots, two on each master.
    let args = ["burst", "--tasks", "3000", "--types", "2", "--shards", "3", "--spawn-cluster", "--json", "--plugin"];
    cmd.args(args).arg(plugin("noop"));
    let out = cmd.env_remove("HOURGLASS_REDIS_URL").env("HOURGLASS_LOG", "warn").output().expect("run hourglass-bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}\n{stdout}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    let run: Value = serde_json::from_str(stdout.trim()).expect("one JSON line");
    assert_eq!(run["redis"], "cluster");
    assert_eq!((run["types"].as_u64(), run["shards"].as_u64()), (Some(2), Some(3)));
    assert_clean(&run, &["tasks_per_s", "busiest_master_cpu_us_per_task"]);
    assert_costs(&run);
}

#[test]
fn footprint_refuses_a_cluster_with_a_clear_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_hourglass-bench"))
        .args(["footprint", "--spawn-cluster", "--plugin"])
        .arg(plugin("noop"))
        .env("HOURGLASS_LOG", "warn")
        .output()
        .expect("run hourglass-bench");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("single server, not a cluster"), "{stderr}");
}

#[test]
fn steady_reports_lateness_percentiles() {
    let redis = RedisServer::start();
    let runs = bench(Some(&redis), &["steady", "--rate", "500", "--duration", "2"]);
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0]["tasks"], 1000);
    assert_clean(&runs[0], &["lateness_p50_ms", "lateness_p99_ms", "lateness_p999_ms", "lateness_max_ms"]);
}

/// A long run leaves nothing behind that grows with the tasks it ran: the
/// metrics' histograms fold their samples into buckets even without the
/// admin server (the bench runs none). They once kept every sample, about
/// 45 bytes a task: some 8 MiB over this run's last 180,000 tasks.
#[test]
fn steady_keeps_host_memory_flat() {
    let redis = RedisServer::start();
    let runs = bench(Some(&redis), &["steady", "--rate", "20000", "--duration", "12"]);
    assert_clean(&runs[0], &["rss_growth_mib"]);
    let growth = runs[0]["rss_growth_mib"].as_f64().unwrap();
    assert!(growth < 3.0, "host RSS grew {growth} MiB over the last three quarters of the run: {}", runs[0]);
}

#[test]
fn backlog_leaves_far_future_tasks_alone() {
    let redis = RedisServer::start();
    let runs = bench(Some(&redis), &["backlog", "--tasks", "2000", "--backlog", "20000"]);
    assert_clean(&runs[0], &["empty_tasks_per_s", "backlog_tasks_per_s", "ratio"]);
    assert_eq!(runs[0]["backlog_untouched"], true);
}

#[test]
fn backlog_scale_measures_both_queues_and_leaves_the_backlog_alone() {
    let redis = RedisServer::start();
    let args = [
        "backlog-scale",
        "--backlog",
        "20000",
        "--tasks",
        "3000",
        "--rate",
        "300",
        "--duration",
        "2",
        "--payload-bytes",
        "100",
    ];
    let runs = bench(Some(&redis), &args);
    let run = &runs[0];
    assert_eq!(run["scenario"], "backlog-scale");
    assert_clean(
        run,
        &[
            "load_seconds",
            "empty_lateness_p99_ms",
            "backlog_lateness_p99_ms",
            "lateness_p99_ratio",
            "claim_cost_ratio",
            "drain_tasks_per_s",
            "drain_host_rss_peak_mib",
        ],
    );
    assert_eq!(run["backlog_untouched"], true, "{run}");
    let bare = run["redis_bytes_per_task"].as_f64().unwrap();
    let with_payload = run["redis_bytes_per_task_with_payload"].as_f64().unwrap();
    // A sorted-set member costs more than its 16-byte id; a 100-byte payload at least its bytes.
    assert!(bare > 16.0, "{run}");
    assert!(with_payload >= bare + 100.0, "{run}");
    for f in
        ["empty_claim_redis_us_per_task", "backlog_claim_redis_us_per_task", "backlog_payloads_claim_redis_us_per_task"]
    {
        assert!(run[f].as_f64().is_some_and(|v| v > 0.0), "{f} not measured: {run}");
    }
    // The drain's tasks were in Redis beside the backlog at some point.
    assert!(run["drain_redis_peak_mib"].as_f64().unwrap() > 0.0, "{run}");
}

#[test]
fn footprint_measures_redis_and_rss() {
    let redis = RedisServer::start();
    let runs = bench(Some(&redis), &["footprint", "--tasks", "2000", "--footprint-tasks", "20000"]);
    assert_eq!(runs[0]["redis_tasks"], 20000);
    assert_eq!(runs[0]["cache"], "warm");
    assert_clean(&runs[0], &["redis_bytes_per_task", "rss_start_peak_mib", "rss_idle_mib", "rss_peak_mib"]);
}

#[test]
fn footprint_cold_compiles_every_plugin_on_a_first_start() {
    let redis = RedisServer::start();
    let runs = bench(Some(&redis), &["footprint", "--cold", "--tasks", "2000", "--footprint-tasks", "20000"]);
    assert_eq!(runs[0]["cache"], "cold");
    assert_clean(&runs[0], &["rss_start_peak_mib", "rss_idle_mib", "rss_peak_mib"]);
}

#[test]
fn reload_serves_the_new_version_without_losing_tasks() {
    let redis = RedisServer::start();
    let runs = bench(Some(&redis), &["reload", "--rate", "500", "--duration", "3"]);
    assert_clean(&runs[0], &["reload_ms", "new_version"]);
}

#[test]
fn hostile_runs_every_ordinary_task_once_beside_a_type_that_blocks_every_run() {
    let redis = RedisServer::start();
    let chaos = support::test_plugin("chaos");
    let runs = bench(
        Some(&redis),
        &["hostile", "--tasks", "2000", "--concurrency", "16", "--hostile-plugin", chaos.to_str().unwrap()],
    );
    assert_eq!(runs[0]["scenario"], "hostile");
    // --concurrency sets the global and the per-type limit alike: half is left for the hostile type.
    assert_eq!(runs[0]["hostile_slots"], 8);
    assert_clean(&runs[0], &["alone_tasks_per_s", "beside_hostile_tasks_per_s", "ratio", "hostile_runs_cut"]);
    // The hostile tasks never finish; the bench removes them afterwards.
    let mut c = redis.client();
    let left: i64 = redis::cmd("EXISTS").arg("hourglass-bench:{hostile}:due").query(&mut c).unwrap();
    assert_eq!(left, 0, "the bench leaves no hostile keys behind");
}

#[test]
fn groups_completes_every_group_once_with_the_right_counts() {
    let redis = RedisServer::start();
    let runs = bench(Some(&redis), &["groups", "--tasks", "2500"]);
    assert_eq!(runs[0]["scenario"], "groups");
    // 1000 children per group: two full groups and one of 500.
    assert_eq!(runs[0]["groups"], 3);
    assert_eq!(runs[0]["groups_completed"], 3);
    assert_eq!(runs[0]["groups_counts_right"], 3);
    assert_eq!(runs[0]["callbacks"], 3);
    assert_clean(
        &runs[0],
        &["ratio", "group_redis_us_per_child", "group_redis_bytes_per_child", "plain_redis_bytes_per_task"],
    );
    let plain = runs[0]["plain_redis_bytes_per_task"].as_f64().unwrap();
    let child = runs[0]["group_redis_bytes_per_child"].as_f64().unwrap();
    assert!(child > plain, "a waiting child holds more than a plain task (its mark and pending entry): {}", runs[0]);
    // The bench leaves none of its groups behind.
    let mut c = redis.client();
    let left: Vec<String> = redis::cmd("KEYS").arg("hourglass-bench:{bench.done}:*").query(&mut c).unwrap();
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// `bench/many-core`: a bundle of this build's binaries, made by bundle.sh and
/// run by its run.sh from a copy elsewhere (as on a server with no
/// toolchain), passes its quick start and gives a clean burst for every run.
#[test]
fn a_many_core_bundle_runs_the_quick_start_and_every_burst_from_anywhere() {
    let bench_bin = std::path::PathBuf::from(env!("CARGO_BIN_EXE_hourglass-bench"));
    let bin_dir = bench_bin.parent().expect("the bench binary's folder");
    assert!(
        bin_dir.join("hourglass").is_file(),
        "{}: no hourglass binary beside hourglass-bench (cargo build -p hourglass, or test with --workspace)",
        bin_dir.display()
    );
    let root = support::workspace_root();
    let tmp = tempfile::tempdir().unwrap();
    let bundle = tmp.path().join("bundle");
    let made = Command::new("bash")
        .arg(root.join("bench/many-core/bundle.sh"))
        .arg(&bundle)
        .arg("--bin-dir")
        .arg(bin_dir)
        .arg("--plain")
        .output()
        .expect("run bundle.sh");
    assert!(made.status.success(), "bundle.sh: {}", String::from_utf8_lossy(&made.stderr));

    // The quick start's managed redis-server takes a free port of its own.
    let port = support::free_port();
    let out_dir = tmp.path().join("out");
    let ran = Command::new("bash")
        .arg(bundle.join("run.sh"))
        .arg("--quick")
        .current_dir(tmp.path())
        .env("TASKS", "1500")
        .env("QS_PORT", port.to_string())
        .env("OUT", &out_dir)
        .env_remove("HOURGLASS_REDIS_URL")
        .env("HOURGLASS_LOG", "warn")
        .output()
        .expect("run run.sh");
    let log = std::fs::read_to_string(out_dir.join("run.log")).unwrap_or_default();
    assert!(ran.status.success(), "run.sh: {}\n{log}", String::from_utf8_lossy(&ran.stderr));

    let lines = std::fs::read_to_string(out_dir.join("many-core.jsonl")).expect("many-core.jsonl");
    let runs: Vec<Value> =
        lines.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"))).collect();
    let runs_named: Vec<&str> = runs.iter().map(|r| r["run"].as_str().unwrap()).collect();
    let bursts = [
        "default",
        "4 hosts, cores/4 handler threads each",
        "1 process",
        "1 process, 4x the slots",
        "4 processes, cores/4 handler threads each",
        "default reuse",
        "2+2",
        "2+2 reuse",
        "cores+cores",
        "cores+cores reuse",
        "4 hosts",
    ];
    let instances = ["instance", "instance, cores lanes, 1 engine", "instance, cores lanes, several engines"];
    assert_eq!(runs_named[..2], ["machine", "quickstart"]);
    assert_eq!(runs_named[2..13], bursts);
    assert_eq!(runs_named[13..], instances);
    let machine = &runs[0];
    assert_eq!(machine["cores"].as_u64(), std::thread::available_parallelism().ok().map(|n| n.get() as u64));
    let quick_start = &runs[1];
    assert_eq!(quick_start["ok"], true, "{quick_start}\n{log}");
    assert_eq!(quick_start["plugins_refused"], 0, "{quick_start}\n{log}");
    for run in &runs[2..13] {
        let result = &run["result"];
        assert_eq!(result["tasks"], 1500, "{run}\n{log}");
        if result["scenario"] == "processes" {
            // Separate `hourglass run` processes: every task succeeded once (a settle counts one).
            assert_eq!(result["succeeded"].as_u64(), Some(1500), "{run}\n{log}");
            assert!(result["host_cpu_us_per_task"].is_f64() && result["seconds"].is_f64(), "{run}");
        } else {
            assert_clean(result, &["host_cpu_us_per_task", "worker_threads", "host_threads"]);
        }
    }
    let cores = machine["cores"].as_u64();
    assert_eq!(
        (runs[10]["result"]["worker_threads"].as_u64(), runs[10]["result"]["host_threads"].as_u64()),
        (cores, cores)
    );
    let quarter = cores.map(|n| (n / 4).max(1));
    assert_eq!((runs[3]["result"]["hosts"].as_u64(), runs[3]["result"]["worker_threads"].as_u64()), (Some(4), quarter));
    assert_eq!((runs[6]["result"]["hosts"].as_u64(), runs[6]["result"]["worker_threads"].as_u64()), (Some(4), quarter));
    assert_eq!(runs[7]["result"]["instance_reuse"], 64);
    assert_eq!(runs[12]["result"]["hosts"], 4);
    for run in &runs[13..] {
        assert_eq!(run["result"]["failed"], 0, "{run}\n{log}");
        assert!(run["result"]["fresh_cpu_us_per_run"].is_f64(), "{run}");
    }
    assert_eq!(runs[14]["result"]["parallel"].as_u64(), cores, "{}", runs[14]);
    assert_eq!(runs[15]["result"]["engines"], 2, "at least two engines: {}", runs[15]);
}

#[test]
fn instance_compares_fresh_and_warm_runs_and_needs_no_redis() {
    let out = Command::new(env!("CARGO_BIN_EXE_hourglass-bench"))
        .args(["instance", "--tasks", "1000", "--reuse", "8", "--json", "--redis", "redis://127.0.0.1:1", "--plugin"])
        .arg(plugin("noop"))
        .env("HOURGLASS_LOG", "warn")
        .output()
        .expect("run hourglass-bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}\n{stdout}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    let run: Value = serde_json::from_str(stdout.trim()).expect("one JSON line");
    assert_eq!(run["scenario"], "instance");
    assert_eq!(
        (run["runs"].as_u64(), run["instance_reuse"].as_u64(), run["failed"].as_u64()),
        (Some(1000), Some(8), Some(0))
    );
    for field in [
        "fresh_cpu_us_per_run",
        "reset_cpu_us_per_run",
        "reuse_cpu_us_per_run",
        "fresh_over_reuse_us",
        "ratio",
        "reset_over_reuse",
        "fresh_wall_us_per_run",
        "reset_wall_us_per_run",
    ] {
        assert!(run[field].is_f64(), "{field}: {run}");
    }
    // noop's instances can be reset: the kept instances were checkpointed.
    assert!(run["reset_refused"].is_null(), "{run}");
}

#[test]
fn instance_spreads_parallel_lanes_over_engines() {
    let runs = bench(None, &["instance", "--tasks", "400", "--parallel", "4", "--hosts", "2", "--worker-threads", "2"]);
    let run = &runs[0];
    assert_eq!(
        (run["runs"].as_u64(), run["parallel"].as_u64(), run["engines"].as_u64(), run["worker_threads"].as_u64()),
        (Some(400), Some(4), Some(2), Some(2)),
        "{run}"
    );
    assert_eq!(run["failed"], 0, "{run}");
}

#[test]
fn instance_with_more_engines_than_fit_names_the_setting_to_lower() {
    // Each engine reserves its pool's address space (about 8 TiB at the shipped
    // concurrency): 64 of them cannot fit in one process's 128 TiB.
    let out = Command::new(env!("CARGO_BIN_EXE_hourglass-bench"))
        .args(["instance", "--hosts", "64", "--tasks", "10", "--plugin"])
        .arg(plugin("noop"))
        .env("HOURGLASS_LOG", "warn")
        .output()
        .expect("run hourglass-bench");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("64 engines (--hosts) do not fit: a smaller --concurrency reserves less"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
}

/// `instance` with `--payload` runs a plugin that needs one (order.timeout
/// wants an order), and without it fails saying what the runs were given.
#[test]
fn instance_gives_each_run_the_payload_and_fails_naming_a_plugin_whose_runs_fail() {
    let instance = |payload: Option<&str>| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_hourglass-bench"));
        cmd.args(["instance", "--tasks", "20", "--json", "--plugin"]).arg(plugin("order.timeout"));
        if let Some(p) = payload {
            cmd.args(["--payload", p]);
        }
        cmd.env("HOURGLASS_LOG", "warn").output().expect("run hourglass-bench")
    };
    let order = r#"{"order_id": 42, "amount": 19.90}"#;
    let out = instance(Some(order));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}\n{stdout}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    let run: Value = serde_json::from_str(stdout.trim()).expect("one JSON line");
    assert_eq!((run["failed"].as_u64(), run["payload_bytes"].as_u64()), (Some(0), Some(order.len() as u64)), "{run}");

    let out = instance(None);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("60 of 60 runs of") && stderr.contains("order.timeout.wasm failed"), "{stderr}");
    assert!(stderr.contains("does it accept an empty payload? (--payload sets it)"), "{stderr}");
}

/// `--payload` goes with every task, and the config's own `[types.noop]` grants
/// hold under the bench's keys: each chaos task schedules a follow-up into
/// `noop.out`, which only its written payload asks for and only the carried
/// `may_schedule` allows (a refused one fails the task, and the burst stalls).
#[test]
fn burst_writes_the_payload_and_keeps_the_configs_grants() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("bench.toml");
    std::fs::write(&config, "[types.noop]\nmay_schedule = [\"noop.out\"]\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_hourglass-bench"))
        .args(["--config", config.to_str().unwrap(), "burst", "--tasks", "500", "--json", "--redis", &redis.url()])
        .args(["--plugin", support::test_plugin("chaos").to_str().unwrap(), "--payload", "schedule:noop.out:f"])
        .env_remove("HOURGLASS_REDIS_URL")
        .env("HOURGLASS_LOG", "warn")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let run: Value = serde_json::from_slice(out.stdout.trim_ascii()).unwrap();
    assert_clean(&run, &["tasks_per_s", "seconds", "load_average"]);
    let mut c = redis.client();
    let followups: Vec<String> = redis::Commands::zrange(&mut c, "hourglass-bench:{noop.out}:due", 0, -1).unwrap();
    assert_eq!(followups, ["f"], "the tasks' payload asked for this follow-up");
}

#[test]
fn ingest_writes_every_kind_whole_and_reports_its_redis_cpu() {
    // Each kind checks it stored all its tasks (the run fails otherwise); here, that every row is there.
    let runs = bench(None, &["ingest", "--tasks", "600"]);
    assert_eq!(runs.len(), 1, "{runs:?}");
    let run = &runs[0];
    assert_eq!(run["scenario"], "ingest");
    let rows: Vec<(&String, &Value)> =
        run.as_object().unwrap().iter().filter(|(k, _)| k.as_bytes()[0].is_ascii_digit()).collect();
    for kind in ["raw ZADD+HSET", "Rust Store::schedule_many", "follow-ups delivered", "group children", "graph nodes"]
    {
        assert!(rows.iter().any(|(k, _)| k.contains(kind)), "no {kind} row: {run}");
    }
    for (kind, figure) in &rows {
        let text = figure.as_str().unwrap();
        assert!(text.starts_with("Redis CPU ") && text.contains("tasks/s"), "{kind}: {text}");
    }
    // What it could not run (a client's environment, BullMQ) it names, rather than leaving a row out silently.
    let missing = run["not_measured"].as_array().unwrap();
    if missing.is_empty() {
        assert_eq!(rows.len(), 12, "{run}");
    } else {
        assert!(rows.len() < 12, "rows left out but none named: {run}");
    }
}
