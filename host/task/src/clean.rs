//! Text from outside the host (guest log lines, task ids any Redis client wrote), made safe for one log line.

/// Text from outside the host (a guest's log line, a task id written by any
/// Redis client) shown with its control characters escaped, so that a `\n`
/// in it can never start a line that looks like one of the host's own.
#[derive(Debug, Clone, Copy)]
pub struct Clean<'a>(pub &'a str);

impl std::fmt::Display for Clean<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use std::fmt::Write as _;
        let mut rest = self.0;
        while let Some(at) = rest.find(char::is_control) {
            f.write_str(&rest[..at])?;
            let c = rest[at..].chars().next().unwrap_or_default();
            match c {
                '\n' => f.write_str("\\n")?,
                '\r' => f.write_str("\\r")?,
                '\t' => f.write_char('\t')?,
                c => write!(f, "\\u{{{:x}}}", c as u32)?,
            }
            rest = &rest[at + c.len_utf8()..];
        }
        f.write_str(rest)
    }
}

/// A task id for log lines: lossy UTF-8 with control characters escaped.
pub fn clean_id(id: &[u8]) -> String {
    clean_id_cow(id).into_owned()
}

/// [`clean_id`], borrowing the id when it needs no change (UTF-8 without
/// control characters, as ids usually are): for events on hot paths, and a
/// plain copy rather than formatting for every run's own.
pub fn clean_id_cow(id: &[u8]) -> std::borrow::Cow<'_, str> {
    match std::str::from_utf8(id) {
        Ok(text) if !text.contains(char::is_control) => std::borrow::Cow::Borrowed(text),
        _ => std::borrow::Cow::Owned(Clean(&String::from_utf8_lossy(id)).to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped() {
        let forged = "ok\n2026-01-01T00:00:00Z  INFO hourglass::runner: hourglass is running\r\x1b[31m";
        let shown = Clean(forged).to_string();
        assert!(!shown.contains('\n') && !shown.contains('\r') && !shown.contains('\x1b'), "{shown}");
        assert!(shown.starts_with("ok\\n2026"), "{shown}");
        assert!(shown.ends_with("\\r\\u{1b}[31m"), "{shown}");
        assert_eq!(Clean("tab\tand é").to_string(), "tab\tand é");
        assert_eq!(clean_id(b"a\nb\xff"), "a\\nb\u{fffd}");
        assert_eq!(clean_id(b"order-42"), "order-42");
        assert!(matches!(clean_id_cow(b"order-42"), std::borrow::Cow::Borrowed("order-42")));
        assert_eq!(clean_id_cow(b"a\rb"), "a\\rb");
    }
}
