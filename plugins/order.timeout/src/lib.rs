//! Cancels an order that was not paid in time (scheduled when the order was placed).
//!
//! With `order_service` in its config it calls
//! `POST {order_service}/orders/{order_id}/cancel` (bearer `token` when set):
//! 2xx is done, 429/5xx retried (honouring `Retry-After`), other 4xx permanent.
//! Without it, it only logs — so the quick start runs without an order service.

use hourglass_sdk::http::{Method, Request};
use hourglass_sdk::{Failure, Task, config, info};
use serde::Deserialize;

#[derive(Deserialize)]
struct Order {
    order_id: serde_json::Value,
    amount: serde_json::Value,
}

fn handle(task: Task) -> Result<(), Failure> {
    // Malformed payloads fail permanently: a retry would see the same bytes.
    let order: Order = task.json()?;
    let Some(service) = config("order_service") else {
        info!(
            "order {} (amount {}) was not paid in time: cancelled (log only: no order_service configured)",
            order.order_id, order.amount
        );
        return Ok(());
    };
    let id = match &order.order_id {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Number(n) => n.to_string(),
        other => return Err(Failure::permanent(format!("order_id must be a string or a number, not {other}"))),
    };
    let url = format!("{}/orders/{}/cancel", service.trim_end_matches('/'), encode(&id));
    let body = serde_json::json!({
        "order_id": order.order_id,
        "amount": order.amount,
        "reason": "payment window expired",
    });
    let mut request = Request::new(Method::Post, url.as_str())
        .json(&body)?
        .header("idempotency-key", format!("{}:{}", task.task_type, task.id_str()));
    if let Some(token) = config("token") {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let response = request.send()?;
    response.outcome("order service")?;
    info!(
        "order {} (amount {}) was not paid in time: cancelled at the order service ({})",
        order.order_id, order.amount, response.status
    );
    Ok(())
}

/// Percent-encodes everything but unreserved characters, for a path segment.
fn encode(segment: &str) -> String {
    let mut out = String::new();
    for b in segment.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

hourglass_sdk::export_handler!(handle);
