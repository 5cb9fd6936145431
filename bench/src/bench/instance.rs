//! The `instance` scenario: a new instance per run, a kept one reset after each, and a warm one, for one plugin, with nothing else in the way.

use std::collections::BTreeMap;

use hourglass::runtime::{Compiler, Handler, Runtime, RuntimeOptions};
use hourglass::task::ClaimedTask;

use super::*;

/// Rounds the runs are split into, the three kinds taking turns, so that a
/// machine whose speed drifts weighs on all alike.
const ROUNDS: u64 = 5;

/// What one plugin's runs cost in host CPU, one run at a time (or
/// `--parallel` at a time) on the handler threads: with a new instance each
/// (`fresh`, `instance_reset = false`), with a kept instance reset to its
/// checkpoint after each (`reset`, the default), and with a warm one kept as
/// it is for `--reuse` runs (64 unless given). No Redis, claims, settles or
/// other work: the differences are what making and freeing an instance, or
/// resetting one, costs, the floor under what `burst` shows between them. With `--hosts N` the
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
    let handlers = |instance_reuse: u32, instance_reset: bool| -> Vec<Handler> {
        let mut policy = config.policy(&task_type).sandbox();
        policy.instance_reuse = instance_reuse;
        policy.instance_reset = instance_reset;
        components.iter().map(|c| Handler::new(c.clone(), TYPE, &policy, Arc::new(BTreeMap::new()))).collect()
    };
    let (fresh, reset, warm) = (handlers(0, false), handlers(0, true), handlers(reuse, false));
    let payload = args.payload.clone().unwrap_or_default().into_bytes();

    // Runs of each lane in each round.
    let per_round = (runs / ROUNDS / lanes).max(1);
    // CPU and wall time of the fresh, reset and warm runs.
    let mut cpu = [0.0; 3];
    let mut wall = [Duration::ZERO; 3];
    let mut failed = 0;
    let kinds = [&fresh, &reset, &warm];
    // A first round of each, unmeasured: the pool's slots and the kept instances fill.
    for handlers in kinds {
        runs_of(&runtimes, handlers, lanes, &task_type, &payload, per_round.min(1000)).await?;
    }
    for _ in 0..ROUNDS {
        for (i, handlers) in kinds.iter().enumerate() {
            let (c, w, f) = runs_of(&runtimes, handlers, lanes, &task_type, &payload, per_round).await?;
            (cpu[i], wall[i], failed) = (cpu[i] + c, wall[i] + w, failed + f);
        }
    }
    let measured = (per_round * ROUNDS * lanes) as f64;
    let [fresh_us, reset_us, warm_us] = cpu.map(|c| c / measured);
    let [fresh_wall, reset_wall, warm_wall] = wall.map(|w| w.as_secs_f64() * 1e6 / measured);
    let reset_refused = components[0].reset_refused().map(str::to_owned);
    report(
        args.json,
        "instance: a new instance each run, a kept one reset after each (the default) and --reuse, no Redis",
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
            "reset_cpu_us_per_run": round2(reset_us),
            "fresh_over_reuse_us": round2(fresh_us - warm_us),
            "ratio": round2(fresh_us / warm_us),
            "reset_over_reuse": round2(reset_us / warm_us),
            "fresh_wall_us_per_run": round2(fresh_wall),
            "reset_wall_us_per_run": round2(reset_wall),
            "reuse_wall_us_per_run": round2(warm_wall),
            "reset_refused": reset_refused,
            "cores": std::thread::available_parallelism().map_or(1, |n| n.get()),
        }),
    );
    if failed > 0 {
        bail!(
            "{failed} of {} runs of {} failed: does it accept {}? (--payload sets it)",
            3 * per_round * ROUNDS * lanes,
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
                    failed += u64::from(handler.run(&task, Default::default()).await.result.is_err());
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
