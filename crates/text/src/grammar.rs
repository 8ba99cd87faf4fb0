//! The text forms a request's values must take, each as a parser and as the
//! regular expression the OpenAPI document states: a servant's location, and
//! a header's decimal integer (with the ranges of the timeout and
//! sequence-number headers); and `Content-Length` as RFC 9112 and hyper
//! read it. A leaf: the engine checks a location with it, the transports
//! read headers with it, the OpenAPI builder states it.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    ops::RangeInclusive,
    sync::LazyLock,
};

/// Range of `Rpc-Timeout` and `Connect-Timeout-Ms`, in milliseconds: a
/// positive integer of at most 10 digits, as the Connect protocol defines it.
pub const TIMEOUT_MS: RangeInclusive<u64> = 1..=9_999_999_999;

/// Range of `Rpc-SeqNo`: the daemons' correlation id, a decimal 64-bit integer.
pub const SEQ_NO: RangeInclusive<u64> = 0..=u64::MAX;

/// A header value that must be a decimal integer within `range`: ASCII
/// digits only (no sign, no spaces), at most 20 of them.
pub fn header_integer(text: &str, range: &RangeInclusive<u64>) -> Option<u64> {
    if text.is_empty() || text.len() > 20 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse::<u64>()
        .ok()
        .filter(|value| range.contains(value))
}

/// A `Content-Length` that is not one decimal number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("Content-Length must be one decimal number: digits only, every value the same")]
pub struct BadContentLength;

/// A request's `Content-Length` from all its values, as RFC 9112 (section
/// 6.3) and hyper read it: each value a comma-separated list of decimal
/// numbers, digits only (no sign, no space inside, not empty, within 64
/// bits), all of them the same number. Ok(None) without the header; Err for
/// anything else, which a server must answer 400 and close: a proxy that
/// read another value would frame the next request differently (request
/// smuggling).
pub fn content_length<'a>(
    values: impl IntoIterator<Item = &'a [u8]>,
) -> Result<Option<u64>, BadContentLength> {
    let mut length = None;
    for value in values {
        for element in value.split(|&byte| byte == b',') {
            let digits = element.trim_ascii();
            if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
                return Err(BadContentLength);
            }
            let number = digits.iter().try_fold(0u64, |number, digit| {
                number.checked_mul(10)?.checked_add(u64::from(digit - b'0'))
            });
            match (number, length) {
                (None, _) => return Err(BadContentLength),
                (Some(number), Some(seen)) if number != seen => return Err(BadContentLength),
                (Some(number), _) => length = Some(number),
            }
        }
    }
    Ok(length)
}

/// Text on one line: no control character (Unicode's `Cc`: U+0000 to
/// U+001F, U+007F to U+009F), so that a log line or a table cell shows it
/// as given. An operator's reason must be one.
pub fn is_one_line(text: &str) -> bool {
    !text.chars().any(char::is_control)
}

/// [`is_one_line`] as a regular expression (ECMA 262 and Python `re` alike).
pub const ONE_LINE_PATTERN: &str = "^[^\\u0000-\\u001f\\u007f-\\u009f]*$";

/// A servant's reported location: an IPv4 address and port (`10.0.0.1:8335`)
/// or a bracketed IPv6 address and port (`[2001:db8::1]:8335`); no zone id
/// (other machines could not use it). The port is decimal digits, leading
/// zeros allowed (`:080` is 80), as the original's parser reads it.
pub fn parse_location(text: &str) -> Option<SocketAddr> {
    let (host, port) = text.rsplit_once(':')?;
    if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let significant = port.trim_start_matches('0');
    let port = if significant.is_empty() {
        0
    } else if significant.len() > 5 {
        return None;
    } else {
        significant.parse::<u16>().ok()?
    };
    let ip = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(v6) => IpAddr::V6(v6.parse::<Ipv6Addr>().ok()?),
        None => IpAddr::V4(host.parse::<Ipv4Addr>().ok()?),
    };
    Some(SocketAddr::new(ip, port))
}

