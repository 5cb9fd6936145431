//! The cases of the agreement test (`super`): random task types with shard counts, ids, payloads
//! and due times, from a seeded generator, each as the Rust store is given it (bytes) and as the
//! Python and Node programs are (`wire`: JSON).

use crate::support::ty;
use hourglass::task_type::{shard_of, shard_tags};
use serde_json::{Value, json};

/// How many tasks each client schedules, over six types.
const CASES: usize = 72;

/// splitmix64: small, seedable, and the same on every machine.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// 0 to `n - 1`.
    fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
    /// `lo` to `hi`, both included.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len() as u64) as usize]
    }
}

/// A task id as each client is given it. `alt`: a `bytearray` in Python and a `Uint8Array` (not a
/// `Buffer`) in Node, instead of `bytes` and `Buffer`.
#[derive(Debug, Clone)]
pub(super) enum Id {
    Bytes {
        raw: Vec<u8>,
        alt: bool,
    },
    Text(String),
    /// Written as its decimal text; Node gets a `number` when it is a safe integer, else a `BigInt`.
    Int(i128),
}

impl Id {
    pub(super) fn raw(&self) -> Vec<u8> {
        match self {
            Id::Bytes { raw, .. } => raw.clone(),
            Id::Text(s) => s.as_bytes().to_vec(),
            Id::Int(n) => n.to_string().into_bytes(),
        }
    }
    pub(super) fn wire(&self) -> Value {
        match self {
            Id::Bytes { raw, alt } => json!({"k": "bytes", "v": hex::encode(raw), "alt": alt}),
            Id::Text(s) => json!({"k": "text", "v": hex::encode(s)}),
            Id::Int(n) => json!({"k": "int", "v": n.to_string()}),
        }
    }
}

/// A payload as each client is given it; the Rust store is given `raw()`.
#[derive(Debug, Clone)]
pub(super) enum Body {
    None,
    Bytes {
        raw: Vec<u8>,
        alt: bool,
    },
    Text(String),
    /// A JSON value other than a string or null, as its text (serde_json's, which the Rust
    /// caller writes as is): Python and Node parse it and are given the value.
    Json(String),
}

impl Body {
    pub(super) fn raw(&self) -> Vec<u8> {
        match self {
            Body::None => Vec::new(),
            Body::Bytes { raw, .. } => raw.clone(),
            Body::Text(s) | Body::Json(s) => s.as_bytes().to_vec(),
        }
    }
    pub(super) fn wire(&self) -> Value {
        match self {
            Body::None => json!({"k": "none", "v": ""}),
            Body::Bytes { raw, alt } => json!({"k": "bytes", "v": hex::encode(raw), "alt": alt}),
            Body::Text(s) => json!({"k": "text", "v": hex::encode(s)}),
            Body::Json(s) => json!({"k": "json", "v": s}),
        }
    }
}

#[derive(Debug, Clone)]
pub(super) struct Case {
    pub(super) task_type: String,
    pub(super) shards: u16,
    pub(super) id: Id,
    pub(super) body: Body,
    pub(super) at_ms: i64,
    /// Through `schedule_many` / `scheduleMany` (the Rust store has only `schedule`).
    pub(super) bulk: bool,
}

impl Case {
    /// The hash tag of the shard that holds it, as the host computes it.
    pub(super) fn tag(&self) -> String {
        let t = ty(&self.task_type);
        shard_tags(&t, self.shards)[usize::from(shard_of(&self.id.raw(), self.shards))].to_string()
    }
    pub(super) fn wire(&self) -> Value {
        json!({"t": self.task_type, "id": self.id.wire(), "p": self.body.wire(), "at": self.at_ms, "bulk": self.bulk})
    }
}

/// A valid type name, `[a-z0-9][a-z0-9._-]{0,63}`: mostly short, sometimes as long as allowed.
fn type_name(rng: &mut Rng) -> String {
    const FIRST: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    const REST: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789._-";
    let len = if rng.chance(20) { 64 } else { rng.range(1, 12) as usize };
    let mut name = vec![rng.pick(FIRST)];
    name.extend((1..len).map(|_| rng.pick(REST)));
    String::from_utf8(name).unwrap()
}

/// Bytes that are not UTF-8 (an 0xff in them), with NUL when `nul`, and braces now and then (a
/// `{hash tag}` in an id changes its slot).
fn binary(rng: &mut Rng, nul: bool) -> Vec<u8> {
    const SPECIAL: &[u8] = &[0x00, 0xff, b'{', b'}', 0x80, 0xc3, b'\n'];
    let len = rng.range(0, 19);
    let mut raw: Vec<u8> =
        (0..len).map(|_| if rng.chance(25) { rng.pick(SPECIAL) } else { rng.next_u64() as u8 }).collect();
    for special in [Some(0xff), nul.then_some(0x00)].into_iter().flatten() {
        let at = rng.below(raw.len() as u64 + 1) as usize;
        raw.insert(at, special);
    }
    raw
}

/// An id with an empty hash tag and a `}` after it: Redis hashes the whole id (cluster-key-slot
/// 1.1.2, which the Node client used, hashed the bytes up to that `}`: another shard).
fn empty_tag(rng: &mut Rng) -> Vec<u8> {
    let mut raw: Vec<u8> = binary(rng, true).into_iter().filter(|b| *b != b'{').collect();
    raw.extend_from_slice(b"{}");
    raw.extend(binary(rng, false));
    raw.push(b'}');
    raw
}

