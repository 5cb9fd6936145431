//! The store as a Rust application's client: schedule, postpone, show, cancel and a workflow group.
//!
//! `cargo run -p hourglass-store --example client -- redis://127.0.0.1:6379`
//! (`cargo test -p hourglass-store` compiles it, so clients/README.md's lines, which are these,
//! keep building.) It writes under the `hourglass` prefix of the server given.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hourglass_store::group::{Callback, FireWhen, GroupRef};
use hourglass_store::{GroupRefusal, KeyPrefix, NewChild, ScheduleMode, Store};

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let url = std::env::args().nth(1).unwrap_or_else(|| "redis://127.0.0.1:6379".into());
    let now_ms = || SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);

    let prefix: KeyPrefix = "hourglass".parse().map_err(anyhow::Error::msg)?;
    // The hosts' `[types.device.offline] shards = 3`: ids are routed as the hosts route them.
    let store = Store::connect(&url, &prefix).await?.with_type_shards(&"device.offline".parse()?, 3);

    let t = "order.timeout".parse()?;
    store
        .schedule(
            &t,
            b"o-42",
            now_ms() + 900_000,
            Some(b"{\"order_id\":\"o-42\",\"amount\":1}"),
            ScheduleMode::IfAbsent,
        )
        .await?;
    store.reschedule(&t, b"o-42", Some(Duration::from_secs(600))).await?; // postpone; None = run now
    println!("{:?}", store.show(&t, b"o-42").await?.state);
    println!("{:?}", store.cancel(&t, b"o-42").await?); // Scheduled, Running { holder } or Unknown

    // A debounced alarm on a sharded type: only ever moved later.
    let d = "device.offline".parse()?;
    store.schedule(&d, b"d-7", now_ms() + 30_000, None, ScheduleMode::OnlyLater).await?;
    store.pause(&d, Some(Duration::from_secs(5))).await?;
    store.resume(&d).await?;
    println!("{} device.offline task(s) waiting", store.stats(&d).await?.scheduled_later);
    store.cancel(&d, b"d-7").await?;

    // A workflow group: its callback runs once, when every child ended.
    let g = GroupRef { callback_type: "order.ship".parse()?, id: "o-17".parse()? };
    let callback = Callback { id: "o-17".into(), payload: String::new(), when: FireWhen::AllEnded, replace: true };
    store.group_open(&g, &callback).await?;
    let child =
        NewChild { task_type: "order.charge".parse()?, id: "o-17".into(), payload: b"{}".to_vec(), due_ms: now_ms() };
    store.group_add(&g, &[child]).await?;
    store.group_seal(&g).await?;
    // Too late now: the refusal is typed.
    let late =
        NewChild { task_type: "order.charge".parse()?, id: "o-18".into(), payload: Vec::new(), due_ms: now_ms() };
    match store.group_add(&g, &[late]).await {
        Err(e) => match GroupRefusal::of(&e) {
            Some(GroupRefusal::Closed(why)) => println!("refused: {why}"),
            _ => return Err(e),
        },
        Ok(_) => anyhow::bail!("a sealed group took a child"),
    }
    Ok(())
}
