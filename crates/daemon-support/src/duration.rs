//! Duration flags (`--drain-timeout`, `--request-idle-timeout`, `--reconcile-interval`): one
//! syntax for both daemons.

use std::time::Duration;

/// Parses a duration flag: a whole number and a unit, `ms`, `s`, `m` or `h` (`500ms`, `10s`,
/// `2m`, `1h`); `0` alone is zero, as Go's `time.ParseDuration` (and so koord's flags) reads it.
/// Any whole number of its unit up to `u64::MAX` seconds is accepted: the daemons wait with
/// tokio's timers, which treat a deadline beyond their range as "never".
///
/// Errors, each naming the value and the form expected: no unit or another unit (`10`, `1d`,
/// `1us`), not a whole number (`-1s`, `1.5s`, `+1s`, ` 1s`), more than `u64::MAX` of its unit,
/// or minutes and hours beyond `u64::MAX` seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    const FORM: &str = "expected a whole number and a unit (ms, s, m or h), e.g. 500ms, 10s, 2m, 1h";
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    if digits.is_empty() {
        return Err(format!("invalid duration {s:?}: {FORM}"));
    }
    let n: u64 =
        digits.parse().map_err(|_| format!("invalid duration {s:?}: too large (at most {} of a unit)", u64::MAX))?;
    let too_large = || format!("invalid duration {s:?}: too large (at most {} s)", u64::MAX);
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "s" => Ok(Duration::from_secs(n)),
        "m" => n.checked_mul(60).map(Duration::from_secs).ok_or_else(too_large),
        "h" => n.checked_mul(3600).map(Duration::from_secs).ok_or_else(too_large),
        "" => Err(format!("invalid duration {s:?}: no unit; {FORM}")),
        _ if unit.starts_with(['.', ',']) => {
            Err(format!("invalid duration {s:?}: not a whole number (1500ms, not 1.5s); {FORM}"))
        }
        _ => Err(format!("invalid duration {s:?}: unit {unit:?} is not ms, s, m or h; {FORM}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms_and_edges() {
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("0ms"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("1ms"), Ok(Duration::from_millis(1)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("007s"), Ok(Duration::from_secs(7)));
        assert_eq!(parse_duration(&format!("{}s", u64::MAX)), Ok(Duration::from_secs(u64::MAX)));
        assert_eq!(parse_duration(&format!("{}ms", u64::MAX)), Ok(Duration::from_millis(u64::MAX)));
        for (bad, why) in [
            ("", "expected"),
            ("10", "no unit"),
            ("s", "expected"),
            ("1d", "not ms, s, m or h"),
            ("1us", "not ms, s, m or h"),
            ("1S", "not ms, s, m or h"),
            ("-1s", "expected"),
            ("+1s", "expected"),
            (" 1s", "expected"),
            ("1.5s", "not a whole number"),
            ("1s ", "not ms, s, m or h"),
            ("1m30s", "not ms, s, m or h"),
            ("18446744073709551616s", "too large"),
            ("99999999999999999999ms", "too large"),
        ] {
            let e = parse_duration(bad).unwrap_err();
            assert!(e.contains(why) && e.contains(&format!("{bad:?}")), "{bad:?}: {e}");
        }
        assert!(
            parse_duration(&format!("{}m", u64::MAX / 59)).unwrap_err().contains("too large"),
            "minutes overflow checked"
        );
        assert!(
            parse_duration(&format!("{}h", u64::MAX / 3599)).unwrap_err().contains("too large"),
            "hours overflow checked"
        );
    }
}
