//! Retry delays: capped exponential backoff with "equal jitter".

use std::time::Duration;

use rand::Rng;

/// The delay before retry number `attempt` (1 = after the first failure):
/// a random point in the upper half of `min(cap, base * 2^(attempt-1))`.
///
/// Half fixed keeps a floor so retries never hammer a failing dependency;
/// half random spreads out tasks that failed together.
pub fn retry_delay(base: Duration, cap: Duration, attempt: u32) -> Duration {
    retry_delay_with(base, cap, attempt, rand::rng().random::<f64>())
}

/// [`retry_delay`] with the random part given: `jitter` in `0.0..=1.0`
/// picks from `ceiling / 2` (0.0) to `ceiling` (1.0); out-of-range values are clamped.
pub fn retry_delay_with(base: Duration, cap: Duration, attempt: u32, jitter: f64) -> Duration {
    let ceiling = ceiling(base, cap, attempt);
    let jitter = if jitter.is_nan() { 0.0 } else { jitter.clamp(0.0, 1.0) };
    let half = ceiling / 2;
    // `ceiling - half` rather than `half` so odd nanosecond counts still reach the ceiling.
    let spread = ceiling - half;
    // Float rounding may overshoot for huge durations; never go past the ceiling.
    let random = Duration::try_from_secs_f64(spread.as_secs_f64() * jitter).unwrap_or(spread);
    half + random.min(spread)
}

/// `min(cap, base * 2^(attempt-1))` without overflow; attempt 0 counts as 1.
fn ceiling(base: Duration, cap: Duration, attempt: u32) -> Duration {
    let exponent = attempt.saturating_sub(1);
    if exponent >= 32 {
        return cap;
    }
    base.checked_mul(1u32 << exponent).map_or(cap, |d| d.min(cap))
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn exact_values_with_fixed_jitter() {
        let cap = Duration::from_secs(300);
        assert_eq!(retry_delay_with(S, cap, 1, 0.0), Duration::from_millis(500));
        assert_eq!(retry_delay_with(S, cap, 1, 1.0), S);
        assert_eq!(retry_delay_with(S, cap, 3, 0.5), Duration::from_secs(3));
        assert_eq!(retry_delay_with(S, cap, 0, 1.0), S, "attempt 0 counts as 1");
    }

    #[test]
    fn stays_within_bounds() {
        let cap = Duration::from_secs(60);
        for attempt in 1..40 {
            let ceiling = ceiling(S, cap, attempt);
            for _ in 0..50 {
                let d = retry_delay(S, cap, attempt);
                assert!(d >= ceiling / 2 && d <= ceiling, "attempt {attempt}: {d:?}");
            }
        }
    }

    #[test]
    fn never_above_cap() {
        let cap = Duration::from_secs(300);
        assert_eq!(retry_delay_with(S, cap, 10, 1.0), cap);
        assert_eq!(retry_delay_with(S, cap, 10, 0.0), cap / 2);
        assert_eq!(retry_delay_with(S, cap, 9, 1.0), Duration::from_secs(256));
    }

    #[test]
    fn ceiling_is_monotone() {
        let cap = Duration::from_secs(3600);
        let mut last = Duration::ZERO;
        for attempt in 0..200 {
            let c = retry_delay_with(Duration::from_millis(7), cap, attempt, 1.0);
            assert!(c >= last, "attempt {attempt}");
            last = c;
        }
        assert_eq!(last, cap);
    }

    #[test]
    fn huge_inputs_do_not_overflow() {
        let cap = Duration::MAX;
        assert_eq!(retry_delay_with(Duration::from_secs(u64::MAX / 2), cap, 3, 1.0), cap);
        assert_eq!(retry_delay_with(S, cap, u32::MAX, 1.0), cap);
        assert_eq!(retry_delay_with(S, S, u32::MAX, f64::NAN), S / 2);
        assert_eq!(retry_delay_with(S, S, 2, 7.0), S);
    }
}
