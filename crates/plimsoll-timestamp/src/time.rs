//! GeneralizedTime to Unix milliseconds and back to RFC 3339 text, without a date library.
//! A time that does not exist on the calendar (day 31 of a 30-day month, Feb 29 outside a
//! leap year, hour 24, minute or second 60) is refused, not rolled over into the next one.

use crate::der::malformed;
use crate::Error;

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's `days_from_civil`).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The civil date of a day count since 1970-01-01.
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// Whether `y` is a leap year of the proleptic Gregorian calendar.
fn is_leap(y: i64) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

/// The days of month `m` (1-12) of year `y`.
fn days_in_month(y: i64, m: i64) -> i64 {
    match m {
        4 | 6 | 9 | 11 => 30,
        2 if is_leap(y) => 29,
        2 => 28,
        _ => 31,
    }
}

/// Parses the contents of a DER GeneralizedTime (`YYYYMMDDHHMMSS[.f]Z`) into Unix ms.
/// Fractions finer than a millisecond are truncated.
pub(crate) fn generalized_to_unix_ms(v: &[u8]) -> Result<i64, Error> {
    let ctx = "TSTInfo genTime";
    let impossible = |reason: String| Error::ImpossibleTime {
        at: ctx,
        value: String::from_utf8_lossy(v).into_owned(),
        reason,
    };
    let bad = || {
        malformed(
            ctx,
            format!(
                "not a DER GeneralizedTime: {:?}",
                String::from_utf8_lossy(v)
            ),
        )
    };
    if v.len() < 15 || v.len() > 32 || v.last() != Some(&b'Z') {
        return Err(bad());
    }
    let digits = |r: std::ops::Range<usize>| -> Result<i64, Error> {
        let s = v.get(r).ok_or_else(bad)?;
        if !s.iter().all(u8::is_ascii_digit) {
            return Err(bad());
        }
        Ok(s.iter().fold(0i64, |a, &b| a * 10 + i64::from(b - b'0')))
    };
    let (y, mo, d) = (digits(0..4)?, digits(4..6)?, digits(6..8)?);
    let (h, mi, s) = (digits(8..10)?, digits(10..12)?, digits(12..14)?);
    if !(1..=12).contains(&mo) {
        return Err(impossible(format!("there is no month {mo}")));
    }
    let month_days = days_in_month(y, mo);
    if !(1..=month_days).contains(&d) {
        return Err(impossible(if mo == 2 && d == 29 {
            format!("{y} is not a leap year, so February has no day 29")
        } else {
            format!("month {mo} of {y} has no day {d}; it has {month_days} days")
        }));
    }
    if h > 23 || mi > 59 || s > 59 {
        // Leap seconds are refused, as OpenSSL refuses them.
        return Err(impossible(format!(
            "{h:02}:{mi:02}:{s:02} is not a time of day (hours 00-23, minutes and seconds 00-59)"
        )));
    }
    let mut ms = 0i64;
    let rest = &v[14..v.len() - 1];
    if !rest.is_empty() {
        let frac = rest.strip_prefix(b".").ok_or_else(bad)?;
        if frac.is_empty() || !frac.iter().all(u8::is_ascii_digit) {
            return Err(bad());
        }
        for (i, &c) in frac.iter().take(3).enumerate() {
            ms += i64::from(c - b'0') * [100, 10, 1][i];
        }
    }
    let days = days_from_civil(y, mo, d);
    Ok((days * 86_400 + h * 3600 + mi * 60 + s) * 1000 + ms)
}

/// RFC 3339 UTC text of Unix ms: `2025-05-09T11:58:55Z`, or with `.123` when ms are non-zero.
pub(crate) fn rfc3339(unix_ms: i64) -> String {
    let secs = unix_ms.div_euclid(1000);
    let ms = unix_ms.rem_euclid(1000);
    let (y, m, d) = civil_from_days(secs.div_euclid(86_400));
    let sod = secs.rem_euclid(86_400);
    let (h, mi, s) = (sod / 3600, sod % 3600 / 60, sod % 60);
    if ms == 0 {
        format!("{y:04}-{m:02}-{d:02}T{h:02}:{mi:02}:{s:02}Z")
    } else {
        format!("{y:04}-{m:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{ms:03}Z")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generalized_time_round_trips() {
        let ms = generalized_to_unix_ms(b"20250509115855Z").unwrap();
        assert_eq!(ms, 1_746_791_935_000);
        assert_eq!(rfc3339(ms), "2025-05-09T11:58:55Z");
        let ms = generalized_to_unix_ms(b"20000229235959.5Z").unwrap();
        assert_eq!(rfc3339(ms), "2000-02-29T23:59:59.500Z");
        assert_eq!(generalized_to_unix_ms(b"19700101000000Z").unwrap(), 0);
        for bad in [
            &b"2025050911585Z"[..],
            b"20251309115855Z",
            b"20250509115855",
            b"2025050911585aZ",
            b"20250509115855.Z",
        ] {
            assert!(generalized_to_unix_ms(bad).is_err());
        }
    }

    #[test]
    fn impossible_dates_and_times_are_refused() {
        for (bad, says) in [
            (&b"20250431120000Z"[..], "month 4 of 2025 has no day 31"),
            (b"20250631120000Z", "month 6 of 2025 has no day 31"),
            (b"20250931120000Z", "has no day 31"),
            (b"20251131120000Z", "has no day 31"),
            (b"20250229120000Z", "2025 is not a leap year"),
            (b"21000229120000Z", "2100 is not a leap year"),
            (b"20250230120000Z", "month 2 of 2025 has no day 30"),
            (b"20250132120000Z", "month 1 of 2025 has no day 32"),
            (b"20250100120000Z", "has no day 0"),
            (b"20250001120000Z", "there is no month 0"),
            (b"20250509240000Z", "is not a time of day"),
            (b"20250509236000Z", "is not a time of day"),
            (b"20250509235960Z", "is not a time of day"),
            (b"20250509235960.5Z", "is not a time of day"),
        ] {
            let err = generalized_to_unix_ms(bad).unwrap_err();
            assert!(
                matches!(err, Error::ImpossibleTime { .. }),
                "{}: {err}",
                String::from_utf8_lossy(bad)
            );
            assert!(err.to_string().contains(says), "{err}");
        }
        // The days that do exist.
        for good in [
            &b"20240229120000Z"[..],
            b"20000229120000Z",
            b"20250430235959Z",
            b"20251231235959.999Z",
            b"20250131000000Z",
        ] {
            generalized_to_unix_ms(good).unwrap();
        }
    }
}
