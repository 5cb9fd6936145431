//! The `groups` scenario: a burst whose every task is a workflow group's child, beside the same burst of plain tasks.
//!
//! What a group adds to a task: the join and schedule scripts when it is
//! added, its membership mark and its group's pending entry in Redis while it
//! waits, and at its end a report through the outbox to the group (one more
//! script, and a delivery marker kept for a day). The figures are per child,
//! beside the plain burst's per task.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use serde_json::{Value, json};

use hourglass::clock::now_ms;
use hourglass::group::{Callback, FireWhen, GroupId, GroupRef};
use hourglass::store::{NewChild, Sealed};
use hourglass::task_type::TaskType;

use super::{Bench, Burst, PREFIX, STALL, round3, task_id};
use crate::recorder::Recorder;
use crate::redis_ops;

/// The callback type of the bench's groups; no host serves it, so the
/// callbacks stay in its due set to be counted.
const DONE: &str = "bench.done";
/// Children per group.
const GROUP_SIZE: u64 = 1000;

fn group_ref(done: &TaskType, g: u64) -> Result<GroupRef> {
    Ok(GroupRef { callback_type: done.clone(), id: format!("g{g}").parse::<GroupId>()? })
}

impl Bench {
    /// Deletes every key of the callback type: its fixed keys, its groups and the delivery markers of the reports.
    async fn clear_groups(&self, done: &TaskType) -> Result<()> {
        redis_ops::unlink(&self.store, &self.all_keys(done)).await?;
        redis_ops::unlink_matching(&self.store, &format!("{PREFIX}:{{{done}}}:*")).await
    }

