//! Heartbeat watchdog: every heartbeat re-schedules this task further into the
//! future, so if it ever runs, the device went silent.

use hourglass_sdk::{Failure, Task, now_ms, warn};

fn handle(task: Task) -> Result<(), Failure> {
    let device = task.id_str().into_owned();
    warn!("device {device} missed its heartbeat: it is offline");
    let payload = serde_json::json!({ "device": device, "reason": "missed heartbeat" });
    // Same id, so a burst of misses still raises one alert per device.
    hourglass_sdk::schedule("device.alert", &task.id, payload.to_string(), now_ms())?;
    Ok(())
}

hourglass_sdk::export_handler!(handle);
