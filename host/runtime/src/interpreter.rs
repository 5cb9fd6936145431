//! Which interpreter a plugin carries (CPython, QuickJS-ng, StarlingMonkey), or none: told from its bytes, for operators.

use std::fmt;

/// What runs a plugin's code: its own compiled WebAssembly, or an interpreter it bundles.
///
/// Told by signatures each toolchain's engine leaves in the binary (source
/// paths in its panic messages, a log line of its start), not by the
/// producers section, which componentize-qjs leaves empty. A handler's own
/// source is in the binary too, so each signature is one no handler writes
/// by chance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interpreter {
    /// No interpreter: compiled to WebAssembly (Rust, C, Go...).
    None,
    /// CPython, bundled by componentize-py.
    CPython,
    /// JavaScript on QuickJS-ng, bundled by componentize-qjs.
    QuickJs,
    /// JavaScript on StarlingMonkey (SpiderMonkey), bundled by componentize-js.
    StarlingMonkey,
}

/// Each interpreter's signatures: all of them in a binary name it.
const SIGNATURES: [(Interpreter, &[&[u8]]); 3] = [
    (Interpreter::StarlingMonkey, &[b"StarlingMonkey engine initializing"]),
    (Interpreter::QuickJs, &[b"rquickjs-core", b"componentize_qjs"]),
    (Interpreter::CPython, &[b"componentize-py", b"Py_Initialize"]),
];

impl Interpreter {
    /// The interpreter in the component `bytes`.
    pub fn of(bytes: &[u8]) -> Interpreter {
        SIGNATURES
            .iter()
            .find(|(_, marks)| marks.iter().all(|m| memchr::memmem::find(bytes, m).is_some()))
            .map_or(Interpreter::None, |(i, _)| *i)
    }

    /// Its short name, for logs and metrics labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Interpreter::None => "none",
            Interpreter::CPython => "cpython",
            Interpreter::QuickJs => "quickjs",
            Interpreter::StarlingMonkey => "starlingmonkey",
        }
    }
}

impl fmt::Display for Interpreter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Interpreter::None => "none (compiled WebAssembly)",
            Interpreter::CPython => "Python on CPython (componentize-py)",
            Interpreter::QuickJs => "JavaScript on QuickJS-ng (componentize-qjs)",
            Interpreter::StarlingMonkey => "JavaScript on StarlingMonkey (componentize-js)",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_signature_names_its_interpreter_and_a_plain_module_none() {
        assert_eq!(
            Interpreter::of(b"\0asm...rquickjs-core-0.12.1/src/result.rs...componentize_qjs"),
            Interpreter::QuickJs
        );
        assert_eq!(Interpreter::of(b"StarlingMonkey engine initializing"), Interpreter::StarlingMonkey);
        assert_eq!(Interpreter::of(b"componentize-py ... Py_Initialize"), Interpreter::CPython);
        assert_eq!(Interpreter::of(b"\0asm\x0d\0\x01\0"), Interpreter::None);
        // A handler that only mentions an engine in its source is not taken for it.
        assert_eq!(Interpreter::of(b"// works on StarlingMonkey and rquickjs-core"), Interpreter::None);
    }
}
