//! `hourglass plugin check`: what a plugin implements and imports, and what a run of it costs.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;

use crate::config::Config;
use crate::runtime::{Compiler, Component, Handler, Runtime, RuntimeOptions};
use crate::task::ClaimedTask;
use crate::task_type::TaskType;

/// Runs of each kind the cost is measured over, after as many unmeasured ones.
const RUNS: u32 = 200;
/// A run that takes longer than this ends the measurement: the plugin waits on something.
const RUN_DEADLINE: Duration = Duration::from_secs(2);
/// Warm runs per instance: enough that instantiation is out of the figure.
const WARM_REUSE: u32 = 1000;

pub(super) async fn check(config: &Config, file: &Path, payload: &str) -> Result<ExitCode> {
    let runtime = Runtime::new(RuntimeOptions {
        cache_dir: Some(config.runner.cache_dir.clone()),
        compile_limits: config.runner.compile_limits(),
        ..RuntimeOptions::new(Compiler::this_binary())
    })?;
    let report = runtime.check(file)?;
    print!("{report}");
    if !report.fits() {
        return Ok(ExitCode::FAILURE);
    }
    let component = runtime.load(file)?;
    let task_type = type_of(file);
    println!("cost:    {}", cost(config, &component, &task_type, payload.as_bytes()).await);
    Ok(ExitCode::SUCCESS)
}

/// The task type a plugin file serves by its name (`order.timeout.wasm`), else `check`.
fn type_of(file: &Path) -> TaskType {
    crate::registry::file_stem(file).parse().unwrap_or_else(|_| "check".parse().expect("a valid type name"))
}

/// One line: the wall time of a run in each way a task can get its instance
/// (a kept one reset to its checkpoint, the default; a new one; a warm one
/// kept as it is), one run at a time under the type's policy from the
/// config, outbound HTTP denied.
async fn cost(config: &Config, component: &Component, task_type: &TaskType, payload: &[u8]) -> String {
    let mut policy = config.policy(task_type).sandbox();
    policy.timeout = policy.timeout.min(RUN_DEADLINE);
    // A check sends nothing anywhere: 400 runs must not call a real service
    // (follow-ups are only buffered, never committed, so they may stay).
    policy.allowed_outbound_hosts = Default::default();
    let handler = |reuse: u32, reset: bool| {
        let mut p = policy.clone();
        p.instance_reuse = reuse;
        p.instance_reset = reset;
        Handler::new(component.clone(), task_type.as_str(), &p, Arc::new(BTreeMap::new()))
    };
    let task = ClaimedTask {
        task_type: task_type.clone(),
        id: b"check".to_vec(),
        payload: payload.to_vec(),
        attempt: 1,
        due_ms: 0,
        token: 0,
        claim: 0,
    };
    let handlers = [handler(0, true), handler(0, false), handler(WARM_REUSE, false)];
    let mut failed = 0;
    let mut per_run = Vec::new();
    for handler in &handlers {
        for _ in 0..RUNS {
            handler.run(&task, Default::default()).await;
        }
        let started = Instant::now();
        for _ in 0..RUNS {
            let run_started = Instant::now();
            if handler.run(&task, Default::default()).await.result.is_err() {
                failed += 1;
            }
            if run_started.elapsed() >= RUN_DEADLINE {
                return format!("not measured: a run took {}s or more", RUN_DEADLINE.as_secs());
            }
        }
        per_run.push(started.elapsed().as_secs_f64() * 1e6 / f64::from(RUNS));
    }
    let failures = if failed > 0 {
        format!("; {failed} of {} runs failed with this payload (--payload sets it)", 3 * RUNS)
    } else {
        String::new()
    };
    let reset = match component.reset_refused() {
        None => match component.warm_up_refused() {
            None => format!("{:.1} µs a run with a fresh state (a kept instance reset, the default)", per_run[0]),
            Some(why) => format!(
                "{:.1} µs a run with a fresh state (a kept instance reset; its warm-up call cannot be used: {why})",
                per_run[0]
            ),
        },
        Some(why) => format!("instances cannot be reset ({why}), so each run gets a new one"),
    };
    format!(
        "{reset}, {:.1} µs in a new instance (instance_reset = false), {:.1} µs in a warm one (instance_reuse); \
         wall time of {RUNS} runs each, one at a time, outbound HTTP denied{failures}",
        per_run[1], per_run[2]
    )
}