/// Unicode text of `1..=most` characters: 2-, 3- and 4-byte UTF-8, NUL and control characters,
/// quotes, backslashes and braces.
fn text(rng: &mut Rng, most: u64) -> String {
    const POOL: &[char] = &[
        'a',
        'Z',
        '0',
        '9',
        ' ',
        '{',
        '}',
        '"',
        '\\',
        '/',
        '\0',
        '\n',
        '\t',
        '\u{1}',
        '\u{7f}',
        'é',
        'ß',
        'ą',
        '€',
        '日',
        '本',
        '\u{200b}',
        '\u{2028}',
        '\u{feff}',
        '🦀',
        '😀',
        '\u{10ffff}',
    ];
    (0..rng.range(1, most)).map(|_| rng.pick(POOL)).collect()
}

/// An integer id: zero, small, negative, around 2^53 (the largest a JS number holds exactly) and
/// past 2^64 (a Python int, a JS BigInt).
fn integer(rng: &mut Rng) -> i128 {
    const SAFE: i128 = (1 << 53) - 1;
    let n = match rng.below(6) {
        0 => 0,
        1 => rng.range(1, 1000) as i128,
        2 => SAFE - rng.range(0, 3) as i128,
        3 => SAFE + rng.range(1, 1000) as i128,
        4 => i128::from(rng.next_u64()) * 1_000_003,
        _ => rng.next_u64() as i128,
    };
    if rng.chance(30) { -n } else { n }
}

/// A JSON value whose text every language writes the same way: integers within ±(2^53 - 1),
/// decimals with at most two places that are not whole (Python writes `1.0` where JS writes `1`),
/// and object keys that are not array indices (JS puts those first).
fn json_value(rng: &mut Rng, depth: u32) -> Value {
    let leaf = depth == 0 || rng.chance(40);
    match rng.below(if leaf { 5 } else { 7 }) {
        0 => json!(rng.range(0, (1 << 53) - 1) as i64 * if rng.chance(40) { -1 } else { 1 }),
        1 => {
            let m = loop {
                let m = rng.range(1, 99_999_999) as i64;
                if m % 100 != 0 {
                    break if rng.chance(40) { -m } else { m };
                }
            };
            json!(m as f64 / 100.0)
        }
        2 => json!(rng.chance(50)),
        3 => Value::Null,
        4 => json!(text(rng, 8)),
        5 => Value::Array((0..rng.range(0, 4)).map(|_| json_value(rng, depth - 1)).collect()),
        _ => Value::Object(
            (0..rng.range(0, 4)).map(|_| (format!("k{}", text(rng, 5)), json_value(rng, depth - 1))).collect(),
        ),
    }
}

fn payload(rng: &mut Rng) -> Body {
    let alt = rng.chance(30);
    match rng.below(4) {
        0 => Body::None,
        1 => {
            let nul = rng.chance(50);
            Body::Bytes { raw: if rng.chance(10) { Vec::new() } else { binary(rng, nul) }, alt }
        }
        2 => Body::Text(if rng.chance(10) { String::new() } else { text(rng, 16) }),
        _ => {
            // Mostly an object or an array; now and then a bare number or bool, false and 0 included.
            let value = match rng.below(10) {
                0 => [json!(0), json!(false), json!(true), json!(-7), json!(2.5)][rng.below(5) as usize].clone(),
                1..=5 => Value::Object(
                    (0..rng.range(0, 4)).map(|_| (format!("k{}", text(rng, 5)), json_value(rng, 2))).collect(),
                ),
                _ => Value::Array((0..rng.range(0, 4)).map(|_| json_value(rng, 2)).collect()),
            };
            Body::Json(serde_json::to_string(&value).unwrap())
        }
    }
}

/// The types (name, shards) and the cases of one seed; no two cases share a type and an id.
pub(super) fn generate(seed: u64) -> (Vec<(String, u16)>, Vec<Case>) {
    let mut rng = Rng(seed);
    let mut counts = vec![1u16, 2, 3, 256, rng.range(1, 256) as u16, rng.range(1, 256) as u16];
    for i in (1..counts.len()).rev() {
        counts.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let mut types: Vec<(String, u16)> = Vec::new();
    for n in counts {
        let name = loop {
            let name = type_name(&mut rng);
            if types.iter().all(|(t, _)| *t != name) {
                break name;
            }
        };
        types.push((name, n));
    }
    let mut cases: Vec<Case> = Vec::new();
    while cases.len() < CASES {
        let i = cases.len();
        // Each type has a case; case 8 is of the type with 256 shards.
        let of = match i {
            _ if i < types.len() => i,
            8 => types.iter().position(|(_, n)| *n == 256).unwrap(),
            _ => rng.below(types.len() as u64) as usize,
        };
        let (task_type, shards) = types[of].clone();
        // The first of each kind is sure to hold what the issue names: NUL and 0xff, a 4-byte
        // character, an integer past 2^64; and case 8 an empty hash tag.
        let id = match i % 4 {
            0 if i == 8 => Id::Bytes { raw: empty_tag(&mut rng), alt: true },
            0 => {
                let nul = i == 0 || rng.chance(50);
                Id::Bytes { raw: binary(&mut rng, nul), alt: rng.chance(30) }
            }
            1 if i == 1 => Id::Text(format!("🦀{}", text(&mut rng, 9))),
            1 => Id::Text(text(&mut rng, 10)),
            2 => Id::Text((0..rng.range(1, 20)).map(|_| char::from(b'0' + rng.below(10) as u8)).collect()),
            _ if i == 3 => Id::Int(-(1 << 70) - rng.below(1000) as i128),
            _ => Id::Int(integer(&mut rng)),
        };
        if cases.iter().any(|c| c.task_type == task_type && c.id.raw() == id.raw()) {
            continue;
        }
        let at_ms = 1_600_000_000_000 + rng.below(1_000_000_000) as i64;
        cases.push(Case { task_type, shards, id, body: payload(&mut rng), at_ms, bulk: rng.chance(50) });
    }
    (types, cases)
}
