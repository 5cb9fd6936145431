//! The three clients agree (issue 52, item 5), checked by a property test: for random ids (bytes
//! with NUL and 0xff, unicode text, digits, integers), random type names and shard counts from 1
//! to 256, Python, Node and the Rust store write the same keys and the same bytes, each client
//! reads every task back where the others put it, and a host runs each task.
//!
//! The cases come from a seeded generator: the seed is printed, and `HOURGLASS_AGREE_SEED=<seed>`
//! replays a run.

mod cases;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::clients::{node, python};
use crate::support::{Host, RedisServer, plugin, store, tokio_runtime, ty};
use cases::{Case, Id, generate};
use hourglass::store::{ScheduleMode, Store, TaskState};
use serde_json::{Value, json};

/// Every key of a server: its type and contents (a zset's members and scores in order, a hash's
/// fields and values sorted by field, a set's members sorted).
type Dump = BTreeMap<Vec<u8>, (String, Vec<Vec<u8>>)>;

fn dump(server: &RedisServer) -> Dump {
    let mut c = server.client();
    let keys: Vec<Vec<u8>> = redis::cmd("KEYS").arg("*").query(&mut c).unwrap();
    let mut out = Dump::new();
    for key in keys {
        let kind: String = redis::cmd("TYPE").arg(&key).query(&mut c).unwrap();
        let items: Vec<Vec<u8>> = match kind.as_str() {
            "zset" => redis::cmd("ZRANGE").arg(&key).arg(0).arg(-1).arg("WITHSCORES").query(&mut c).unwrap(),
            "hash" => {
                let flat: Vec<Vec<u8>> = redis::cmd("HGETALL").arg(&key).query(&mut c).unwrap();
                let mut pairs: Vec<&[Vec<u8>]> = flat.chunks(2).collect();
                pairs.sort();
                pairs.concat()
            }
            "set" => {
                let mut members: Vec<Vec<u8>> = redis::cmd("SMEMBERS").arg(&key).query(&mut c).unwrap();
                members.sort();
                members
            }
            "string" => vec![redis::cmd("GET").arg(&key).query(&mut c).unwrap()],
            "list" => redis::cmd("LRANGE").arg(&key).arg(0).arg(-1).query(&mut c).unwrap(),
            other => panic!("key {} is a {other}: the dump does not read those", esc(&key)),
        };
        out.insert(key, (kind, items));
    }
    out
}

/// What the layout of docs/scaling.md says the cases are: each id in its shard's `due` with its
/// due time, and its payload (when not empty) in that shard's `payload`.
fn expected(cases: &[Case]) -> Dump {
    let mut due: BTreeMap<Vec<u8>, Vec<(i64, Vec<u8>)>> = BTreeMap::new();
    // Key → its (field, value) pairs.
    type Fields = Vec<(Vec<u8>, Vec<u8>)>;
    let mut payloads: BTreeMap<Vec<u8>, Fields> = BTreeMap::new();
    for c in cases {
        let tag = c.tag();
        due.entry(format!("hourglass:{{{tag}}}:due").into_bytes()).or_default().push((c.at_ms, c.id.raw()));
        if !c.body.raw().is_empty() {
            payloads
                .entry(format!("hourglass:{{{tag}}}:payload").into_bytes())
                .or_default()
                .push((c.id.raw(), c.body.raw()));
        }
    }
    let mut out = Dump::new();
    for (key, mut members) in due {
        members.sort();
        let items = members.into_iter().flat_map(|(at, id)| [id, at.to_string().into_bytes()]).collect();
        out.insert(key, ("zset".into(), items));
    }
    for (key, mut fields) in payloads {
        fields.sort();
        out.insert(key, ("hash".into(), fields.into_iter().flat_map(|(f, v)| [f, v]).collect()));
    }
    out
}

/// Bytes as readable text: printable ASCII as is, the rest escaped.
fn esc(bytes: &[u8]) -> String {
    bytes.escape_ascii().to_string()
}

/// The first difference between two dumps, in words; `None` when they are the same.
fn difference(want: &Dump, got: &Dump) -> Option<String> {
    for key in want.keys().chain(got.keys()) {
        let (w, g) = (want.get(key), got.get(key));
        if w == g {
            continue;
        }
        let k = esc(key);
        let Some((w_kind, w_items)) = w else { return Some(format!("key {k} is not expected: {g:?}")) };
        let Some((g_kind, g_items)) = g else { return Some(format!("key {k} is missing")) };
        if w_kind != g_kind {
            return Some(format!("key {k} is a {g_kind}, not a {w_kind}"));
        }
        let at = w_items.iter().zip(g_items).position(|(a, b)| a != b).unwrap_or(w_items.len().min(g_items.len()));
        let show = |items: &[Vec<u8>]| items.get(at).map_or("(none)".into(), |i| esc(i));
        return Some(format!(
            "key {k} ({w_kind}, {} items, expected {}): item {at} is {}, expected {}",
            g_items.len(),
            w_items.len(),
            show(g_items),
            show(w_items)
        ));
    }
    None
}

