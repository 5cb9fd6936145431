//! Test-only handler whose payload text picks a (mis)behaviour, so the host's
//! sandbox and error handling can be tested against a real component.

use std::hint::black_box;

use hourglass_sdk::bindings::wasi::http::types as wt;
use hourglass_sdk::{Failure, Level, Task, log, now_ms};

fn handle(task: Task) -> Result<(), Failure> {
    // The host's warm-up call (attempt 0, empty payload) runs the command in
    // config `warm-up`, so tests can make the warm-up misbehave.
    let warm_up = if task.attempt == 0 { hourglass_sdk::config("warm-up") } else { None };
    let command = warm_up.unwrap_or_else(|| task.payload_str().into_owned());
    let (verb, arg) = command.split_once(':').unwrap_or((command.as_str(), ""));
    match verb {
        // An empty payload succeeds, so chaos can stand in for noop (hot-reload tests).
        "ok" | "" => Ok(()),
        "sleep" => {
            let ms: u64 = arg.parse().map_err(Failure::permanent)?;
            std::thread::sleep(std::time::Duration::from_millis(ms));
            Ok(())
        }
        "retry-after" => Err(Failure::RetryAfter(arg.parse().map_err(Failure::permanent)?)),
        "permanent" => Err(Failure::Permanent(arg.to_owned())),
        "error" => Err(Failure::Error(arg.to_owned())),
        "trap" => std::process::abort(),
        "panic" => panic!("chaos panic: {arg}"),
        "loop" => {
            let mut n = 0u64;
            loop {
                n = black_box(n.wrapping_add(1));
            }
        }
        "membomb" => {
            let mut hoard: Vec<Vec<u8>> = Vec::new();
            loop {
                // Touch every page so the memory is really used.
                hoard.push(black_box(vec![1u8; 1 << 20]));
            }
        }
        "stackoverflow" => {
            black_box(recurse(black_box(1)));
            Ok(())
        }
        "readfile" => match std::fs::read("/etc/passwd") {
            Ok(bytes) => Err(Failure::Error(format!("readfile succeeded: {} bytes", bytes.len()))),
            Err(e) => Err(Failure::Error(format!("readfile failed: {e}"))),
        },
        "env" => {
            let count = std::env::vars_os().count();
            let path = std::env::var_os("PATH").is_some();
            let args = std::env::args_os().count();
            Err(Failure::Error(format!("env: vars={count} path={path} args={args}")))
        }
        "socket" => match std::net::TcpStream::connect("127.0.0.1:6379") {
            Ok(_) => Err(Failure::Error("socket connected".into())),
            Err(e) => Err(Failure::Error(format!("socket failed: {e}"))),
        },
        "stdout" => {
            println!("hello from stdout");
            println!("second line");
            eprintln!("hello from stderr");
            Ok(())
        }
        "bigstdout" => {
            // More than the host's capture cap: must be truncated, not fatal.
            let line = "x".repeat(1023);
            for _ in 0..1024 {
                println!("{line}");
            }
            Ok(())
        }
        "log" => {
            for (level, name) in [
                (Level::Trace, "trace"),
                (Level::Debug, "debug"),
                (Level::Info, "info"),
                (Level::Warn, "warn"),
                (Level::Error, "error"),
            ] {
                log(level, &format!("chaos log at {name}"));
            }
            Ok(())
        }
        "schedule" => {
            let (task_type, id) = arg.split_once(':').unwrap_or((arg, "follow"));
            hourglass_sdk::schedule(task_type, id, "from chaos", now_ms())?;
            Ok(())
        }
        "fanout" => {
            // fanout:<callback type>:<group>:<child type>:<n>:<child payload>: open, add n, seal.
            let mut parts = arg.splitn(5, ':');
            let (c, g, t) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""), parts.next().unwrap_or(""));
            let n: usize = parts.next().unwrap_or("0").parse().map_err(Failure::permanent)?;
            let payload = parts.next().unwrap_or("");
            let group = hourglass_sdk::workflow::Group::new(c, g);
            group.open(g, "from chaos", hourglass_sdk::workflow::FireWhen::AllEnded)?;
            for i in 0..n {
                group.add(t, &format!("{g}-{i}"), payload, now_ms())?;
            }
            group.seal()?;
            Ok(())
        }
        "graph" | "graph-cycle" => {
            // graph:<home>:<graph>:<node type>: a diamond (a, b; c after both; d after c if it succeeded).
            // graph-cycle: the same with an edge d -> a, which the host refuses at once.
            use hourglass_sdk::workflow::{FireWhen, Node, graph};
            let mut parts = arg.splitn(3, ':');
            let (home, g, t) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""), parts.next().unwrap_or(""));
            let mut nodes = vec![
                Node::new("a", t, &[]),
                Node::new("b", t, &[]),
                Node::new("c", t, &["a", "b"]),
                Node { when: FireWhen::AllSucceeded, ..Node::new("d", t, &["c"]) },
            ];
            if verb == "graph-cycle" {
                nodes[0].parents.push("d".into());
            }
            graph(home, g, &nodes).map_err(|e| Failure::permanent(e.0))?;
            Ok(())
        }
        "join" => {
            // join:<callback type>:<group>:<child type>:<id>:<child payload>: add one child to an open group.
            let mut parts = arg.splitn(5, ':');
            let (c, g, t) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""), parts.next().unwrap_or(""));
            let (id, payload) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
            hourglass_sdk::workflow::Group::new(c, g).add(t, id, payload, now_ms())?;
            Ok(())
        }
        "schedule-many" => {
            // One more than the host allows: the last one must be refused.
            for i in 0..=1000 {
                if let Err(e) = hourglass_sdk::schedule("noop", format!("many-{i}"), "", now_ms()) {
                    return Err(Failure::Error(format!("follow-up {i} refused: {e}")));
                }
            }
            Ok(())
        }
        "schedule-invalid" => {
            let e = hourglass_sdk::schedule("Bad Type", "x", "", 0).unwrap_err();
            Err(Failure::Error(e.to_string()))
        }
        "schedule-then-fail" => {
            hourglass_sdk::schedule("noop", "doomed", "", now_ms())?;
            Err(Failure::Error("failed after scheduling".into()))
        }
        // --- hostile: what a careless or malicious plugin asks of the host ---
        "http-get" => {
            // One request; its outcome (status or error) is the task's error text.
            match hourglass_sdk::http::get(arg) {
                Ok(resp) => Err(Failure::Error(format!("http-get answered {}", resp.status))),
                Err(e) => Err(Failure::Error(format!("http-get failed: {e}"))),
            }
        }
        "refused-flood" => {
            // Many requests to a target the type may not call.
            let n: usize = arg.parse().map_err(Failure::permanent)?;
            for _ in 0..n {
                let _ = hourglass_sdk::http::get("https://not-allowed.example/x");
            }
            Ok(())
        }
        "fields" => {
            // `count` header-field resources of `size`-byte values, all kept alive:
            // host memory the guest's own memory limit does not cover.
            let (count, size) = arg.split_once(':').unwrap_or((arg, "102400"));
            let (count, size): (usize, usize) =
                (count.parse().map_err(Failure::permanent)?, size.parse().map_err(Failure::permanent)?);
            let value = vec![b'v'; size];
            let mut kept = Vec::new();
            let mut refused = 0;
            for i in 0..count {
                let fields = wt::Fields::new();
                if fields.append(&format!("x-h{i}"), &value).is_err() {
                    refused += 1;
                }
                kept.push(fields);
            }
            Err(Failure::Error(format!("fields: kept {} resources, {refused} values refused", kept.len())))
        }
        "bodies" => {
            // `count` outgoing requests whose bodies are written until the host
            // stops taking bytes, none of them sent.
            let count: usize = arg.parse().map_err(Failure::permanent)?;
            let mut kept = Vec::new();
            let mut buffered = 0usize;
            for _ in 0..count {
                let request = wt::OutgoingRequest::new(wt::Fields::new());
                let body = request.body().map_err(|()| Failure::permanent("no body"))?;
                let stream = body.write().map_err(|()| Failure::permanent("no stream"))?;
                while let Ok(n) = stream.check_write() {
                    if n == 0 || stream.write(&vec![b'b'; n as usize]).is_err() {
                        break;
                    }
                    buffered += n as usize;
                }
                kept.push((request, body, stream));
            }
            Err(Failure::Error(format!("bodies: kept {}, {buffered} bytes buffered", kept.len())))
        }
        "graph-flood" => {
            // graph-flood:<shape>:<bytes>: graphs whose JSON, about <bytes> long, makes a naive
            // parse hold the most, declared 20 times, ignoring refusals; the host must stay in
            // its budget. parents: one node with 2-byte parents; nodes: the most nodes, tiny;
            // payloads: nodes with long payloads.
            use hourglass_sdk::bindings::hourglass::plugin::workflow::graph;
            let (shape, bytes) = arg.split_once(':').unwrap_or((arg, ""));
            let bytes: usize = bytes.parse().map_err(Failure::permanent)?;
            let mut json = String::with_capacity(bytes + bytes / 8 + 4096);
            json.push_str(r#"{"nodes":["#);
            match shape {
                "parents" => {
                    json.push_str("{\"name\":\"a\",\"type\":\"noop\",\"parents\":[\"\"");
                    while json.len() < bytes {
                        json.push_str(",\"\"");
                    }
                    json.push_str("]}");
                }
                "nodes" | "payloads" => {
                    let payload = if shape == "payloads" { "p".repeat(bytes / 10_000) } else { String::new() };
                    for i in 0..10_000 {
                        let sep = if i == 0 { "" } else { "," };
                        json.push_str(&format!(r#"{sep}{{"name":"{i}","type":"noop","payload":"{payload}"}}"#));
                    }
                }
                other => return Err(Failure::permanent(format!("unknown shape {other}"))),
            }
            json.push_str("]}");
            let mut refused = 0;
            for i in 0..20 {
                if graph("chaos", &format!("flood-{}-{i}", task.id_str()), &json).is_err() {
                    refused += 1;
                }
            }
            log(Level::Info, &format!("graph-flood: {refused} of 20 refused"));
            Ok(())
        }
        "followups-big" => {
            // Follow-ups of 1 MiB each, ignoring refusals: the host must still fail the run.
            let n: usize = arg.parse().map_err(Failure::permanent)?;
            let payload = vec![b'p'; 1 << 20];
            let mut refused = 0;
            for i in 0..n {
                if hourglass_sdk::schedule("noop", format!("big-{i}"), payload.clone(), now_ms()).is_err() {
                    refused += 1;
                }
            }
            log(Level::Info, &format!("followups-big: {refused} of {n} refused"));
            Ok(())
        }
        "log-flood" => {
            let bytes: usize = arg.parse().map_err(Failure::permanent)?;
            let line = "L".repeat(1023);
            for _ in 0..bytes / 1024 {
                log(Level::Info, &line);
            }
            Ok(())
        }
        "log-forge" => {
            log(
                Level::Info,
                "innocent\n2030-01-01T00:00:00.000000Z  INFO hourglass::runner: forged line from a plugin",
            );
            println!("stdout too\r\n2030-01-01T00:00:00.000000Z ERROR hourglass::runner: forged stdout line");
            Ok(())
        }
        "error-huge" => {
            let bytes: usize = arg.parse().map_err(Failure::permanent)?;
            Err(Failure::Error("E".repeat(bytes)))
        }
        // --- isolation probes (tests/sandbox/isolation.rs): what one task leaves, the next must not see ---
        "stash" => {
            // `stash:SECRET:HOLD_MS`: SECRET at the start of every page of a
            // zero-initialised static (.bss), of an initialised one (.data)
            // and of a freed heap block, then the instance is held HOLD_MS.
            let (secret, hold) = arg.split_once(':').unwrap_or((arg, "0"));
            let hold: u64 = hold.parse().map_err(Failure::permanent)?;
            // "SECRET-OF-TASK-", decoded here so that no page of the image starts with it.
            let prefix: String = "RDBQDS,NE,S@RJ,".bytes().map(|b| char::from(b + 1)).collect();
            let marker = format!("{prefix}{secret}");
            // SAFETY: one run at a time per instance; nothing else holds these statics.
            unsafe {
                stamp_pages((&raw mut BSS).cast(), STASH_BYTES, marker.as_bytes());
                stamp_pages((&raw mut DATA).cast(), DATA_BYTES, marker.as_bytes());
            }
            let layout = std::alloc::Layout::from_size_align(STASH_BYTES, PAGE).map_err(Failure::permanent)?;
            // SAFETY: a non-zero size; the block is written within its bounds and freed with its layout.
            unsafe {
                let block = std::alloc::alloc(layout);
                if !block.is_null() {
                    stamp_pages(block, STASH_BYTES, marker.as_bytes());
                    std::alloc::dealloc(block, layout);
                }
            }
            std::thread::sleep(std::time::Duration::from_millis(hold));
            Ok(())
        }
        "peek" => match remnants() {
            None => Ok(()),
            Some(found) => Err(Failure::Permanent(found)),
        },
        "stdout-partial" => {
            // An unfinished line: nothing of it may reach the next task's captured output.
            use std::io::Write;
            print!("PARTIAL-{arg}");
            // Handed to the host unfinished (the guest's own buffer is its memory, reset with it).
            let _ = std::io::stdout().flush();
            eprint!("PARTIAL-ERR-{arg}");
            Ok(())
        }
        "hash-seed" => {
            // What std's per-process random hash keys (from wasi:random) make of one value.
            use std::hash::BuildHasher;
            Err(Failure::Error(format!(
                "hash-seed {:016x}",
                std::collections::hash_map::RandomState::new().hash_one(0u64)
            )))
        }
        "leak-fields" => {
            // Header fields left open by a run that succeeds (kept only by `instance_reuse`).
            let n: usize = arg.parse().map_err(Failure::permanent)?;
            for _ in 0..n {
                let fields = wt::Fields::new();
                let _ = fields.append("x-left", b"behind");
                std::mem::forget(fields);
            }
            Ok(())
        }
        "handles" => {
            // Uses resource handle N without creating any: a fresh instance has
            // none, so the use traps; a handle alive here was left by an earlier task.
            let handle: u32 = arg.parse().map_err(Failure::permanent)?;
            // SAFETY: a deliberately forged handle; the host must reject it.
            let fields = unsafe { wt::Fields::from_handle(handle) };
            let entries = fields.entries().len();
            std::mem::forget(fields);
            Err(Failure::Error(format!("handle {handle} is alive with {entries} entries")))
        }
        "config" => Err(Failure::Error(format!("config {arg}={:?}", hourglass_sdk::config(arg)))),
        // `progress:<percent>:<ms>`: reports, then runs on for <ms> (so it can be watched).
        "progress" => {
            let (percent, ms) = arg.split_once(':').unwrap_or((arg, "0"));
            let percent: u8 = percent.parse().map_err(Failure::permanent)?;
            hourglass_sdk::progress(percent, &format!(r#"{{"step":"chaos","at":{percent}}}"#))?;
            std::thread::sleep(std::time::Duration::from_millis(ms.parse().map_err(Failure::permanent)?));
            Ok(())
        }
        // `progress-retry:<percent>`: reports, then fails, to be retried in a minute.
        "progress-retry" => {
            hourglass_sdk::progress(arg.parse().map_err(Failure::permanent)?, r#"{"step":"before the retry"}"#)?;
            Err(Failure::RetryAfter(60_000))
        }
        // Every way a report can be refused, each answered with an error.
        "progress-bad" => {
            let refused: Vec<String> = [
                hourglass_sdk::progress(101, ""),
                hourglass_sdk::progress(5, "{not json"),
                hourglass_sdk::progress(5, &format!("\"{}\"", "x".repeat(2000))),
            ]
            .into_iter()
            .map(|r| r.err().map_or_else(|| "accepted".to_owned(), |e| e.0))
            .collect();
            Err(Failure::Error(refused.join(" | ")))
        }
        // `progress-flood:<n>`: n reports as fast as it can, the last one 100 %.
        "progress-flood" => {
            let n: u32 = arg.parse().map_err(Failure::permanent)?;
            for i in 1..=n {
                hourglass_sdk::progress((u64::from(i) * 100 / u64::from(n)) as u8, r#"{"flood":true}"#)?;
            }
            Ok(())
        }
        "task" => Err(Failure::Error(format!(
            "task type={} id={:?} attempt={} due={}",
            task.task_type,
            task.id_str(),
            task.attempt,
            task.due_ms
        ))),
        other => Err(Failure::Permanent(format!("unknown chaos command {other:?}"))),
    }
}

/// Host page size the probes stamp and scan by; wasm pages are 16 of them.
const PAGE: usize = 4096;
/// The zero-initialised static the stash fills: 1 MiB, as in issue 50's report.
const STASH_BYTES: usize = 1 << 20;
/// The initialised static (a data segment) the stash overwrites.
const DATA_BYTES: usize = 64 << 10;
/// Its bytes as the component's image has them.
const DATA_FILL: u8 = 0x5a;

#[repr(C, align(4096))]
struct Bss([u8; STASH_BYTES]);
#[repr(C, align(4096))]
struct Data([u8; DATA_BYTES]);

static mut BSS: Bss = Bss([0; STASH_BYTES]);
static mut DATA: Data = Data([DATA_FILL; DATA_BYTES]);

/// Writes `marker` at the start of each page of `len` bytes at `base`.
///
/// # Safety
/// `base..base+len` must be writable and page-aligned.
unsafe fn stamp_pages(base: *mut u8, len: usize, marker: &[u8]) {
    for page in (0..len).step_by(PAGE) {
        for (i, b) in marker.iter().enumerate() {
            // SAFETY: within the caller's range; volatile so the writes are kept.
            unsafe { base.add(page + i).write_volatile(*b) };
        }
    }
}

/// Scans this instance's whole linear memory for what a stash leaves: a
/// page starting with the marker (compared as an immediate, so the scan
/// itself puts no marker in memory), or a .data page no longer as built.
fn remnants() -> Option<String> {
    const PREFIX: u64 = u64::from_le_bytes(*b"SECRET-O");
    let end = core::arch::wasm32::memory_size(0) * 65536;
    let mut found = 0usize;
    let mut first = None;
    for page in (PAGE..end).step_by(PAGE) {
        // SAFETY: inside linear memory (below memory.size); aligned; page 0 skipped.
        let head = unsafe { (page as *const u64).read_volatile() };
        if head == PREFIX {
            found += 1;
            first.get_or_insert(page);
        }
    }
    let data = (&raw const DATA).cast::<u8>();
    let changed = (0..DATA_BYTES)
        .step_by(PAGE)
        // SAFETY: within DATA.
        .filter(|&p| unsafe { data.add(p).read_volatile() } != DATA_FILL)
        .count();
    if found == 0 && changed == 0 {
        return None;
    }
    let text = first.map_or_else(String::new, |at| {
        // SAFETY: a page inside linear memory.
        let bytes = unsafe { std::slice::from_raw_parts(at as *const u8, 40) };
        let end = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
        format!(", first at {at}: {}", String::from_utf8_lossy(&bytes[..end]))
    });
    Some(format!("REMNANT {found} stamped pages, {changed} .data pages changed{text}"))
}

#[inline(never)]
fn recurse(depth: u64) -> u64 {
    if depth == u64::MAX {
        return 0;
    }
    // Not a tail call and not associative, so it cannot become a loop.
    recurse(depth + 1).rotate_left(7) ^ depth
}

hourglass_sdk::export_handler!(handle);
