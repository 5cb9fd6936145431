//! Fails its first `fail_times` attempts, then succeeds: shows retries and backoff.

use hourglass_sdk::{Failure, Task, info};
use serde::Deserialize;

#[derive(Deserialize)]
struct Payload {
    #[serde(default)]
    fail_times: u32,
}

fn handle(task: Task) -> Result<(), Failure> {
    let p: Payload = task.json()?;
    if task.attempt <= p.fail_times {
        return Err(Failure::Error(format!("flaky failure on attempt {} of {}", task.attempt, p.fail_times)));
    }
    info!("succeeded on attempt {}", task.attempt);
    Ok(())
}

hourglass_sdk::export_handler!(handle);
