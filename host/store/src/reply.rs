//! Reading Redis replies: the loose shapes scripts return, turned into typed values or a clear error.

use anyhow::{Context, Result, anyhow, bail};
use redis::Value;

pub(super) fn array(v: Value) -> Result<Vec<Value>> {
    match v {
        Value::Array(items) | Value::Set(items) => Ok(items),
        Value::Nil => Ok(Vec::new()),
        other => bail!("expected an array, got {other:?}"),
    }
}

pub(super) fn opt_bytes(v: Value) -> Result<Option<Vec<u8>>> {
    match v {
        Value::Nil => Ok(None),
        Value::BulkString(b) => Ok(Some(b)),
        Value::SimpleString(s) => Ok(Some(s.into_bytes())),
        Value::Okay => Ok(Some(b"OK".to_vec())),
        Value::Int(i) => Ok(Some(i.to_string().into_bytes())),
        other => bail!("expected a string, got {other:?}"),
    }
}

pub(super) fn bytes(v: Value) -> Result<Vec<u8>> {
    opt_bytes(v)?.ok_or_else(|| anyhow!("unexpected nil"))
}

pub(super) fn opt_int(v: Value) -> Result<Option<i64>> {
    match v {
        Value::Int(i) => Ok(Some(i)),
        Value::Nil => Ok(None),
        other => {
            let b = bytes(other)?;
            let s = std::str::from_utf8(&b).context("number is not text")?;
            Ok(Some(s.trim().parse().with_context(|| format!("bad integer {s:?}"))?))
        }
    }
}

pub(super) fn int(v: Value) -> Result<i64> {
    opt_int(v)?.ok_or_else(|| anyhow!("unexpected nil"))
}

/// A sorted-set score as whole ms; `inf`/`-inf` (allowed to clients) saturate.
pub(super) fn score(v: Value) -> Result<Option<i64>> {
    match v {
        Value::Nil => Ok(None),
        Value::Int(i) => Ok(Some(i)),
        Value::Double(d) => Ok(Some(d as i64)),
        other => {
            let b = bytes(other)?;
            let s = std::str::from_utf8(&b).context("score is not text")?;
            let d: f64 = s.trim().parse().with_context(|| format!("bad score {s:?}"))?;
            Ok(Some(d as i64))
        }
    }
}