/// The Python program: schedules every case (one by one or in bulk), then `show`s each, a line each.
const PYTHON: &str = r#"
import json
spec = json.loads(bytes.fromhex(SPEC).decode())
a = hg.Hourglass(redis.Redis(unix_socket_path=sys.argv[1]), shards=spec['shards'])
def ident(d):
    k, v = d['k'], d['v']
    if k == 'bytes':
        return bytearray.fromhex(v) if d['alt'] else bytes.fromhex(v)
    return bytes.fromhex(v).decode() if k == 'text' else int(v)
def body(d):
    k, v = d['k'], d['v']
    if k == 'none':
        return None
    if k == 'bytes':
        return bytearray.fromhex(v) if d['alt'] else bytes.fromhex(v)
    return bytes.fromhex(v).decode() if k == 'text' else json.loads(v)
bulk = []
for x in spec['cases']:
    if x['bulk']:
        bulk.append(hg.NewTask(x['t'], ident(x['id']), payload=body(x['p']), at_ms=x['at']))
    else:
        assert a.schedule(x['t'], ident(x['id']), at_ms=x['at'], payload=body(x['p'])), x
assert a.schedule_many(bulk) == [True] * len(bulk)
for x in spec['cases']:
    v = a.show(x['t'], ident(x['id']))
    print(v.task_type, v.state, v.due_ms, '-' if v.payload is None else v.payload.hex())
"#;

/// The Node program: the same as [`PYTHON`].
const NODE: &str = r#"
const spec = JSON.parse(Buffer.from(SPEC, 'hex').toString());
const a = new hg.Hourglass(r, { shards: spec.shards });
const bytes = (d) => (d.alt ? new Uint8Array(Buffer.from(d.v, 'hex')) : Buffer.from(d.v, 'hex'));
const ident = (d) => {
  if (d.k === 'bytes') return bytes(d);
  if (d.k === 'text') return Buffer.from(d.v, 'hex').toString();
  const n = BigInt(d.v);
  return n >= -BigInt(Number.MAX_SAFE_INTEGER) && n <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(n) : n;
};
const body = (d) => (d.k === 'none' ? undefined : d.k === 'bytes' ? bytes(d) : d.k === 'text' ? Buffer.from(d.v, 'hex').toString() : JSON.parse(d.v));
const bulk = [];
for (const x of spec.cases) {
  if (x.bulk) bulk.push({ taskType: x.t, id: ident(x.id), payload: body(x.p), atMs: x.at });
  else if (!(await a.schedule(x.t, ident(x.id), { atMs: x.at, payload: body(x.p) }))) throw new Error(JSON.stringify(x));
}
const written = await a.scheduleMany(bulk);
if (written.length !== bulk.length || !written.every((w) => w === true)) throw new Error(JSON.stringify(written));
for (const x of spec.cases) {
  const v = await a.show(x.t, ident(x.id));
  console.log(v.taskType, v.state, v.dueMs, v.payload === null ? '-' : v.payload.toString('hex'));
}
"#;

