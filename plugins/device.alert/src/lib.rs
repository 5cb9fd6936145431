//! Reports a device alert raised by `device.offline`.

use hourglass_sdk::{Failure, Task, warn};
use serde::Deserialize;

#[derive(Deserialize)]
struct Alert {
    device: String,
    #[serde(default)]
    reason: Option<String>,
}

fn handle(task: Task) -> Result<(), Failure> {
    let alert: Alert = task.json()?;
    let reason = alert.reason.as_deref().unwrap_or("unknown");
    warn!("ALERT: device {} is offline ({reason})", alert.device);
    Ok(())
}

hourglass_sdk::export_handler!(handle);
