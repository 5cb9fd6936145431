//! Succeeds and does nothing: measures the host's per-task overhead.

use hourglass_sdk::{Failure, Task};

fn handle(_task: Task) -> Result<(), Failure> {
    Ok(())
}

hourglass_sdk::export_handler!(handle);
