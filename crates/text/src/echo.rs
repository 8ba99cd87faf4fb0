//! The one bound on what a client sent that comes back to it: in an error
//! message, a header (`rpc-error-reason`), a log line. A value longer than
//! [`ECHO_BYTES`] is cut there and says its full length, so a 3 MB
//! `location` costs a 300-byte answer, not a 3 MB one.

use std::borrow::Cow;

/// Bytes of a client's value echoed at most.
pub const ECHO_BYTES: usize = 256;

/// Bytes of a whole error message at most (the net under every message,
/// whatever it quotes: a few values cut to [`ECHO_BYTES`] and their words).
pub const MESSAGE_BYTES: usize = 1024;

/// `value` as an answer may echo it: whole up to [`ECHO_BYTES`], else its
/// first bytes (cut on a character boundary) and its length.
pub fn echo(value: &str) -> Cow<'_, str> {
    echo_within(value, ECHO_BYTES)
}

/// [`echo`] with a bound of `limit` bytes.
pub fn echo_within(value: &str, limit: usize) -> Cow<'_, str> {
    if value.len() <= limit {
        return Cow::Borrowed(value);
    }
    let mut end = limit;
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Owned(format!("{}... ({} bytes)", &value[..end], value.len()))
}

/// [`echo`] of bytes that may not be UTF-8 (a flare method name).
pub fn echo_bytes(value: &[u8]) -> String {
    let head = &value[..value.len().min(ECHO_BYTES)];
    let text = String::from_utf8_lossy(head);
    if value.len() <= ECHO_BYTES {
        text.into_owned()
    } else {
        format!("{text}... ({} bytes)", value.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_values_come_back_whole_and_long_ones_cut_with_their_length() {
        assert_eq!(echo("host:8335"), "host:8335");
        let exact = "a".repeat(ECHO_BYTES);
        assert_eq!(echo(&exact), exact.as_str());
        let long = "é".repeat(3_000_000);
        let cut = echo(&long);
        assert!(cut.len() < ECHO_BYTES + 32, "{} bytes", cut.len());
        assert!(cut.ends_with("... (6000000 bytes)"), "{cut}");
        assert!(cut.starts_with("éé"));
        let bytes = vec![b'x'; 100_000];
        let cut = echo_bytes(&bytes);
        assert!(cut.ends_with("... (100000 bytes)") && cut.len() < ECHO_BYTES + 32);
        assert_eq!(echo_bytes(b"yadcc.X"), "yadcc.X");
    }
}
