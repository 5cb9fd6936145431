//! The `instance` scenario: a fresh instance per run against a warm one, for one plugin, with nothing else in the way.

use std::collections::BTreeMap;

use hourglass::runtime::{Compiler, Handler, Runtime, RuntimeOptions};
use hourglass::task::ClaimedTask;

use super::*;

/// Rounds the runs are split into, fresh and warm taking turns, so that a
/// machine whose speed drifts weighs on both alike.
const ROUNDS: u64 = 5;

/// What one plugin's runs cost in host CPU, one run at a time (or
/// `--parallel` at a time) on the handler threads, with a fresh instance
/// each and with `--reuse` (64 unless given). No Redis, claims, settles or
/// other work: the difference is what making and freeing an instance costs,
/// the floor under what `burst` shows between the two. With `--hosts N` the
/// lanes are spread over N engines, each with its own instance pool and its
/// share of the handler threads, as N hosts in one process would have them.
pub(super) async fn instance(args: &BenchArgs, config: &Config, plugin: &Path) -> Result<()> {
    let runs = args.tasks.unwrap_or(DEFAULT_TASKS).max(ROUNDS);
    let reuse = args.reuse.filter(|&n| n > 1).unwrap_or(64);
    let task_type: TaskType = TYPE.parse().map_err(anyhow::Error::msg)?;
    let threads = worker_threads(args, config);
    let engines = usize::from(args.hosts);
    let mut runtimes = Vec::with_capacity(engines);
    for _ in 0..engines {
        runtimes.push(
            Runtime::new(RuntimeOptions {
                cache_dir: None,
                // Each engine's pool reserves address space as a host's does:
                // many engines need a smaller --concurrency.
                max_instances: u32::try_from(concurrency(args, config)).unwrap_or(u32::MAX),
                max_memory: config.policy(&task_type).memory_limit.as_u64(),
                compiler: Compiler::this_binary(),
                compile_limits: config.runner.compile_limits(),
                worker_threads: (threads / engines).max(1),
            })
            .with_context(|| {
                format!("{engines} engines (--hosts) do not fit: a smaller --concurrency reserves less")
            })?,
        );
    }
    let components = runtimes.iter().map(|r| r.load(plugin)).collect::<Result<Vec<_>>>()?;
    // One handler per engine for every lane on it, as a type's runs share
    // theirs in a host (its warm instances included: at most 8 idle, so more
    // lanes than that also make fresh instances in the warm rounds, as a
    // host would).
    let lanes = u64::from(args.parallel);
    let handlers = |instance_reuse: u32| -> Vec<Handler> {
        let mut policy = config.policy(&task_type).sandbox();
        policy.instance_reuse = instance_reuse;
        components.iter().map(|c| Handler::new(c.clone(), TYPE, &policy, Arc::new(BTreeMap::new()))).collect()
    };
    let (fresh, warm) = (handlers(0), handlers(reuse));
    let payload = args.payload.clone().unwrap_or_default().into_bytes();

    // Runs of each lane in each round.
    let per_round = (runs / ROUNDS / lanes).max(1);
    let (mut fresh_cpu, mut warm_cpu, mut fresh_wall, mut warm_wall) = (0.0, 0.0, Duration::ZERO, Duration::ZERO);
    let mut failed = 0;
    // A first round of each, unmeasured: the pool's slots and the warm instances fill.
    runs_of(&runtimes, &fresh, lanes, &task_type, &payload, per_round.min(1000)).await?;
    runs_of(&runtimes, &warm, lanes, &task_type, &payload, per_round.min(1000)).await?;
    for _ in 0..ROUNDS {
        let (cpu, wall, f) = runs_of(&runtimes, &fresh, lanes, &task_type, &payload, per_round).await?;
        (fresh_cpu, fresh_wall, failed) = (fresh_cpu + cpu, fresh_wall + wall, failed + f);
        let (cpu, wall, f) = runs_of(&runtimes, &warm, lanes, &task_type, &payload, per_round).await?;
        (warm_cpu, warm_wall, failed) = (warm_cpu + cpu, warm_wall + wall, failed + f);
    }
    let measured = (per_round * ROUNDS * lanes) as f64;
    let fresh_us = fresh_cpu / measured;
    let warm_us = warm_cpu / measured;
    report(
        args.json,
        "instance: a fresh instance each run against --reuse, no Redis",
        json!({
            "scenario": "instance",
            "plugin": plugin.display().to_string(),
            "payload_bytes": payload.len(),
            "runs": per_round * ROUNDS * lanes,
            "parallel": lanes,
            "engines": engines,
            "worker_threads": threads,
            "instance_reuse": reuse,
            "failed": failed,
            "fresh_cpu_us_per_run": round2(fresh_us),
            "reuse_cpu_us_per_run": round2(warm_us),
            "fresh_over_reuse_us": round2(fresh_us - warm_us),
            "ratio": round2(fresh_us / warm_us),
            "fresh_wall_us_per_run": round2(fresh_wall.as_secs_f64() * 1e6 / measured),
            "reuse_wall_us_per_run": round2(warm_wall.as_secs_f64() * 1e6 / measured),
            "cores": std::thread::available_parallelism().map_or(1, |n| n.get()),
        }),
    );
    if failed > 0 {
        bail!(
            "{failed} of {} runs of {} failed: does it accept {}? (--payload sets it)",
            2 * per_round * ROUNDS * lanes,
            plugin.display(),
            match &args.payload {
                Some(text) => format!("the payload {text:?}"),
                None => "an empty payload".to_owned(),
            }
        );
    }
    Ok(())
}

/// `n` runs on each of `lanes` lanes, one after another per lane, all lanes
/// at once, lane `i` on engine `i % engines` with that engine's handler: the
/// process's CPU time and the wall time they took, and how many failed.
async fn runs_of(
    runtimes: &[Runtime],
    handlers: &[Handler],
    lanes: u64,
    task_type: &TaskType,
    payload: &[u8],
    n: u64,
) -> Result<(f64, Duration, u64)> {
    let (cpu, started) = (process_cpu_us(), Instant::now());
    let lanes: Vec<_> = (0..lanes)
        .map(|lane| {
            let engine = lane as usize % runtimes.len();
            let (handler, task_type, payload) = (handlers[engine].clone(), task_type.clone(), payload.to_vec());
            runtimes[engine].spawn(async move {
                let mut task = ClaimedTask {
                    task_type,
                    id: Vec::new(),
                    payload,
                    attempt: 1,
                    due_ms: now_ms(),
                    token: 1,
                    claim: 1,
                };
                let mut failed = 0;
                for i in 0..n {
                    task.id = task_id(lane * n + i).into_bytes();
                    failed += u64::from(handler.run(&task, None).await.result.is_err());
                }
                failed
            })
        })
        .collect();
    let mut failed = 0;
    for lane in lanes {
        failed += lane.await.context("the runs panicked")?;
    }
    Ok((process_cpu_us() - cpu, started.elapsed(), failed))
}
