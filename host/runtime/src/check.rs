//! `hourglass plugin check`: what a component imports and exports, and whether it fits the world.

use std::fmt;
use std::path::{Path, PathBuf};

use wasmtime::Engine;
use wasmtime::component::types::{ComponentFunc, ComponentItem};
use wasmtime::component::{Component, Type};

use super::WORLD;
use super::compile::{CompileLimits, CompileStats, Compiler, size};

/// What compiling a checked plugin took, and under which limits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompileReport {
    /// What the compile took; `None` when the compiled plugin came from the cache.
    pub stats: Option<CompileStats>,
    /// The limits it ran under.
    pub limits: CompileLimits,
    /// Where it ran.
    pub compiler: Compiler,
}

impl fmt::Display for CompileReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.stats {
            Some(stats) => write!(f, "{stats}")?,
            None => write!(f, "from the cache (compiled before)")?,
        }
        match self.compiler {
            Compiler::Child { .. } => write!(
                f,
                "; limits {} (compile_memory_limit), {} of CPU (compile_timeout); {} thread{} (compile_threads)",
                size(self.limits.memory),
                humantime::format_duration(self.limits.cpu_time),
                self.limits.threads,
                if self.limits.threads == 1 { "" } else { "s" }
            ),
            Compiler::InProcess => write!(f, "; compiled in process, without limits"),
        }
    }
}

/// What a plugin file is, for humans; see [`Runtime::check`](super::Runtime::check).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckReport {
    /// The file checked.
    pub path: PathBuf,
    /// First 12 hex digits of its SHA-256.
    pub hash: String,
    /// The world it appears to implement.
    pub world: String,
    /// The interpreter it bundles, if any.
    pub interpreter: crate::interpreter::Interpreter,
    /// Its imports, one per line (`name: kind`).
    pub imports: Vec<String>,
    /// Its exports, one per line (`name: kind`).
    pub exports: Vec<String>,
    /// What keeps it from fitting [`WORLD`]; empty when it fits.
    pub problems: Vec<String>,
    /// What compiling it took.
    pub compile: CompileReport,
}

impl CheckReport {
    pub(super) fn new(
        engine: &Engine,
        path: &Path,
        hash: String,
        wasm: &Component,
        link_error: Option<String>,
        typed_error: Option<String>,
        compile: CompileReport,
    ) -> CheckReport {
        let ty = wasm.component_type();
        let imports: Vec<String> = ty.imports(engine).map(|(name, e)| describe(engine, name, &e.ty)).collect();
        let export_names: Vec<&str> = ty.exports(engine).map(|(name, _)| name).collect();
        let exports: Vec<String> = ty.exports(engine).map(|(name, e)| describe(engine, name, &e.ty)).collect();

        let has_handle = matches!(ty.get_export(engine, "handle").map(|e| e.ty), Some(ComponentItem::ComponentFunc(_)));
        let mut problems = Vec::new();
        if !has_handle {
            problems.push(format!("does not export `handle` of {WORLD}"));
        } else if let Some(e) = &typed_error {
            problems.push(format!("exports `handle` with the wrong type: {e}"));
        }
        if let Some(e) = &link_error {
            problems.push(format!("imports something the host does not provide: {e}"));
        }

        let world = if problems.is_empty() {
            WORLD.to_owned()
        } else if export_names.iter().any(|n| n.starts_with("wasi:cli/run@")) {
            "wasi:cli/command (a program with `main`, not a task handler)".to_owned()
        } else if export_names.iter().any(|n| n.starts_with("wasi:http/incoming-handler@")) {
            "wasi:http/proxy (an HTTP handler, not a task handler)".to_owned()
        } else if has_handle {
            format!("something like {WORLD}, but not compatible")
        } else {
            "an unknown world".to_owned()
        };

        let interpreter = crate::interpreter::Interpreter::None;
        CheckReport { path: path.to_owned(), hash, world, interpreter, imports, exports, problems, compile }
    }

    /// Whether the component implements [`WORLD`], so the host can run it.
    pub fn fits(&self) -> bool {
        self.problems.is_empty()
    }

    /// One line for load errors: what is wrong and what the component is instead.
    pub(super) fn problem_line(&self) -> String {
        let exports: Vec<&str> =
            self.exports.iter().map(|e| e.split_once(": ").map_or(e.as_str(), |(n, _)| n)).collect();
        let exports = if exports.is_empty() { "nothing".to_owned() } else { exports.join(", ") };
        format!("{} (it implements: {}; exports: {exports})", self.problems.join("; "), self.world)
    }
}

