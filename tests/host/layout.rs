//! The shape of the host's crates: imports between each crate's top-level modules point one way, the host links Redis and wasmtime only through its crates, no file is over 600 lines, and the clients ship the store's scripts unchanged.
//!
//! Read from the source, as a reviewer would: every `crate::<module>` a
//! module's code names (comments and its `#[cfg(test)]` modules aside,
//! `use crate::{a, b}` included) is an edge of the graph, and a cycle fails
//! the test naming its modules. Between crates, cargo keeps the arrows one
//! way: `hourglass-task` names none of the others, `hourglass-store` (Redis)
//! and `hourglass-runtime` (wasmtime) name only it, and `hourglass` sits on top.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// No Rust file of ours is longer: each reads in one sitting.
const MAX_LINES: usize = 600;

/// The crates read here: their names and `src` folders.
fn crates() -> Vec<(&'static str, PathBuf)> {
    let host = Path::new(env!("CARGO_MANIFEST_DIR"));
    vec![
        ("hourglass", host.join("src")),
        ("hourglass-task", host.join("task/src")),
        ("hourglass-store", host.join("store/src")),
        ("hourglass-runtime", host.join("runtime/src")),
    ]
}

fn sources(src: &Path) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(src, &mut out);
    out.sort();
    out
}

/// The top-level module a source file of the crate at `src` belongs to (`None` for the crate root and the binary).
fn top_module(src: &Path, path: &Path) -> Option<String> {
    let rel = path.strip_prefix(src).unwrap();
    let first = rel.components().next()?.as_os_str().to_string_lossy().trim_end_matches(".rs").to_owned();
    (first != "lib" && first != "main").then_some(first)
}

/// `code` without its `#[cfg(test)] mod name { ... }` blocks (code after them stays).
fn without_test_modules(code: &str) -> String {
    let mut out = String::new();
    let mut rest = code;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let after = &rest[at + "#[cfg(test)]".len()..];
        let item = after.trim_start();
        // `mod tests;` (its own file) or one attributed item up to its line's end.
        let Some(open) = item.find(['{', ';']).filter(|_| item.starts_with("mod ")) else {
            rest = after.split_once('\n').map_or("", |(_, r)| r);
            continue;
        };
        if item.as_bytes()[open] == b';' {
            rest = &item[open + 1..];
            continue;
        }
        let mut depth = 0usize;
        let mut end = item.len();
        for (i, c) in item[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = open + i + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        rest = &item[end..];
    }
    out.push_str(rest);
    out
}

/// The modules `code` names as `crate::<module>` or in `crate::{a, b::c}`, outside comments and test modules.
fn imports(code: &str) -> BTreeSet<String> {
    names_after(code, "crate::")
}

/// The names `code` takes from `prefix` (`crate::`, `super::`, `crate::admin::`): `prefix<name>` or
/// `prefix{a, b::c}`, outside comments and test modules.
fn names_after(code: &str, prefix: &str) -> BTreeSet<String> {
    let code = without_test_modules(code);
    let mut found = BTreeSet::new();
    let ident = |s: &str| -> String {
        s.trim_start().chars().take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_').collect()
    };
    // A comment starts a line or follows code after " // " (so "redis://x" in a string stays code).
    let code: String = code
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .map(|l| l.split(" // ").next().unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n");
    for (at, _) in code.match_indices(prefix) {
        // `crate::` inside `hourglass_store::crate::`-like paths is not ours; `super::` must start a path.
        if code[..at].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        let after = &code[at + prefix.len()..];
        if let Some(group) = after.strip_prefix('{') {
            // The names at the group's top level, each up to its first `::`.
            let mut depth = 0usize;
            let mut start = 0;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        found.insert(ident(&group[start..i]));
                        break;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        found.insert(ident(&group[start..i]));
                        start = i + 1;
                    }
                    _ => {}
                }
            }
        } else {
            found.insert(ident(after));
        }
    }
    found.remove("");
    found.remove("self");
    found
}

/// The strongly connected components of more than one module (Tarjan).
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Walk<'a> {
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        found: Vec<Vec<String>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, v: &'a str) {
            let i = self.index.len();
            self.index.insert(v, i);
            self.low.insert(v, i);
            self.stack.push(v);
            for w in self.graph[v].iter().filter(|w| self.graph.contains_key(*w)) {
                if !self.index.contains_key(w.as_str()) {
                    self.visit(w);
                    let lw = self.low[w.as_str()];
                    self.low.entry(v).and_modify(|l| *l = (*l).min(lw));
                } else if self.stack.contains(&w.as_str()) {
                    let iw = self.index[w.as_str()];
                    self.low.entry(v).and_modify(|l| *l = (*l).min(iw));
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    component.push(w.to_owned());
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.found.push(component);
                }
            }
        }
    }
    let mut walk = Walk { graph, index: BTreeMap::new(), low: BTreeMap::new(), stack: Vec::new(), found: Vec::new() };
    for v in graph.keys() {
        if !walk.index.contains_key(v.as_str()) {
            walk.visit(v);
        }
    }
    walk.found
}

