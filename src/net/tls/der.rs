//! Just enough DER to read what the logs and metrics say about a
//! certificate: its subject's common name and when it expires. (A whole
//! X.509 parser would be a dependency for two fields.)

/// 2.5.4.3, id-at-commonName.
const COMMON_NAME: &[u8] = &[0x55, 0x04, 0x03];

/// One element: (tag, contents, rest).
fn element(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let count = usize::from(first & 0x7f);
        if count == 0 || count > 4 || rest.len() < count {
            return None;
        }
        let len = rest[..count]
            .iter()
            .fold(0usize, |len, &byte| (len << 8) | usize::from(byte));
        (len, &rest[count..])
    };
    (rest.len() >= len).then(|| (tag, &rest[..len], &rest[len..]))
}

pub(super) fn common_name(certificate: &[u8]) -> Option<String> {
    let (_, certificate, _) = element(certificate)?;
    let (_, mut tbs, _) = element(certificate)?;
    // [0] version (optional), serial, signature, issuer, validity, subject.
    if tbs.first() == Some(&0xa0) {
        tbs = element(tbs)?.2;
    }
    for _ in 0..4 {
        tbs = element(tbs)?.2;
    }
    let (_, mut subject, _) = element(tbs)?;
    while !subject.is_empty() {
        let (_, set, rest) = element(subject)?;
        subject = rest;
        let (_, attribute, _) = element(set)?;
        let (_, oid, value) = element(attribute)?;
        if oid == COMMON_NAME {
            let (_, name, _) = element(value)?;
            return String::from_utf8(name.to_vec()).ok();
        }
    }
    None
}

/// The certificate's `notAfter`, in seconds since the Unix epoch.
pub(super) fn not_after(certificate: &[u8]) -> Option<i64> {
    let (_, certificate, _) = element(certificate)?;
    let (_, mut tbs, _) = element(certificate)?;
    // [0] version (optional), serial, signature, issuer, validity.
    if tbs.first() == Some(&0xa0) {
        tbs = element(tbs)?.2;
    }
    for _ in 0..3 {
        tbs = element(tbs)?.2;
    }
    let (_, validity, _) = element(tbs)?;
    let (_, _, validity) = element(validity)?;
    let (tag, time, _) = element(validity)?;
    time_of(tag, std::str::from_utf8(time).ok()?)
}

/// UTCTime (`YYMMDDHHMMSSZ`, years 1950-2049, tag 0x17) or GeneralizedTime
/// (`YYYYMMDDHHMMSSZ`, tag 0x18), the two forms RFC 5280 allows, always in
/// UTC with seconds.
fn time_of(tag: u8, text: &str) -> Option<i64> {
    let digits = text.strip_suffix('Z')?;
    if !digits.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    let number = |range: std::ops::Range<usize>| digits.get(range)?.parse::<i64>().ok();
    let (year, rest) = match (tag, digits.len()) {
        (0x17, 12) => {
            let short = number(0..2)?;
            (
                if short >= 50 {
                    1900 + short
                } else {
                    2000 + short
                },
                2,
            )
        }
        (0x18, 14) => (number(0..4)?, 4),
        _ => return None,
    };
    let month = number(rest..rest + 2)?;
    let day = number(rest + 2..rest + 4)?;
    let hour = number(rest + 4..rest + 6)?;
    let minute = number(rest + 6..rest + 8)?;
    let second = number(rest + 8..rest + 10)?;
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    Some(days_from_civil(year, month, day) * 86_400 + hour * 3_600 + minute * 60 + second)
}

/// Days from 1970-01-01 to a date of the proleptic Gregorian calendar
/// (H. Hinnant's `days_from_civil`: eras of 400 years, March-based years).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let march_month = (month + 9) % 12;
    let day_of_year = (153 * march_month + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_count_from_the_epoch_across_leap_years() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(days_from_civil(2024, 2, 29), 19_782);
        assert_eq!(days_from_civil(1969, 12, 31), -1);
    }

    #[test]
    fn both_time_forms_read_and_others_do_not() {
        assert_eq!(time_of(0x17, "491231235959Z"), Some(2_524_607_999));
        assert_eq!(time_of(0x17, "500101000000Z"), Some(-631_152_000));
        assert_eq!(time_of(0x18, "20491231235959Z"), Some(2_524_607_999));
        assert_eq!(time_of(0x18, "99991231235959Z"), Some(253_402_300_799));
        assert_eq!(
            time_of(0x17, "20491231235959Z"),
            None,
            "a length of the other form"
        );
        assert_eq!(time_of(0x18, "20491231235959+0100"), None, "not UTC");
        assert_eq!(time_of(0x18, "20491332235959Z"), None, "month 13");
    }

    #[test]
    fn a_certificates_expiry_is_read() {
        let mut params = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
        params.not_after = rcgen::date_time_ymd(2031, 7, 15);
        let key = rcgen::KeyPair::generate().unwrap();
        let certificate = params.self_signed(&key).unwrap();
        assert_eq!(
            not_after(certificate.der()),
            Some(days_from_civil(2031, 7, 15) * 86_400)
        );
        assert_eq!(not_after(b"\x30\x03\x02\x01\x01"), None);
    }
}
