//! Plugin config values from `runner.toml`: plain strings, or secrets taken
//! from the host's environment or a file.
//!
//! ```toml
//! [types."webhook"]
//! config = { url = "https://hooks.example.com/x", token = { env = "WEBHOOK_TOKEN" } }
//! # or: token = { file = "/run/secrets/webhook_token" }
//! ```
//!
//! Secrets are resolved when the registry loads the config (at start and on
//! every reload), never printed: the `Debug` of a [`ConfigValue`] shows where
//! a secret comes from, not its value, and resolved values only travel inside
//! [`Values`], whose `Debug` shows keys only. [`Secret`] is the same
//! promise for one string (the Redis password).

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Result, bail};
use serde::Deserialize;
use serde::de::{self, Deserializer, MapAccess, Visitor};

pub use crate::store::Secret;
use crate::task_type::TaskType;

/// One `config` value as written in `runner.toml`.
#[derive(Clone, PartialEq, Eq)]
pub enum ConfigValue {
    /// `key = "value"`: a plain value (not secret).
    Plain(String),
    /// `key = { env = "NAME" }`: the host's environment variable `NAME`.
    Env(String),
    /// `key = { file = "/run/secrets/x" }`: the file's content, without a trailing newline.
    File(PathBuf),
}

impl ConfigValue {
    /// The value, reading the environment or the file for a secret.
    /// `place` names it in errors, e.g. `types."webhook".config.token`.
    pub fn resolve(&self, place: &str) -> Result<String> {
        match self {
            ConfigValue::Plain(v) => Ok(v.clone()),
            ConfigValue::Env(name) => match std::env::var(name) {
                Ok(v) => Ok(v),
                Err(std::env::VarError::NotPresent) => {
                    bail!("{place}: environment variable {name} is not set")
                }
                Err(std::env::VarError::NotUnicode(_)) => {
                    bail!("{place}: environment variable {name} is not valid UTF-8")
                }
            },
            ConfigValue::File(path) => match std::fs::read_to_string(path) {
                Ok(v) => {
                    Ok(v.strip_suffix('\n').map(|v| v.strip_suffix('\r').unwrap_or(v)).unwrap_or(v.as_str()).to_owned())
                }
                Err(e) => bail!("{place}: cannot read secret file {}: {e}", path.display()),
            },
        }
    }

    /// Makes a relative secret file path relative to `base` (the config file's folder).
    pub fn resolve_path(&mut self, base: &Path) {
        if let ConfigValue::File(path) = self
            && path.is_relative()
        {
            *path = base.join(&*path);
        }
    }
}

impl fmt::Debug for ConfigValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigValue::Plain(v) => write!(f, "{v:?}"),
            ConfigValue::Env(name) => write!(f, "{{ env = {name:?} }}"),
            ConfigValue::File(path) => write!(f, "{{ file = {:?} }}", path.display().to_string()),
        }
    }
}

impl PartialEq<str> for ConfigValue {
    fn eq(&self, other: &str) -> bool {
        matches!(self, ConfigValue::Plain(v) if v == other)
    }
}

impl PartialEq<&str> for ConfigValue {
    fn eq(&self, other: &&str) -> bool {
        self == *other
    }
}

impl From<&str> for ConfigValue {
    fn from(v: &str) -> Self {
        ConfigValue::Plain(v.to_owned())
    }
}

impl<'de> Deserialize<'de> for ConfigValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ValueVisitor)
    }
}

struct ValueVisitor;

const EXPECTED: &str = "a string, { env = \"NAME\" } or { file = \"/path\" }";