impl fmt::Display for CheckReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "plugin:  {} (sha256 {})", self.path.display(), self.hash)?;
        writeln!(f, "world:   {}", self.world)?;
        writeln!(f, "engine:  {}", self.interpreter)?;
        writeln!(f, "compile: {}", self.compile)?;
        writeln!(f, "imports:")?;
        if self.imports.is_empty() {
            writeln!(f, "  (none)")?;
        }
        for i in &self.imports {
            writeln!(f, "  {i}")?;
        }
        writeln!(f, "exports:")?;
        if self.exports.is_empty() {
            writeln!(f, "  (none)")?;
        }
        for e in &self.exports {
            writeln!(f, "  {e}")?;
        }
        if self.fits() {
            writeln!(f, "result:  OK, fits {WORLD}")
        } else {
            writeln!(f, "result:  does NOT fit {WORLD}:")?;
            for p in &self.problems {
                writeln!(f, "  - {p}")?;
            }
            Ok(())
        }
    }
}

/// `name: kind`, with the functions of an instance listed, e.g.
/// `hourglass:plugin/log@0.1.0: instance { log }`.
fn describe(engine: &Engine, name: &str, item: &ComponentItem) -> String {
    match item {
        ComponentItem::ComponentFunc(func) => format!("{name}: {}", func_sig(func)),
        ComponentItem::ComponentInstance(inst) => {
            let funcs: Vec<&str> = inst
                .exports(engine)
                .filter(|(_, e)| matches!(e.ty, ComponentItem::ComponentFunc(_)))
                .map(|(n, _)| n)
                .collect();
            format!("{name}: instance {{ {} }}", funcs.join(", "))
        }
        ComponentItem::CoreFunc(_) => format!("{name}: core func"),
        ComponentItem::Module(_) => format!("{name}: core module"),
        ComponentItem::Component(_) => format!("{name}: component"),
        ComponentItem::Type(_) => format!("{name}: type"),
        ComponentItem::Resource(_) => format!("{name}: resource"),
    }
}

fn func_sig(func: &ComponentFunc) -> String {
    let params: Vec<String> = func.params().map(|(n, t)| format!("{n}: {}", type_name(&t))).collect();
    let results: Vec<String> = func.results().map(|t| type_name(&t)).collect();
    match results.as_slice() {
        [] => format!("func({})", params.join(", ")),
        _ => format!("func({}) -> {}", params.join(", "), results.join(", ")),
    }
}

/// A short WIT-like spelling of a type (records and variants by their field names).
fn type_name(ty: &Type) -> String {
    let opt = |t: Option<Type>| t.map_or("_".to_owned(), |t| type_name(&t));
    match ty {
        Type::Bool => "bool".into(),
        Type::S8 => "s8".into(),
        Type::U8 => "u8".into(),
        Type::S16 => "s16".into(),
        Type::U16 => "u16".into(),
        Type::S32 => "s32".into(),
        Type::U32 => "u32".into(),
        Type::S64 => "s64".into(),
        Type::U64 => "u64".into(),
        Type::Float32 => "f32".into(),
        Type::Float64 => "f64".into(),
        Type::Char => "char".into(),
        Type::String => "string".into(),
        Type::List(l) => format!("list<{}>", type_name(&l.ty())),
        Type::Option(o) => format!("option<{}>", type_name(&o.ty())),
        Type::Result(r) => format!("result<{}, {}>", opt(r.ok()), opt(r.err())),
        Type::Record(r) => {
            let fields: Vec<String> = r.fields().map(|f| format!("{}: {}", f.name, type_name(&f.ty))).collect();
            format!("record {{ {} }}", fields.join(", "))
        }
        Type::Variant(v) => {
            let cases: Vec<String> = v
                .cases()
                .map(|c| match c.ty {
                    Some(t) => format!("{}({})", c.name, type_name(&t)),
                    None => c.name.to_owned(),
                })
                .collect();
            format!("variant {{ {} }}", cases.join(", "))
        }
        Type::Enum(e) => format!("enum {{ {} }}", e.names().collect::<Vec<_>>().join(", ")),
        Type::Flags(fl) => format!("flags {{ {} }}", fl.names().collect::<Vec<_>>().join(", ")),
        Type::Tuple(t) => format!("tuple<{}>", t.types().map(|t| type_name(&t)).collect::<Vec<_>>().join(", ")),
        Type::Own(_) => "own<resource>".into(),
        Type::Borrow(_) => "borrow<resource>".into(),
        other => format!("{other:?}").split(['(', ' ']).next().unwrap_or("?").to_lowercase(),
    }
}
