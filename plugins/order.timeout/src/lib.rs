//! Cancels an order that was not paid in time (scheduled when the order was placed).

use hourglass_sdk::{Failure, Task, info};
use serde::Deserialize;

#[derive(Deserialize)]
struct Order {
    order_id: serde_json::Value,
    amount: serde_json::Value,
}

fn handle(task: Task) -> Result<(), Failure> {
    // Malformed payloads fail permanently: a retry would see the same bytes.
    let order: Order = task.json()?;
    info!(
        "order {} (amount {}) was not paid in time: cancelled",
        order.order_id, order.amount
    );
    Ok(())
}

hourglass_sdk::export_handler!(handle);
