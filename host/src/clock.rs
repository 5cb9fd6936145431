//! Wall-clock time as the host and its commands use it: ms since the epoch, and how to show it.

/// Milliseconds since the Unix epoch, by this machine's clock.
pub fn now_ms() -> i64 {
    jiff::Timestamp::now().as_millisecond()
}

/// Formats ms since the epoch as RFC 3339 UTC, for humans.
pub fn format_ms(ms: i64) -> String {
    jiff::Timestamp::from_millisecond(ms).map(|t| t.to_string()).unwrap_or_else(|_| format!("{ms} ms"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_ms_as_rfc3339_utc() {
        assert_eq!(format_ms(1_700_000_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(format_ms(i64::MAX), format!("{} ms", i64::MAX));
    }
}