/// Python, Node and the Rust store each schedule the same random cases into a Redis of their own;
/// the three Redis hold byte for byte the same keys, which are exactly the layout's; each client
/// reads every task back in its shard; then a host on one of them runs every task.
#[test]
fn python_node_and_rust_write_the_same_bytes_for_random_tasks_and_a_host_runs_them_all() {
    let seed = std::env::var("HOURGLASS_AGREE_SEED").ok().map_or_else(
        || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64,
        |s| s.parse().expect("HOURGLASS_AGREE_SEED is a u64"),
    );
    println!("agree: seed {seed} (HOURGLASS_AGREE_SEED={seed} replays this run)");
    let (types, cases) = generate(seed);
    let ctx = format!("seed {seed}, types {types:?}");

    // The generator covers what the issue names.
    let raws: Vec<Vec<u8>> = cases.iter().map(|c| c.id.raw()).collect();
    assert!(raws.iter().any(|r| r.contains(&0) && r.contains(&0xff) && std::str::from_utf8(r).is_err()), "{ctx}");
    assert!(cases.iter().any(|c| matches!(&c.id, Id::Text(s) if s.chars().any(|ch| ch.len_utf8() == 4))), "{ctx}");
    assert!(cases.iter().any(|c| matches!(c.id, Id::Int(n) if n.unsigned_abs() > 1 << 64)), "{ctx}");
    for n in [1, 2, 3, 256] {
        assert!(cases.iter().any(|c| c.shards == n), "no case of a type with {n} shards: {ctx}");
    }
    assert!(cases.iter().any(|c| c.bulk) && cases.iter().any(|c| !c.bulk), "{ctx}");
    // An empty hash tag with a `}` after it (Redis hashes the whole id).
    let empty_tag = |r: &[u8]| {
        let open = r.iter().position(|b| *b == b'{');
        open.is_some_and(|at| r.get(at + 1) == Some(&b'}') && r[at + 2..].contains(&b'}'))
    };
    assert!(raws.iter().any(|r| empty_tag(r)), "{ctx}");

    let shards: serde_json::Map<String, Value> = types.iter().map(|(t, n)| (t.clone(), json!(n))).collect();
    let spec = json!({"shards": shards, "cases": cases.iter().map(Case::wire).collect::<Vec<_>>()});
    let spec = format!("'{}'", hex::encode(spec.to_string()));
    let servers = [RedisServer::start(), RedisServer::start(), RedisServer::start()];
    let py_read = python(&servers[0], &PYTHON.replace("SPEC", &spec));
    let js_read = node(&servers[1], &NODE.replace("SPEC", &spec));
    let rt = tokio_runtime();
    let mut s: Store = rt.block_on(store(&servers[2]));
    for (t, n) in &types {
        s = s.with_type_shards(&ty(t), *n);
    }
    for c in &cases {
        let payload = c.body.raw();
        let written = rt.block_on(s.schedule(
            &ty(&c.task_type),
            &c.id.raw(),
            c.at_ms,
            Some(payload.as_slice()),
            ScheduleMode::Upsert,
        ));
        assert!(written.unwrap(), "{c:?}: {ctx}");
    }

    // The same keys and bytes in all three, and exactly the layout's.
    let want = expected(&cases);
    let dumps = [("Python", dump(&servers[0])), ("Node", dump(&servers[1])), ("Rust", dump(&servers[2]))];
    for (client, got) in &dumps {
        if let Some(why) = difference(&want, got) {
            panic!("{client} wrote other keys or bytes than the layout's: {why}; {ctx}");
        }
    }
    assert!(dumps.iter().all(|(_, d)| d == &dumps[2].1));
    // The comparison sees one byte changed, a field left out, and a key too many.
    for change in 0..3 {
        let mut other = dumps[0].1.clone();
        let (key, (_, items)) = other.iter_mut().find(|(_, (kind, _))| kind == "hash").expect("a payload");
        let key = key.clone();
        match change {
            0 => *items[1].last_mut().unwrap() ^= 1,
            1 => drop(items.drain(..2)),
            _ => drop(other.insert(b"hourglass:{x}:due".to_vec(), ("zset".into(), Vec::new()))),
        }
        let why = difference(&want, &other).unwrap_or_else(|| panic!("change {change} went unseen"));
        assert!(change == 2 || why.starts_with(&format!("key {}", esc(&key))), "{why}");
    }
    let ids: usize = want.values().filter(|(kind, _)| kind == "zset").map(|(_, items)| items.len() / 2).sum();
    assert_eq!(ids, cases.len(), "every case is one member of a due set: {ctx}");

    // Each client finds each task in its shard, due, with its payload.
    let read: Vec<String> = cases
        .iter()
        .map(|c| {
            let body = c.body.raw();
            format!("{} due {} {}", c.tag(), c.at_ms, if body.is_empty() { "-".into() } else { hex::encode(body) })
        })
        .collect();
    for (client, out) in [("Python", &py_read), ("Node", &js_read)] {
        for (i, (got, want)) in out.lines().zip(&read).enumerate() {
            assert_eq!(got, want, "{client} reads case {i} ({:?}) elsewhere: {ctx}", cases[i]);
        }
        assert_eq!(out.lines().count(), cases.len(), "{client}: {ctx}");
    }
    for c in &cases {
        let v = rt.block_on(s.show(&ty(&c.task_type), &c.id.raw())).unwrap();
        let size = v.payload.as_ref().map_or(0, |p| p.size);
        assert_eq!(
            (v.task_type.to_string(), v.state, v.due_ms, size),
            (c.tag(), TaskState::Due, Some(c.at_ms), c.body.raw().len() as u64),
            "{ctx}"
        );
    }

    // A host runs every task: each type's shards as the clients were told.
    let config: String = types.iter().map(|(t, n)| format!("[types.\"{t}\"]\nshards = {n}\n")).collect();
    let plugins: Vec<(&str, std::path::PathBuf)> = types.iter().map(|(t, _)| (t.as_str(), plugin("noop"))).collect();
    let host = Host::start(&servers[0], &plugins, &config);
    let want: Vec<(String, u64, u64, u64)> = types
        .iter()
        .map(|(t, _)| (t.clone(), cases.iter().filter(|c| c.task_type == *t).count() as u64, 0, 0))
        .collect();
    let mut s = rt.block_on(store(&servers[0]));
    for (t, n) in &types {
        s = s.with_type_shards(&ty(t), *n);
    }
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let seen: Vec<(String, u64, u64, u64)> = types
            .iter()
            .map(|(t, _)| {
                let st = rt.block_on(s.stats(&ty(t))).unwrap();
                (t.clone(), st.succeeded, st.due_now + st.scheduled_later + st.in_flight, st.dead_total)
            })
            .collect();
        if seen == want {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the host did not run every task: (type, succeeded, left, dead) {seen:?}, want {want:?}; {ctx}; log:\n{}",
            host.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let left: Vec<Vec<u8>> =
        dump(&servers[0]).into_keys().filter(|k| k.ends_with(b":due") || k.ends_with(b":payload")).collect();
    assert!(
        left.is_empty(),
        "keys left after every task ran: {:?}; {ctx}",
        left.iter().map(|k| esc(k)).collect::<Vec<_>>()
    );
}
