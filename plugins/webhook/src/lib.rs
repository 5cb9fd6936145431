//! Delivers a task's payload to a webhook: `POST <url>` with the payload as
//! the body and `Authorization: Bearer <token>`.
//!
//! Config (runner.toml, `[types."webhook"]`):
//!
//! ```toml
//! allowed_outbound_hosts = ["https://hooks.example.com"]
//! config = { url = "https://hooks.example.com/in", token = { env = "WEBHOOK_TOKEN" } }
//! ```
//!
//! Optional: `content_type` (default `application/json`). 2xx is success;
//! 429 and 5xx are retried, after `Retry-After` seconds when the server says
//! so; any other status fails permanently (the task is dead-lettered).

use hourglass_sdk::http::{Method, Request};
use hourglass_sdk::{Failure, Task, config, info};

fn handle(task: Task) -> Result<(), Failure> {
    // A missing url is a config mistake that a reload can fix: retry, don't dead-letter.
    let url = config("url").ok_or_else(|| Failure::error("webhook: no `url` in this type's config"))?;
    let content_type = config("content_type").unwrap_or_else(|| "application/json".to_owned());
    let mut request = Request::new(Method::Post, url.as_str())
        .header("content-type", content_type)
        // Lets the receiver drop duplicates: delivery is at least once.
        .header("idempotency-key", format!("{}:{}", task.task_type, task.id_str()))
        .header("x-hourglass-attempt", task.attempt.to_string())
        .body(task.payload.clone());
    if let Some(token) = config("token") {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let response = request.send()?;
    response.outcome("webhook")?;
    info!("delivered {} bytes to the webhook: {}", task.payload.len(), response.status);
    Ok(())
}

hourglass_sdk::export_handler!(handle);