#[test]
fn the_finder_sees_a_cycle() {
    let graph: BTreeMap<String, BTreeSet<String>> =
        [("a", vec!["b"]), ("b", vec!["c"]), ("c", vec!["a"]), ("d", vec!["a"])]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.into_iter().map(str::to_owned).collect()))
            .collect();
    assert_eq!(cycles(&graph), vec![vec!["a".to_owned(), "b".to_owned(), "c".to_owned()]]);
    let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    assert_eq!(
        imports("use crate::store::Store; // crate::admin\n// crate::host\nx(crate::clock::now())"),
        names(&["clock", "store"])
    );
    assert_eq!(
        imports("use crate::{health::Health, task::{A, B},\n    wakeup};"),
        names(&["health", "task", "wakeup"])
    );
    // A test module is left out; what follows it is read.
    let code = "#[cfg(test)]\nmod tests {\n    use crate::admin;\n    fn f() { {} }\n}\nuse crate::clock;\n";
    assert_eq!(imports(code), names(&["clock"]));
    assert_eq!(imports("#[cfg(test)]\nmod tests;\nuse crate::cli;"), names(&["cli"]));
    assert_eq!(
        names_after("use super::{state::A, run};\nsuper::super::x();", "super::"),
        names(&["run", "state", "super"])
    );
}

#[test]
fn imports_between_top_level_modules_have_no_cycle() {
    for (name, src) in crates() {
        let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for path in sources(&src) {
            let Some(module) = top_module(&src, &path) else { continue };
            let code = std::fs::read_to_string(&path).unwrap();
            let mut names = imports(&code);
            names.remove(&module);
            graph.entry(module).or_default().extend(names);
        }
        // The vocabulary crate has 4 modules; every other has more than 10.
        let least = if name == "hourglass-task" { 4 } else { 11 };
        assert!(graph.len() >= least, "read {} modules of {name}: the walk found too little", graph.len());
        let found = cycles(&graph);
        assert!(found.is_empty(), "import cycles between top-level modules of {name}: {found:?}");
    }
}

/// Inside a module with files of its own (`runtime/`, `admin/`, the
/// store's `groups/`), its files import one another one way too: a file's
/// `super::<sibling>` and `crate::<module>::<sibling>` are its edges.
#[test]
fn imports_between_the_files_of_one_module_have_no_cycle() {
    let mut modules_read = 0;
    for (name, src) in crates() {
        let mut folders: Vec<PathBuf> =
            sources(&src).iter().filter_map(|p| p.parent().map(Path::to_path_buf)).collect();
        folders.sort();
        folders.dedup();
        for folder in folders.into_iter().filter(|f| *f != src) {
            let files: Vec<PathBuf> = sources(&folder).into_iter().filter(|p| p.parent() == Some(&folder)).collect();
            let stem = |p: &Path| p.file_stem().unwrap().to_string_lossy().into_owned();
            let siblings: BTreeSet<String> = files.iter().map(|p| stem(p)).collect();
            let module_path = folder.strip_prefix(&src).unwrap().to_string_lossy().replace('/', "::");
            let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
            for path in &files {
                let code = std::fs::read_to_string(path).unwrap();
                let mut names = names_after(&code, "super::");
                names.extend(names_after(&code, &format!("crate::{module_path}::")));
                names.retain(|n| siblings.contains(n) && *n != stem(path));
                graph.insert(stem(path), names);
            }
            modules_read += 1;
            let found = cycles(&graph);
            assert!(found.is_empty(), "import cycles between the files of {name}'s {module_path}: {found:?}");
        }
    }
    assert!(modules_read >= 4, "read {modules_read} modules with files: the walk found too little");
}

/// Every Rust file of the workspace that is ours: the crates' sources, the
/// bench, the SDK, and the tests (the plugins are checked by their own build).
fn workspace_rust_files() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut dirs: Vec<PathBuf> = crates().into_iter().map(|(_, src)| src).collect();
    dirs.extend(["bench/src", "bench/tests", "plugin-sdk/src", "tests"].map(|d| root.join(d)));
    dirs.iter().flat_map(|d| sources(d)).collect()
}

#[test]
fn no_rust_file_is_over_600_lines() {
    let files = workspace_rust_files();
    assert!(files.len() > 100, "read {} files: the walk found too little", files.len());
    let long: Vec<String> = files
        .iter()
        .filter_map(|path| {
            let lines = std::fs::read_to_string(path).unwrap().lines().count();
            (lines > MAX_LINES).then(|| format!("{} ({lines} lines)", path.display()))
        })
        .collect();
    assert!(long.is_empty(), "over {MAX_LINES} lines (split by topic into child modules): {long:#?}");
}