    pub(super) async fn groups(&self) -> Result<()> {
        if self.store.target().is_cluster() {
            bail!("groups measures one Redis server's memory: run it against a single server, not a cluster");
        }
        if self.task_types.len() != 1 || self.args.hosts != 1 {
            bail!("groups runs with one type and one host (--types 1 --hosts 1)");
        }
        let n = self.burst_size();
        let done: TaskType = DONE.parse()?;
        let child_type = self.task_types[0].clone();
        self.clear_groups(&done).await?;
        let far = now_ms() + 10 * 365 * 24 * 3600 * 1000;

        // 1. The plain burst: throughput and cost per task.
        let recorder = Recorder::new(n as usize, 1);
        let host = self.start_host(&recorder, &[]).await?;
        let plain = self.one_burst(n, &recorder).await?;
        host.stop().await?;
        self.clear().await?;

        // 2. Redis bytes of a waiting plain task, then of a waiting child.
        self.progress_line(&format!("groups: writing {n} plain tasks"));
        let before = redis_ops::used_memory(&self.store).await?;
        self.write_tasks(0..n, |_| far).await?;
        let plain_bytes = (redis_ops::used_memory(&self.store).await? - before) as f64 / n as f64;
        self.clear().await?;

        let groups = n.div_ceil(GROUP_SIZE);
        let before = redis_ops::used_memory(&self.store).await?;
        let work_before = redis_ops::server_work(&self.store).await?;
        let add_started = Instant::now();
        for g in 0..groups {
            self.progress_line(&format!("groups: adding children to group {g}/{groups}"));
            let group = group_ref(&done, g)?;
            let callback =
                Callback { id: format!("g{g}"), payload: String::new(), when: FireWhen::AllEnded, replace: true };
            self.store.group_open(&group, &callback).await?;
            let children: Vec<NewChild> = (g * GROUP_SIZE..((g + 1) * GROUP_SIZE).min(n))
                .map(|i| NewChild { task_type: child_type.clone(), id: task_id(i), payload: Vec::new(), due_ms: far })
                .collect();
            let added = self.store.group_add(&group, &children).await?;
            if !added.refused.is_empty() {
                bail!("group {group} refused {} children", added.refused.len());
            }
            if self.store.group_seal(&group).await? != Sealed::Sealed {
                bail!("group {group} did not stay open for its children");
            }
        }
        let add_seconds = add_started.elapsed().as_secs_f64();
        let work_after = redis_ops::server_work(&self.store).await?;
        let child_bytes = (redis_ops::used_memory(&self.store).await? - before) as f64 / n as f64;
        self.progress_done();

        // 3. The same burst, every task a child: all fall due at one instant.
        let recorder = Recorder::new(n as usize, 1);
        let host = self.start_host(&recorder, &[]).await?;
        let burst = self.one_burst(n, &recorder).await?;
        // The last report reaches its group after the last ack: wait for every group.
        let server_before = redis_ops::server_work(&self.store).await?;
        let mut last = (usize::MAX, Instant::now());
        loop {
            let open = self.store.groups_open(&done, groups as usize).await?.len();
            if open == 0 {
                break;
            }
            if open != last.0 {
                last = (open, Instant::now());
            } else if last.1.elapsed() > STALL {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let server_after = redis_ops::server_work(&self.store).await?;
        let groups_left = self.store.groups_open(&done, groups as usize).await?.len();
        host.stop().await?;
        let callbacks = redis_ops::zcard(&self.store, &self.store.keys(&done).due).await?;
        let mut counts_right = 0u64;
        for g in 0..groups {
            let view = self.store.group_show(&group_ref(&done, g)?).await?;
            let size = (n - g * GROUP_SIZE).min(GROUP_SIZE);
            if view.is_some_and(|v| v.state == "done" && v.succeeded == size && v.pending == 0) {
                counts_right += 1;
            }
        }
        // What an ended child leaves behind for a day: its report's delivery marker.
        let ended_bytes = (redis_ops::used_memory(&self.store).await? - before) as f64 / n as f64;
        self.clear().await?;
        self.clear_groups(&done).await?;

        let acked = (n - burst.lost) as f64;
        let after_ack_us = server_after.script_us - server_before.script_us;
        let group_burst = Burst {
            // Reports delivered after the last ack are the burst's work too.
            redis_us_per_task: burst.redis_us_per_task + after_ack_us / acked,
            scripts_per_task: burst.scripts_per_task
                + (server_after.script_calls - server_before.script_calls) as f64 / acked,
            redis_cpu_us_per_task: burst.redis_cpu_us_per_task + (server_after.cpu_us - server_before.cpu_us) / acked,
            ..burst
        };
        let mut m = self.common();
        m.insert("scenario".into(), json!("groups"));
        m.insert("tasks".into(), json!(n));
        m.insert("groups".into(), json!(groups));
        m.insert("group_size".into(), json!(GROUP_SIZE));
        m.insert("plain_tasks_per_s".into(), json!(plain.rate.round()));
        m.insert("group_tasks_per_s".into(), json!(group_burst.rate.round()));
        m.insert("ratio".into(), json!(round3(group_burst.rate / plain.rate)));
        m.insert("plain_redis_us_per_task".into(), json!(round3(plain.redis_us_per_task)));
        m.insert("group_redis_us_per_child".into(), json!(round3(group_burst.redis_us_per_task)));
        m.insert("plain_scripts_per_task".into(), json!(round3(plain.scripts_per_task)));
        m.insert("group_scripts_per_child".into(), json!(round3(group_burst.scripts_per_task)));
        m.insert("plain_host_cpu_us_per_task".into(), json!(round3(plain.host_cpu_us_per_task)));
        m.insert("group_host_cpu_us_per_child".into(), json!(round3(group_burst.host_cpu_us_per_task)));
        m.insert(
            "add_redis_us_per_child".into(),
            json!(round3((work_after.script_us - work_before.script_us) / n as f64)),
        );
        m.insert("add_children_per_s".into(), json!((n as f64 / add_seconds).round()));
        m.insert("plain_redis_bytes_per_task".into(), json!(plain_bytes.round()));
        m.insert("group_redis_bytes_per_child".into(), json!(child_bytes.round()));
        m.insert("ended_redis_bytes_per_child".into(), json!(ended_bytes.round()));
        m.insert("groups_completed".into(), json!(groups - groups_left as u64));
        m.insert("groups_counts_right".into(), json!(counts_right));
        m.insert("callbacks".into(), json!(callbacks));
        m.insert("lost".into(), json!(plain.lost + burst.lost));
        m.insert("doubled".into(), json!(plain.doubled + burst.doubled));
        self.report(
            &format!("groups: burst of {n} group children ({groups} groups) beside {n} plain tasks"),
            Value::Object(m),
        );
        if callbacks != groups || counts_right != groups {
            bail!("{groups} groups: {callbacks} callbacks scheduled, {counts_right} with the right counts");
        }
        Ok(())
    }
}
