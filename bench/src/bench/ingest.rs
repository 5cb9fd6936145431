//! The `ingest` scenario: what scheduling costs Redis, per task, by every way a task gets in, side by side in the same minutes.
//!
//! Each kind writes the same N tasks (ids of 16 bytes, the same payload,
//! due in an hour) into a type of its own, and the kinds take turns, three
//! rounds: the machine's speed drifts, so only figures from the same minutes
//! compare. Redis CPU is the server's own (`INFO cpu` before and after); the
//! rate is tasks over the write's wall time. The clients run as their own
//! processes (Python's and Node's, from `clients/`; BullMQ where it is
//! installed, see shared/peers), timing their write alone, tasks built first;
//! the CLI row is the whole `hourglass schedule-many` process, start-up and
//! file reading included.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use hourglass::clock::now_ms;
use hourglass::graph::NodeSpec;
use hourglass::group::{Callback, FireWhen, GroupId, GroupRef};
use hourglass::store::{NewChild, NewTask, ScheduleMode, encode_followup};
use hourglass::task_type::TaskType;

use super::{Bench, PREFIX, find_file, round2, task_id};
use crate::redis_ops;

/// Tasks of each kind's run, unless `--tasks` says.
const DEFAULT_TASKS: u64 = 100_000;
/// Rounds of every kind, taking turns.
const ROUNDS: usize = 3;
/// Tasks per round trip of the raw pipeline (as the clients' raw pipelines send them).
const RAW_PER_TRIP: u64 = 1000;
/// Children per group, and nodes per graph (each a root: a fan-out).
const WORKFLOW_SIZE: u64 = 1000;
/// The payload when `--payload` gives none: 32 bytes, as the issue measured.
const PAYLOAD: &str = "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx";

/// One kind's runs: Redis CPU per task (µs) and tasks/s of each.
#[derive(Default)]
struct Runs {
    cpu_us: Vec<f64>,
    per_s: Vec<f64>,
}

/// The median of `values` (sorted copy).
fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// A kind that writes tasks: where, and how.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// ZADD + HSET per task, pipelined from Rust (redis-rs).
    Raw,
    /// `Store::schedule_many`.
    Rust,
    /// `hourglass schedule-many` on a JSON Lines file.
    Cli,
    /// The Python client's `schedule_many`, and a raw redis-py pipeline.
    PythonMany,
    PythonRaw,
    /// The Node client's `scheduleMany`, a raw ioredis pipeline, and BullMQ's `addBulk`.
    NodeMany,
    NodeRaw,
    Bullmq,
    /// Follow-ups moved from an outbox into their type (the host's `flush_outbox`).
    Followups,
    /// Followups one deliver.lua call and one HDEL per entry, as before issue 66.
    FollowupsOneByOne,
    /// Children added to groups of 1,000 (open, add, seal).
    GroupChildren,
    /// Graphs of 1,000 roots declared and their roots scheduled.
    GraphNodes,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Raw => "raw ZADD+HSET pipeline (redis-rs)",
            Kind::Rust => "Rust Store::schedule_many",
            Kind::Cli => "hourglass schedule-many (whole process)",
            Kind::PythonMany => "Python schedule_many",
            Kind::PythonRaw => "raw redis-py pipeline",
            Kind::NodeMany => "Node scheduleMany",
            Kind::NodeRaw => "raw ioredis pipeline",
            Kind::Bullmq => "BullMQ addBulk",
            Kind::Followups => "follow-ups delivered (outbox flush)",
            Kind::FollowupsOneByOne => "follow-ups, a call per entry (before)",
            Kind::GroupChildren => "group children (groups of 1000)",
            Kind::GraphNodes => "graph nodes (graphs of 1000 roots)",
        }
    }

    /// The name of its type: one each, so one kind's leftovers never meet another's.
    fn task_type(self) -> &'static str {
        match self {
            Kind::Raw => "ingest.raw",
            Kind::Rust => "ingest.rust",
            Kind::Cli => "ingest.cli",
            Kind::PythonMany => "ingest.py",
            Kind::PythonRaw => "ingest.pyraw",
            Kind::NodeMany => "ingest.node",
            Kind::NodeRaw => "ingest.noderaw",
            Kind::Bullmq => "ingest.bullmq",
            Kind::Followups => "ingest.follow",
            Kind::FollowupsOneByOne => "ingest.follow1",
            Kind::GroupChildren => "ingest.child",
            Kind::GraphNodes => "ingest.node.graph",
        }
    }
}