/// The clients run the host's own Lua scripts: each copy the Python and Node
/// clients ship (clients/sync-scripts.sh writes them) is byte for byte the
/// host's, so a script changed here and not copied there fails here.
#[test]
fn the_clients_ship_the_hosts_scripts_unchanged() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let host = root.join("host/store/src/scripts");
    let names = std::fs::read_to_string(root.join("clients/scripts.txt")).unwrap();
    let names: Vec<&str> = names.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(names.contains(&"prelude") && names.len() >= 10, "clients/scripts.txt lists {names:?}");
    for client in ["clients/python/hourglass_client/scripts", "clients/node/scripts"] {
        let shipped: BTreeSet<String> = std::fs::read_dir(root.join(client))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        let listed: BTreeSet<String> = names.iter().map(|n| format!("{n}.lua")).collect();
        assert_eq!(shipped, listed, "{client} ships other scripts than clients/scripts.txt lists");
        for name in &names {
            let file = format!("{name}.lua");
            let theirs = std::fs::read(root.join(client).join(&file)).unwrap();
            let ours = std::fs::read(host.join(&file)).unwrap_or_else(|e| panic!("{file}: {e}"));
            assert!(theirs == ours, "{client}/{file} differs from the host's: run 'bash clients/sync-scripts.sh'");
        }
    }
}

/// The host crate (`hourglass`) reaches Redis only through `hourglass-store` and
/// wasmtime only through `hourglass-runtime`, as docs/architecture.md draws it:
/// neither is among its own (non-dev) dependencies, so cargo refuses a
/// `redis::` or `wasmtime::` path in its code (`cargo tree -e normal -p
/// hourglass --depth 1` lists neither).
#[test]
fn the_host_links_redis_and_wasmtime_only_through_its_crates() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
    let manifest: toml::Table = std::fs::read_to_string(&manifest).unwrap().parse().unwrap();
    let deps = manifest["dependencies"].as_table().expect("a [dependencies] table");
    assert!(deps.contains_key("hourglass-store") && deps.contains_key("hourglass-runtime"), "{deps:?}");
    let direct: Vec<&String> = deps.keys().filter(|name| *name == "redis" || name.starts_with("wasmtime")).collect();
    assert!(direct.is_empty(), "the host depends on {direct:?} itself: go through hourglass-store / hourglass-runtime");
}

/// `url` (through redis) takes its Unicode tables from `idna_adapter`, whose
/// version in Cargo.lock picks the back end: 1.2 is ICU4X (about 25 crates and
/// their derive macros), 1.1 is unicode-rs. The pin keeps the first build
/// short (BENCHMARKS.md "The first build"); a `cargo update` drops it, and
/// `cargo update -p idna_adapter --precise 1.1.0` puts it back.
#[test]
fn the_lock_file_keeps_url_off_icu4x() {
    let lock = Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.lock");
    let lock: toml::Table = std::fs::read_to_string(&lock).unwrap().parse().unwrap();
    let packages = lock["package"].as_array().expect("[[package]] entries");
    let versions: Vec<&str> = packages
        .iter()
        .filter(|p| p["name"].as_str() == Some("idna_adapter"))
        .filter_map(|p| p["version"].as_str())
        .collect();
    assert!(
        versions.iter().all(|v| v.starts_with("1.1.")),
        "Cargo.lock has idna_adapter {versions:?}: run `cargo update -p idna_adapter --precise 1.1.0`"
    );
    let icu: Vec<&str> = packages.iter().filter_map(|p| p["name"].as_str()).filter(|n| n.starts_with("icu_")).collect();
    assert!(icu.is_empty(), "Cargo.lock pulls in ICU4X again: {icu:?}");
}

/// The clients cut `schedule_batch` calls at the host's bounds (a call holds
/// Redis about a millisecond at most): the numbers in their sources are the store's.
#[test]
fn the_clients_cut_schedule_batches_and_group_children_as_the_host_does() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let number = |file: &str, name: &str| -> usize {
        let code = std::fs::read_to_string(root.join(file)).unwrap();
        let line =
            code.lines().find(|l| l.contains(&format!("{name} = "))).unwrap_or_else(|| panic!("{file}: no {name}"));
        let value = line.split('=').nth(1).unwrap().trim().trim_end_matches(';');
        value.split('*').map(|f| f.trim().parse::<usize>().unwrap_or_else(|e| panic!("{file}: {line}: {e}"))).product()
    };
    for file in ["clients/python/hourglass_client/_bulk.py", "clients/node/bulk.js"] {
        assert_eq!(number(file, "MAX_BATCH_TASKS"), hourglass::store::MAX_BATCH_TASKS, "{file}");
        assert_eq!(number(file, "MAX_BATCH_BYTES"), hourglass::store::MAX_BATCH_BYTES, "{file}");
    }
    for file in ["clients/python/hourglass_client/_core.py", "clients/node/index.js"] {
        assert_eq!(number(file, "CHILDREN_PER_CALL"), hourglass::store::CHILDREN_PER_CALL, "{file}");
    }
}
