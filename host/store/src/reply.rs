//! Reading Redis replies: the loose shapes scripts return, turned into typed values or a clear error.

use anyhow::{Context, Result, anyhow, bail};
use redis::Value;

use crate::task::{Claim, ClaimedTask};
use crate::task_type::TaskType;

pub(super) fn parse_claim(t: &TaskType, value: Value) -> Result<Claim> {
    let mut top = array(value)?.into_iter();
    let mut next = || top.next().ok_or_else(|| anyhow!("short reply"));
    let now_ms = int(next()?)?;
    let claimed = array(next()?)?;
    // Both absent (false, read as nil) when no task has a payload or a retried attempt.
    let payloads = opt_array(next()?)?;
    let attempts = opt_array(next()?)?;
    let dead = array(next()?)?;
    let next_due_ms = score(next()?)?;
    let next_lease_expiry_ms = score(next()?)?;
    let lease_expiry_ms = int(next()?)?;
    let first_token = u64::try_from(int(next()?)?).context("negative token")?;
    let throttled_ms = opt_int(top.next().unwrap_or(Value::Nil))?;
    let paused = opt_int(top.next().unwrap_or(Value::Nil))?.unwrap_or(0) == 1;

    let n = claimed.len() / 2;
    if claimed.len() % 2 != 0 || dead.len() % 2 != 0 {
        bail!("odd list lengths");
    }
    if payloads.as_ref().is_some_and(|p| p.len() != n) || attempts.as_ref().is_some_and(|a| a.len() != n) {
        bail!("payloads or attempts do not match the {n} tasks claimed");
    }
    let mut payloads = payloads.map(Vec::into_iter);
    let mut attempts = attempts.map(Vec::into_iter);
    let mut tasks = Vec::with_capacity(n);
    let mut it = claimed.into_iter();
    let mut token = first_token;
    while let (Some(id), Some(due)) = (it.next(), it.next()) {
        let payload = match payloads.as_mut().and_then(Iterator::next) {
            Some(p) => opt_bytes(p)?.unwrap_or_default(),
            None => Vec::new(),
        };
        let attempt = match attempts.as_mut().and_then(Iterator::next) {
            Some(a) => u32::try_from(int(a)?).unwrap_or(u32::MAX),
            None => 1,
        };
        tasks.push(ClaimedTask {
            task_type: t.clone(),
            id: bytes(id)?,
            payload,
            attempt,
            due_ms: score(due)?.unwrap_or(0),
            token,
            claim: first_token,
        });
        token += 1;
    }
    let mut dead_lettered = Vec::with_capacity(dead.len() / 2);
    let mut it = dead.into_iter();
    while let (Some(id), Some(reason)) = (it.next(), it.next()) {
        dead_lettered.push((bytes(id)?, String::from_utf8_lossy(&bytes(reason)?).into_owned()));
    }
    Ok(Claim { now_ms, tasks, dead_lettered, next_due_ms, next_lease_expiry_ms, lease_expiry_ms, throttled_ms, paused })
}

/// An array, or `None` for the nil a script's `false` becomes.
fn opt_array(v: Value) -> Result<Option<Vec<Value>>> {
    match v {
        Value::Nil => Ok(None),
        other => array(other).map(Some),
    }
}

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