/// What the external kinds need: the interpreters, and the scripts beside the workspace.
struct Externals {
    hourglass: Option<PathBuf>,
    python: Option<(PathBuf, PathBuf)>,
    node: Option<PathBuf>,
    bullmq: bool,
    missing: Vec<String>,
}

impl Externals {
    fn find() -> Externals {
        let mut missing = Vec::new();
        let beside = std::env::current_exe().ok().and_then(|exe| Some(exe.parent()?.join("hourglass")));
        let hourglass = beside.filter(|p| p.is_file());
        if hourglass.is_none() {
            missing.push("the CLI: no hourglass binary beside hourglass-bench (cargo build -p hourglass)".into());
        }
        let python = match (
            find_file(None, "clients/python/.venv/bin/python"),
            find_file(None, "bench/ingest/python_client.py"),
        ) {
            (Ok(python), Ok(script)) => Some((python, script)),
            _ => {
                missing.push("Python: no clients/python/.venv (bash clients/test.sh --install-only)".into());
                None
            }
        };
        let node = match (
            find_file(None, "clients/node/node_modules/ioredis/package.json"),
            find_file(None, "bench/ingest/node_client.js"),
        ) {
            (Ok(_), Ok(script)) if which("node") => Some(script),
            _ => {
                missing.push(
                    "Node: no node, or no clients/node/node_modules (bash clients/test.sh --install-only)".into(),
                );
                None
            }
        };
        let bullmq_dir = std::env::var_os("BULLMQ").map(PathBuf::from).unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/peers/node_modules/bullmq")
        });
        let bullmq = node.is_some() && bullmq_dir.join("package.json").is_file();
        if !bullmq {
            missing.push(format!("BullMQ: none at {} (shared/peers/README.md installs it)", bullmq_dir.display()));
        }
        Externals { hourglass, python, node, bullmq, missing }
    }

    fn has(&self, kind: Kind) -> bool {
        match kind {
            Kind::Cli => self.hourglass.is_some(),
            Kind::PythonMany | Kind::PythonRaw => self.python.is_some(),
            Kind::NodeMany | Kind::NodeRaw => self.node.is_some(),
            Kind::Bullmq => self.bullmq,
            _ => true,
        }
    }
}

fn which(program: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
}