/// [`parse_location`] as a regular expression (ECMA 262 and Python `re`
/// alike): exactly the strings it accepts.
pub fn location_pattern() -> &'static str {
    static PATTERN: LazyLock<String> = LazyLock::new(|| {
        let octet = decimal_alternatives(0, 255);
        let ipv4 = format!("(?:{octet})(?:\\.(?:{octet})){{3}}");
        let h16 = "[0-9A-Fa-f]{1,4}";
        let ls32 = format!("(?:{h16}:{h16}|{ipv4})");
        // RFC 3986's IPv6address: "::" stands for one group or more.
        let head = |groups: usize| match groups {
            0 => String::new(),
            n => format!("(?:(?:{h16}:){{0,{}}}{h16})?", n - 1),
        };
        let tail = |groups: usize| format!("(?:{h16}:){{{groups}}}");
        let ipv6 = [
            format!("{}{ls32}", tail(6)),
            format!("::{}{ls32}", tail(5)),
            format!("{}::{}{ls32}", head(1), tail(4)),
            format!("{}::{}{ls32}", head(2), tail(3)),
            format!("{}::{}{ls32}", head(3), tail(2)),
            format!("{}::{h16}:{ls32}", head(4)),
            format!("{}::{ls32}", head(5)),
            format!("{}::{h16}", head(6)),
            format!("{}::", head(7)),
        ]
        .join("|");
        let port = decimal_alternatives(0, 65535);
        format!("^(?:{ipv4}|\\[(?:{ipv6})\\]):0*(?:{port})$")
    });
    &PATTERN
}

/// A regular expression for the decimal integers `low..=high` as written
/// without sign or leading zeros (`-` for negative ones), anchored.
pub fn integer_pattern(low: i128, high: i128) -> String {
    let mut alternatives = Vec::new();
    if low < 0 {
        let magnitudes = decimal_alternatives(high.min(-1).unsigned_abs(), low.unsigned_abs());
        alternatives.push(format!("-(?:{magnitudes})"));
    }
    if high >= 0 {
        alternatives.push(decimal_alternatives(
            low.max(0).unsigned_abs(),
            high.unsigned_abs(),
        ));
    }
    format!("^(?:{})$", alternatives.join("|"))
}

/// Alternatives (`a|b|...`) matching the decimals `low..=high`.
fn decimal_alternatives(low: u128, high: u128) -> String {
    let mut alternatives = Vec::new();
    let (low_text, high_text) = (low.to_string(), high.to_string());
    for length in low_text.len()..=high_text.len() {
        let smallest = if length == 1 {
            0
        } else {
            10u128.pow(length as u32 - 1)
        };
        let largest = 10u128.saturating_pow(length as u32) - 1;
        let from = low.max(smallest).to_string();
        let to = high.min(largest).to_string();
        same_length(
            from.as_bytes(),
            to.as_bytes(),
            String::new(),
            &mut alternatives,
        );
    }
    alternatives.join("|")
}