impl<'de> Visitor<'de> for ValueVisitor {
    type Value = ConfigValue;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(EXPECTED)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<ConfigValue, E> {
        Ok(ConfigValue::Plain(v.to_owned()))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ConfigValue, A::Error> {
        let Some(key) = map.next_key::<String>()? else {
            return Err(de::Error::custom(format!("empty table: expected {EXPECTED}")));
        };
        let value = match key.as_str() {
            "env" => {
                let name: String = map.next_value()?;
                if name.is_empty() || name.contains(['=', '\0']) {
                    return Err(de::Error::custom(format!("invalid environment variable name {name:?}")));
                }
                ConfigValue::Env(name)
            }
            "file" => ConfigValue::File(map.next_value()?),
            other => {
                return Err(de::Error::custom(format!("unknown key `{other}`: expected {EXPECTED}")));
            }
        };
        if let Some(extra) = map.next_key::<String>()? {
            return Err(de::Error::custom(format!("unexpected key `{extra}`: expected {EXPECTED}")));
        }
        Ok(value)
    }
}

/// Resolved config values of one type, as the plugin reads them; `Debug` shows keys only.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Values(pub BTreeMap<String, String>);

impl fmt::Debug for Values {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.0.keys()).finish()
    }
}

/// Resolves every type's `config` values ([`Config::config_values`](crate::config::Config::config_values)), reading secrets.
///
/// Errors name the type and the key: `types."webhook".config.token:
/// environment variable WEBHOOK_TOKEN is not set`.
pub fn resolve_all<'a>(
    types: impl IntoIterator<Item = (&'a TaskType, &'a BTreeMap<String, ConfigValue>)>,
) -> Result<BTreeMap<TaskType, Arc<BTreeMap<String, String>>>> {
    let mut out = BTreeMap::new();
    for (task_type, config) in types {
        let mut values = BTreeMap::new();
        for (key, value) in config {
            let place = format!("types.\"{task_type}\".config.{key}");
            values.insert(key.clone(), value.resolve(&place)?);
        }
        out.insert(task_type.clone(), Arc::new(values));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn values_parse_resolve_and_never_print() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tok"), "file-secret-123\n").unwrap();
        // Setting env vars is unsafe in edition 2024 (the workspace forbids unsafe):
        // PATH, always set, stands in for a secret variable.
        let text = format!(
            "[types.\"webhook\"]\nconfig = {{ url = \"http://x\", token = {{ env = \"PATH\" }}, key = {{ file = \"{}\" }} }}\n",
            dir.path().join("tok").display()
        );
        let c = Config::parse(&text, "runner.toml").unwrap();
        let t: TaskType = "webhook".parse().unwrap();
        let debug = format!("{c:?}");
        assert!(debug.contains("env = \"PATH\""), "{debug}");
        assert!(!debug.contains("file-secret-123"), "{debug}");
        let resolved = resolve_all(c.config_values()).unwrap();
        assert_eq!(resolved[&t]["url"], "http://x");
        assert_eq!(resolved[&t]["key"], "file-secret-123");
        assert_eq!(resolved[&t]["token"], std::env::var("PATH").unwrap());
        let values = Values((*resolved[&t]).clone());
        assert!(!format!("{values:?}").contains("file-secret-123"));
    }

    #[test]
    fn missing_env_names_type_and_key() {
        let text = "[types.\"webhook\"]\nconfig = { token = { env = \"HOURGLASS_SURELY_NOT_SET_42\" } }\n";
        let c = Config::parse(text, "runner.toml").unwrap();
        let err = format!("{:#}", resolve_all(c.config_values()).unwrap_err());
        assert_eq!(err, "types.\"webhook\".config.token: environment variable HOURGLASS_SURELY_NOT_SET_42 is not set");
    }

    #[test]
    fn bad_secret_tables_are_refused() {
        for (text, needle) in [
            ("[types.a]\nconfig = { t = { vault = \"x\" } }", "unknown key `vault`"),
            ("[types.a]\nconfig = { t = { env = \"A\", file = \"b\" } }", "unexpected key `file`"),
            ("[types.a]\nconfig = { t = 5 }", "runner.toml:2"),
        ] {
            let err = format!("{:#}", Config::parse(text, "runner.toml").unwrap_err());
            assert!(err.contains(needle), "{text}: {err}");
        }
    }
}