/// Runs `command`, which prints `{"seconds": s, "stored": n}` last; its seconds, once it stored `n`.
async fn run_external(mut command: tokio::process::Command, what: &str, n: u64) -> Result<f64> {
    let out = command.output().await.with_context(|| format!("cannot run {what}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!("{what} failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    let line = stdout.lines().last().unwrap_or("");
    let reply: Value = serde_json::from_str(line).with_context(|| format!("{what} printed {line:?}"))?;
    let stored = reply["stored"].as_u64().unwrap_or(0);
    if stored != n {
        bail!("{what} stored {stored} tasks, not {n}");
    }
    reply["seconds"].as_f64().with_context(|| format!("{what} printed no seconds: {line}"))
}

impl Bench {
    pub(super) async fn ingest(&self) -> Result<()> {
        if self.store.target().is_cluster() {
            bail!("ingest reads one Redis server's CPU: run it against a single server (--spawn-redis), not a cluster");
        }
        let n = self.args.tasks.unwrap_or(DEFAULT_TASKS);
        let payload = self.args.payload.clone().unwrap_or_else(|| PAYLOAD.to_string());
        let externals = Externals::find();
        let kinds = [
            Kind::Raw,
            Kind::Rust,
            Kind::Cli,
            Kind::PythonRaw,
            Kind::PythonMany,
            Kind::NodeRaw,
            Kind::NodeMany,
            Kind::Bullmq,
            Kind::Followups,
            Kind::FollowupsOneByOne,
            Kind::GroupChildren,
            Kind::GraphNodes,
        ];
        let kinds: Vec<Kind> = kinds.into_iter().filter(|k| externals.has(*k)).collect();
        let work = super::setup::TempDir::new("ingest")?;
        let jsonl = work.path.join("tasks.jsonl");
        self.write_jsonl(&jsonl, n, &payload)?;
        // A fresh server's first writes fault its memory in from the kernel, which later rounds reuse:
        // one round of the raw pipeline first, not counted, so the first kind measured pays no more.
        self.progress_line("ingest: warming the server up");
        self.ingest_once(Kind::Raw, n, &payload, &externals, &jsonl).await?;
        self.clear_kind(Kind::Raw).await?;
        let mut runs: Vec<Runs> = kinds.iter().map(|_| Runs::default()).collect();
        for round in 0..ROUNDS {
            for (kind, runs) in kinds.iter().zip(runs.iter_mut()) {
                self.progress_line(&format!("ingest: round {}/{ROUNDS}: {}", round + 1, kind.name()));
                self.clear_kind(*kind).await?;
                let before = redis_ops::server_work(&self.store).await?;
                let started = Instant::now();
                let seconds = self.ingest_once(*kind, n, &payload, &externals, &jsonl).await?;
                let wall = started.elapsed().as_secs_f64();
                let after = redis_ops::server_work(&self.store).await?;
                runs.cpu_us.push((after.cpu_us - before.cpu_us) / n as f64);
                runs.per_s.push(n as f64 / seconds.unwrap_or(wall));
                self.clear_kind(*kind).await?;
            }
        }
        self.progress_done();

        let by = |k: Kind| kinds.iter().position(|x| *x == k).map(|i| &runs[i]);
        let ratio = |a: Kind, b: Kind, f: fn(&Runs) -> &Vec<f64>| match (by(a), by(b)) {
            (Some(a), Some(b)) => json!(round2(median(f(a)) / median(f(b)))),
            _ => Value::Null,
        };
        fn cpu(r: &Runs) -> &Vec<f64> {
            &r.cpu_us
        }
        fn rate(r: &Runs) -> &Vec<f64> {
            &r.per_s
        }
        let mut m = serde_json::Map::new();
        m.insert("scenario".into(), json!("ingest"));
        m.insert("tasks".into(), json!(n));
        m.insert("payload_bytes".into(), json!(payload.len()));
        m.insert("rounds".into(), json!(ROUNDS));
        for (place, (kind, r)) in kinds.iter().zip(&runs).enumerate() {
            let shown: Vec<String> = r.cpu_us.iter().map(|c| format!("{c:.2}")).collect();
            let rates: Vec<String> = r.per_s.iter().map(|p| format!("{:.0}", p)).collect();
            // Numbered: the report's fields come out sorted by name, and the kinds read best in their order.
            m.insert(
                format!("{:02} {}", place + 1, kind.name()),
                json!(format!(
                    "Redis CPU {:.2} us/task (runs {}), {:.0} tasks/s (runs {})",
                    median(&r.cpu_us),
                    shown.join(", "),
                    median(&r.per_s),
                    rates.join(", ")
                )),
            );
        }
        m.insert("rust_many_cpu_vs_raw".into(), ratio(Kind::Rust, Kind::Raw, cpu));
        m.insert("python_many_cpu_vs_raw".into(), ratio(Kind::PythonMany, Kind::PythonRaw, cpu));
        m.insert("node_many_cpu_vs_raw".into(), ratio(Kind::NodeMany, Kind::NodeRaw, cpu));
        m.insert("python_many_rate_vs_raw".into(), ratio(Kind::PythonMany, Kind::PythonRaw, rate));
        m.insert("node_many_rate_vs_raw".into(), ratio(Kind::NodeMany, Kind::NodeRaw, rate));
        m.insert("python_many_rate_vs_bullmq".into(), ratio(Kind::PythonMany, Kind::Bullmq, rate));
        m.insert("node_many_rate_vs_bullmq".into(), ratio(Kind::NodeMany, Kind::Bullmq, rate));
        m.insert("cli_rate_vs_bullmq".into(), ratio(Kind::Cli, Kind::Bullmq, rate));
        m.insert("followups_cpu_vs_before".into(), ratio(Kind::Followups, Kind::FollowupsOneByOne, cpu));
        m.insert("not_measured".into(), json!(externals.missing));
        m.insert("load_average".into(), json!(super::setup::load_average()));
        self.report("ingest: Redis CPU per task scheduled, side by side", Value::Object(m));
        Ok(())
    }

    /// Deletes every key a kind writes, and waits until Redis has freed them: UNLINK frees in a
    /// background thread, whose CPU `INFO cpu` counts, and the next kind must not pay for it.
    async fn clear_kind(&self, kind: Kind) -> Result<()> {
        let t = kind.task_type();
        redis_ops::unlink_matching(&self.store, &format!("{PREFIX}:{{{t}*")).await?;
        // BullMQ's keys are `<prefix>:<queue>:...`; the outbox source and the callbacks have types of their own.
        redis_ops::unlink_matching(&self.store, &format!("{PREFIX}:{t}:*")).await?;
        redis_ops::unlink_matching(&self.store, &format!("{PREFIX}:{{{t}.home}}*")).await?;
        redis_ops::used_memory(&self.store).await.map(drop)
    }

    /// `n` tasks of the CLI's type as JSON Lines.
    fn write_jsonl(&self, path: &Path, n: u64, payload: &str) -> Result<()> {
        use std::io::Write;
        let due = now_ms() + 3_600_000;
        let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
        let payload = serde_json::to_string(payload)?;
        for i in 0..n {
            writeln!(
                out,
                r#"{{"task_type": "{}", "id": "{}", "at_ms": {due}, "payload": {payload}}}"#,
                Kind::Cli.task_type(),
                task_id(i)
            )?;
        }
        out.flush()?;
        Ok(())
    }

    /// One run of `kind`: `Some(seconds)` when it timed its write itself, `None` to take the wall time.
    async fn ingest_once(
        &self,
        kind: Kind,
        n: u64,
        payload: &str,
        externals: &Externals,
        jsonl: &Path,
    ) -> Result<Option<f64>> {
        let t: TaskType = kind.task_type().parse()?;
        let due = now_ms() + 3_600_000;
        let stored = |t: TaskType| async move { redis_ops::zcard(&self.store, &self.store.keys(&t).due).await };
        let url = &self.url;
        let external = |program: &Path, script: &Path, how: &str| {
            let mut c = tokio::process::Command::new(program);
            c.arg(script).args([url.as_str(), how, &n.to_string(), kind.task_type(), payload, PREFIX]);
            c
        };
        match kind {
            Kind::Raw => {
                let keys = self.store.keys(&t);
                let mut conn = self.store.connection();
                let started = Instant::now();
                for from in (0..n).step_by(RAW_PER_TRIP as usize) {
                    let mut pipe = redis::pipe();
                    for i in from..(from + RAW_PER_TRIP).min(n) {
                        let id = task_id(i);
                        pipe.zadd(&keys.due, &id, due).ignore().hset(&keys.payload, &id, payload).ignore();
                    }
                    let () = pipe.query_async(&mut conn).await?;
                }
                let seconds = started.elapsed().as_secs_f64();
                check_stored(kind, stored(t).await?, n)?;
                Ok(Some(seconds))
            }
            Kind::Rust => {
                let tasks: Vec<NewTask> = (0..n)
                    .map(|i| NewTask {
                        task_type: t.clone(),
                        id: task_id(i).into_bytes(),
                        due_ms: due,
                        payload: Some(payload.as_bytes().to_vec()),
                        mode: ScheduleMode::Upsert,
                    })
                    .collect();
                let started = Instant::now();
                self.store.schedule_many(&tasks).await?;
                let seconds = started.elapsed().as_secs_f64();
                check_stored(kind, stored(t).await?, n)?;
                Ok(Some(seconds))
            }
            Kind::Cli => {
                let program = externals.hourglass.as_ref().context("no hourglass binary")?;
                // The bench's key prefix, in a config of its own beside the file.
                let config = jsonl.with_file_name("runner.toml");
                std::fs::write(&config, format!("[redis]\nprefix = \"{PREFIX}\"\n"))?;
                let out = tokio::process::Command::new(program)
                    .arg("--config")
                    .arg(&config)
                    .args(["--redis", url.as_str(), "schedule-many"])
                    .arg(jsonl)
                    .output()
                    .await
                    .context("cannot run hourglass schedule-many")?;
                if !out.status.success() {
                    bail!("hourglass schedule-many failed: {}", String::from_utf8_lossy(&out.stderr).trim());
                }
                check_stored(kind, stored(t).await?, n)?;
                Ok(None)
            }
            Kind::PythonMany | Kind::PythonRaw => {
                let (python, script) = externals.python.as_ref().context("no Python")?;
                let how = if kind == Kind::PythonMany { "many" } else { "raw" };
                Ok(Some(run_external(external(python, script, how), kind.name(), n).await?))
            }
            Kind::NodeMany | Kind::NodeRaw | Kind::Bullmq => {
                let script = externals.node.as_ref().context("no Node")?;
                let how = match kind {
                    Kind::NodeMany => "many",
                    Kind::NodeRaw => "raw",
                    _ => "bullmq",
                };
                Ok(Some(run_external(external(Path::new("node"), script, how), kind.name(), n).await?))
            }
            Kind::Followups | Kind::FollowupsOneByOne => {
                let source: TaskType = format!("{}.home", kind.task_type()).parse()?;
                self.write_outbox(&source, &t, n, due, payload).await?;
                let started = Instant::now();
                if kind == Kind::Followups {
                    let flushed = self.store.flush_outbox(&source).await?;
                    if flushed.moved as u64 != n || !flushed.failed.is_empty() {
                        bail!("the outbox flush moved {} of {n} follow-ups ({:?})", flushed.moved, flushed.failed);
                    }
                } else {
                    self.deliver_one_by_one(&source, &t).await?;
                }
                let seconds = started.elapsed().as_secs_f64();
                check_stored(kind, stored(t).await?, n)?;
                Ok(Some(seconds))
            }
            Kind::GroupChildren => {
                let home: TaskType = format!("{}.home", kind.task_type()).parse()?;
                let started = Instant::now();
                for g in 0..n.div_ceil(WORKFLOW_SIZE) {
                    let group = GroupRef { callback_type: home.clone(), id: format!("g{g}").parse::<GroupId>()? };
                    let callback = Callback {
                        id: format!("g{g}"),
                        payload: String::new(),
                        when: FireWhen::AllEnded,
                        replace: true,
                    };
                    self.store.group_open(&group, &callback).await?;
                    let children: Vec<NewChild> = (g * WORKFLOW_SIZE..((g + 1) * WORKFLOW_SIZE).min(n))
                        .map(|i| NewChild {
                            task_type: t.clone(),
                            id: task_id(i),
                            payload: payload.as_bytes().to_vec(),
                            due_ms: due,
                        })
                        .collect();
                    self.store.group_add(&group, &children).await?;
                    self.store.group_seal(&group).await?;
                }
                let seconds = started.elapsed().as_secs_f64();
                check_stored(kind, stored(t).await?, n)?;
                Ok(Some(seconds))
            }
            Kind::GraphNodes => {
                let home: TaskType = format!("{}.home", kind.task_type()).parse()?;
                let started = Instant::now();
                for g in 0..n.div_ceil(WORKFLOW_SIZE) {
                    let nodes: Vec<NodeSpec> = (g * WORKFLOW_SIZE..((g + 1) * WORKFLOW_SIZE).min(n))
                        .map(|i| NodeSpec {
                            name: format!("n{i}"),
                            task_type: t.clone(),
                            id: task_id(i),
                            payload: payload.to_string(),
                            when: FireWhen::AllEnded,
                            parents: Vec::new(),
                        })
                        .collect();
                    self.store.graph_submit(&home, &format!("d{g}").parse::<GroupId>()?, &nodes).await?;
                }
                let seconds = started.elapsed().as_secs_f64();
                check_stored(kind, stored(t).await?, n)?;
                Ok(Some(seconds))
            }
        }
    }

    /// `n` follow-ups into `target` in `source`'s outbox, as settles leave them (not measured).
    async fn write_outbox(&self, source: &TaskType, target: &TaskType, n: u64, due: i64, payload: &str) -> Result<()> {
        let outbox = self.store.keys(source).outbox.clone();
        let mut conn = self.store.connection();
        for from in (0..n).step_by(RAW_PER_TRIP as usize) {
            let mut pipe = redis::pipe();
            for i in from..(from + RAW_PER_TRIP).min(n) {
                let f = hourglass::task::FollowUp {
                    task_type: target.clone(),
                    id: task_id(i).into_bytes(),
                    payload: payload.as_bytes().to_vec(),
                    due_ms: due,
                    replace: true,
                };
                pipe.hset(&outbox, format!("{source}:{i}:0"), encode_followup(&f)).ignore();
            }
            let () = pipe.query_async(&mut conn).await?;
        }
        Ok(())
    }

    /// What a flush of `source`'s outbox sent before issue 66: per follow-up one deliver call
    /// (the script of today, given one entry) and one HDEL, each waiting for its reply.
    async fn deliver_one_by_one(&self, source: &TaskType, target: &TaskType) -> Result<()> {
        let script = redis::Script::new(concat!(
            include_str!("../../../host/store/src/scripts/prelude.lua"),
            include_str!("../../../host/store/src/scripts/deliver.lua")
        ));
        let (sk, tk) = (self.store.keys(source), self.store.keys(target));
        let mut conn = self.store.connection();
        let mut cursor = 0u64;
        loop {
            let (next, flat): (u64, Vec<Vec<u8>>) =
                redis::cmd("HSCAN").arg(&sk.outbox).arg(cursor).arg("COUNT").arg(1000).query_async(&mut conn).await?;
            for pair in flat.chunks_exact(2) {
                let f = hourglass::store::decode_followup(&pair[0], &pair[1])?;
                let _: Vec<i64> = script
                    .key(&tk.due)
                    .key(&tk.payload)
                    .key(&tk.dead)
                    .key(tk.delivered(&pair[0]))
                    .arg(&f.id)
                    .arg(f.due_ms)
                    .arg(&f.payload)
                    .arg("1")
                    .arg("replace")
                    .invoke_async(&mut conn)
                    .await?;
                let _: i64 = redis::cmd("HDEL").arg(&sk.outbox).arg(&pair[0]).query_async(&mut conn).await?;
            }
            if next == 0 {
                return Ok(());
            }
            cursor = next;
        }
    }
}

fn check_stored(kind: Kind, stored: u64, n: u64) -> Result<()> {
    if stored != n {
        bail!("{}: {stored} tasks stored, not {n}", kind.name());
    }
    Ok(())
}