/// Appends alternatives matching the digit strings from `low` to `high`
/// (same length, `low <= high`), each after `prefix`.
fn same_length(low: &[u8], high: &[u8], prefix: String, out: &mut Vec<String>) {
    let digit_class = |from: u8, to: u8| {
        if from == to {
            (from as char).to_string()
        } else {
            format!("[{}-{}]", from as char, to as char)
        }
    };
    let any = |count: usize| match count {
        0 => String::new(),
        1 => "[0-9]".to_owned(),
        n => format!("[0-9]{{{n}}}"),
    };
    let Some((&first_low, rest_low)) = low.split_first() else {
        out.push(prefix);
        return;
    };
    let (&first_high, rest_high) = high.split_first().expect("same length");
    let rest = rest_low.len();
    if first_low == first_high {
        return same_length(
            rest_low,
            rest_high,
            format!("{prefix}{}", first_low as char),
            out,
        );
    }
    let all_zeros = rest_low.iter().all(|&b| b == b'0');
    let all_nines = rest_high.iter().all(|&b| b == b'9');
    // The low digit with its own rest, unless it starts a whole block.
    let block_start = if all_zeros { first_low } else { first_low + 1 };
    if !all_zeros {
        let nines = vec![b'9'; rest];
        same_length(
            rest_low,
            &nines,
            format!("{prefix}{}", first_low as char),
            out,
        );
    }
    let block_end = if all_nines {
        first_high
    } else {
        first_high - 1
    };
    if block_start <= block_end {
        out.push(format!(
            "{prefix}{}{}",
            digit_class(block_start, block_end),
            any(rest)
        ));
    }
    if !all_nines {
        let zeros = vec![b'0'; rest];
        same_length(
            &zeros,
            rest_high,
            format!("{prefix}{}", first_high as char),
            out,
        );
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn content_length_is_one_decimal_number_as_hyper_reads_it() {
        let parse = |values: &[&str]| content_length(values.iter().map(|value| value.as_bytes()));
        assert_eq!(parse(&[]), Ok(None));
        assert_eq!(parse(&["0"]), Ok(Some(0)));
        assert_eq!(parse(&["1300"]), Ok(Some(1300)));
        assert_eq!(parse(&["007"]), Ok(Some(7)));
        assert_eq!(parse(&["18446744073709551615"]), Ok(Some(u64::MAX)));
        // The same number more than once is one length, as hyper accepts.
        assert_eq!(parse(&["3", "3"]), Ok(Some(3)));
        assert_eq!(parse(&["3, 3"]), Ok(Some(3)));
        for bad in [
            &["3", "4"][..],
            &["3, 4"],
            &["+3"],
            &["-3"],
            &["3a"],
            &["3 4"],
            &["0x3"],
            &[""],
            &["3,"],
            &["18446744073709551616"],
            &["３"],
        ] {
            assert_eq!(parse(bad), Err(BadContentLength), "{bad:?}");
        }
    }

    use super::*;

    #[test]
    fn header_integers_are_plain_digits_in_range() {
        assert_eq!(header_integer("1500", &TIMEOUT_MS), Some(1500));
        assert_eq!(
            header_integer("9999999999", &TIMEOUT_MS),
            Some(9_999_999_999)
        );
        assert_eq!(
            header_integer("18446744073709551615", &SEQ_NO),
            Some(u64::MAX)
        );
        for bad in [
            "",
            "0",
            "10000000000",
            "+5",
            "-1",
            " 5",
            "1.5",
            "abc",
            "1e3",
        ] {
            assert_eq!(header_integer(bad, &TIMEOUT_MS), None, "{bad}");
        }
        assert_eq!(header_integer("18446744073709551616", &SEQ_NO), None);
    }

    #[test]
    fn locations_are_ip_and_port_without_zone() {
        assert!(parse_location("10.0.0.1:8335").is_some());
        assert!(parse_location("[::1]:0").is_some());
        assert!(parse_location("[2001:db8::1]:65535").is_some());
        // Leading zeros in the port, as the original's parser reads them.
        for (padded, port) in [
            ("10.0.0.1:080", 80),
            ("10.0.0.1:000065535", 65535),
            ("[::1]:00", 0),
        ] {
            assert_eq!(
                parse_location(padded).map(|a| a.port()),
                Some(port),
                "{padded}"
            );
        }
        assert_eq!(
            parse_location("10.0.0.1:08335").unwrap().to_string(),
            "10.0.0.1:8335",
            "normalised"
        );
        for bad in [
            "",
            "10.0.0.1",
            "10.0.0.1:",
            "host:8335",
            "::1:8335",
            "10.0.0.1:65536",
            "10.0.0.1:0065536",
            "10.0.0.1:+80",
            "10.0.0.1: 80",
            "[fe80::1%2]:8335",
            "010.0.0.1:80",
            "[10.0.0.1]:80",
        ] {
            assert!(parse_location(bad).is_none(), "{bad}");
        }
    }
}

#[cfg(test)]
mod pattern_tests {
    use regex::Regex;

    use super::*;

    #[test]
    fn the_one_line_pattern_is_the_one_line_check() {
        let pattern = Regex::new(ONE_LINE_PATTERN).unwrap();
        for text in [
            "",
            "bad disk",
            "ünïcödé · 中文",
            "\u{a0}no-break",
            "a\nb",
            "tab\t",
            "\u{7f}",
            "c1 \u{85}",
            "\u{9f}",
            "\u{0}",
        ] {
            assert_eq!(pattern.is_match(text), is_one_line(text), "{text:?}");
        }
        assert!(!is_one_line("a\u{9f}") && is_one_line("a\u{a0}"));
    }
    #[test]
    fn integer_patterns_match_exactly_the_range() {
        let small = Regex::new(&integer_pattern(0, 30000)).unwrap();
        for n in 0..=40_000u32 {
            assert_eq!(small.is_match(&n.to_string()), n <= 30000, "{n}");
        }
        for bad in ["", "01", "-0", "-1", "1e3", " 1", "30000 "] {
            assert!(!small.is_match(bad), "{bad}");
        }
        let positive = Regex::new(&integer_pattern(1, 1024)).unwrap();
        assert!(!positive.is_match("0") && positive.is_match("1") && positive.is_match("1024"));
        assert!(!positive.is_match("1025"));

        let unsigned = Regex::new(&integer_pattern(0, u64::MAX.into())).unwrap();
        for good in [
            "0",
            "9",
            "10",
            "18446744073709551615",
            "18446744073709551609",
            "9999999999999999999",
        ] {
            assert!(unsigned.is_match(good), "{good}");
        }
        for bad in [
            "18446744073709551616",
            "18446744073709551620",
            "99999999999999999999",
            "100000000000000000000",
        ] {
            assert!(!unsigned.is_match(bad), "{bad}");
        }
        let signed = Regex::new(&integer_pattern(i32::MIN.into(), i32::MAX.into())).unwrap();
        for good in ["-2147483648", "2147483647", "0", "-1"] {
            assert!(signed.is_match(good), "{good}");
        }
        for bad in ["-2147483649", "2147483648", "-0", "--1"] {
            assert!(!signed.is_match(bad), "{bad}");
        }
        // Random values against the arithmetic.
        for _ in 0..2_000 {
            let n: u64 = rand::random::<u64>() >> rand::random_range(0..64);
            let low: u64 = rand::random_range(0..1_000_000);
            let high: u64 = low + rand::random_range(0..10_000_000);
            let pattern = Regex::new(&integer_pattern(low.into(), high.into())).unwrap();
            assert_eq!(
                pattern.is_match(&n.to_string()),
                (low..=high).contains(&n),
                "{n} in {low}..={high}"
            );
        }
    }

    #[test]
    fn the_location_pattern_is_the_parser() {
        let pattern = Regex::new(location_pattern()).unwrap();
        let samples = [
            "10.0.0.1:8335",
            "0.0.0.0:0",
            "255.255.255.255:65535",
            "256.0.0.1:1",
            "1.2.3:4",
            "1.2.3.4:65536",
            "1.2.3.4:08335",
            "1.2.3.4:0000",
            "1.2.3.4:065536",
            "1.2.3.4:",
            "1.2.3.4:-1",
            "01.2.3.4:1",
            "1.2.3.4",
            "[::]:1",
            "[::1]:8335",
            "[1:2:3:4:5:6:7:8]:1",
            "[1:2:3:4:5:6:7::]:1",
            "[1:2:3:4:5:6:7:8:9]:1",
            "[1:2:3:4:5:6:7::8]:1",
            "[::ffff:1.2.3.4]:80",
            "[::ffff:01.2.3.4]:80",
            "[1:2:3:4:5:6:1.2.3.4]:80",
            "[1::2::3]:80",
            "[12345::]:80",
            "[fe80::1%2]:80",
            "[ABCD:ef01::]:9",
            "[::1]",
            "::1:80",
            "[::1]:",
            "[:1]:80",
            "[1:]:80",
            "[1:2:3:4:5:6:7:8:]:1",
            "[::1.2.3.4]:1",
            "[1::1.2.3.4]:1",
            "[1:2:3:4:5:6:7:1.2.3.4]:1",
            "[0000:0000::]:1",
            "[00000::]:1",
            " 1.2.3.4:5",
            "1.2.3.4:5 ",
        ];
        for sample in samples {
            assert_eq!(
                pattern.is_match(sample),
                parse_location(sample).is_some(),
                "{sample}"
            );
        }
    }
}
