//! A strict RFC 3339 `date-time` checker (section 5.6), for the assignment's `timestamp`:
//!
//! ```text
//! date-time = full-date ("T" / "t") full-time
//! full-date = 4DIGIT "-" 2DIGIT "-" 2DIGIT        ; month 01-12, day valid for the month
//! full-time = 2DIGIT ":" 2DIGIT ":" 2DIGIT ["." 1*DIGIT] ("Z" / "z" / ("+" / "-") 2DIGIT ":" 2DIGIT)
//! ```
//!
//! Hours 00-23, minutes 00-59, seconds 00-60 (60: a leap second), offset hours 00-23 and
//! minutes 00-59. A space for the `T` (allowed by the RFC's note, not by its grammar) is
//! refused.

/// `secs` since the Unix epoch as an RFC 3339 date-time in UTC, whole seconds
/// (`1970-01-01T00:00:00Z`).
pub fn format_unix(secs: i64) -> String {
    let (days, rem) = (secs.div_euclid(86400), secs.rem_euclid(86400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// `Ok` when `s` is an RFC 3339 date-time; else what is wrong, in a few words.
pub fn check(s: &str) -> Result<(), String> {
    let b = s.as_bytes();
    let digits = |at: usize, n: usize, what: &str| -> Result<u32, String> {
        let part = b
            .get(at..at + n)
            .filter(|p| p.iter().all(u8::is_ascii_digit))
            .ok_or_else(|| format!("{what} is not {n} digits at byte {at}"))?;
        Ok(part.iter().fold(0, |acc, d| acc * 10 + u32::from(d - b'0')))
    };
    let sep = |at: usize, want: &[u8], what: &str| -> Result<(), String> {
        match b.get(at) {
            Some(c) if want.contains(c) => Ok(()),
            _ => Err(format!("expected {what} at byte {at}")),
        }
    };
    let year = digits(0, 4, "the year")?;
    sep(4, b"-", "'-'")?;
    let month = digits(5, 2, "the month")?;
    sep(7, b"-", "'-'")?;
    let day = digits(8, 2, "the day")?;
    if !(1..=12).contains(&month) {
        return Err(format!("month {month:02} is not in 01-12"));
    }
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let days = match month {
        2 if leap => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    };
    if !(1..=days).contains(&day) {
        return Err(format!(
            "day {day:02} is not in 01-{days} for {year:04}-{month:02}"
        ));
    }
    sep(10, b"Tt", "'T'")?;
    let hour = digits(11, 2, "the hour")?;
    sep(13, b":", "':'")?;
    let minute = digits(14, 2, "the minute")?;
    sep(16, b":", "':'")?;
    let second = digits(17, 2, "the second")?;
    if hour > 23 {
        return Err(format!("hour {hour:02} is not in 00-23"));
    }
    if minute > 59 {
        return Err(format!("minute {minute:02} is not in 00-59"));
    }
    if second > 60 {
        return Err(format!("second {second:02} is not in 00-60"));
    }
    let mut at = 19;
    if b.get(at) == Some(&b'.') {
        at += 1;
        let start = at;
        while b.get(at).is_some_and(u8::is_ascii_digit) {
            at += 1;
        }
        if at == start {
            return Err(format!("the fraction has no digit at byte {start}"));
        }
    }
    match b.get(at) {
        Some(b'Z' | b'z') => at += 1,
        Some(b'+' | b'-') => {
            let oh = digits(at + 1, 2, "the offset hour")?;
            sep(at + 3, b":", "':'")?;
            let om = digits(at + 4, 2, "the offset minute")?;
            if oh > 23 || om > 59 {
                return Err(format!("offset {oh:02}:{om:02} is not in 00:00-23:59"));
            }
            at += 6;
        }
        _ => {
            return Err(format!(
                "expected 'Z' or an offset like +02:00 at byte {at}"
            ));
        }
    }
    if at != b.len() {
        return Err(format!("unexpected text after the offset at byte {at}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn format_unix_is_utc_and_checks() {
        assert_eq!(super::format_unix(0), "1970-01-01T00:00:00Z");
        assert_eq!(super::format_unix(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(super::format_unix(1_795_999_999), "2026-11-30T00:53:19Z");
        assert_eq!(super::format_unix(-1), "1969-12-31T23:59:59Z");
        for secs in [0, 68_169_600, 1_234_567_890, 4_102_444_800] {
            super::check(&super::format_unix(secs)).unwrap();
        }
    }

    use super::*;

    #[test]
    fn accepts_rfc3339_date_times() {
        for ok in [
            "2026-11-29T19:00:00Z",
            "2026-11-29t19:00:00z",
            "2024-02-29T23:59:60.123456789+05:30",
            "1970-01-01T00:00:00-00:00",
            "2000-02-29T00:00:00.5Z",
            "0000-12-31T23:59:59+23:59",
        ] {
            assert_eq!(check(ok), Ok(()), "{ok}");
        }
    }

    #[test]
    fn refuses_everything_else_saying_why() {
        for (bad, why) in [
            ("", "the year is not 4 digits at byte 0"),
            ("yesterday", "the year is not 4 digits at byte 0"),
            ("2026-13-01T00:00:00Z", "month 13 is not in 01-12"),
            ("2026-02-29T00:00:00Z", "day 29 is not in 01-28 for 2026-02"),
            ("1900-02-29T00:00:00Z", "day 29 is not in 01-28 for 1900-02"),
            ("2026-04-31T00:00:00Z", "day 31 is not in 01-30 for 2026-04"),
            ("2026-11-29 19:00:00Z", "expected 'T' at byte 10"),
            ("2026-11-29T24:00:00Z", "hour 24 is not in 00-23"),
            ("2026-11-29T19:60:00Z", "minute 60 is not in 00-59"),
            ("2026-11-29T19:00:61Z", "second 61 is not in 00-60"),
            (
                "2026-11-29T19:00:00",
                "expected 'Z' or an offset like +02:00 at byte 19",
            ),
            (
                "2026-11-29T19:00:00.Z",
                "the fraction has no digit at byte 20",
            ),
            (
                "2026-11-29T19:00:00+2:00",
                "the offset hour is not 2 digits at byte 20",
            ),
            (
                "2026-11-29T19:00:00+24:00",
                "offset 24:00 is not in 00:00-23:59",
            ),
            (
                "2026-11-29T19:00:00Zjunk",
                "unexpected text after the offset at byte 20",
            ),
            (
                "2026-1１-29T19:00:00Z",
                "the month is not 2 digits at byte 5",
            ),
            (
                "+2026-11-29T19:00:00Z",
                "the year is not 4 digits at byte 0",
            ),
        ] {
            assert_eq!(check(bad), Err(why.to_string()), "{bad}");
        }
    }
}
