//! The one duration grammar of every flag and configuration field: Go's `time.ParseDuration`, as
//! Kubernetes users know it, without the units below a millisecond.
//!
//! ```text
//! "200ms" "30s" "1.5s" "5m" "1h30m" "0" ─► parse() ─► Duration      "30" "1d" "-1s" "" ─► Err(why)
//! ```

use std::time::Duration;

/// Parses one or more `<number><unit>` terms (the number may have a fraction; units `ms`, `s`, `m`,
/// `h`), summed, or a bare `0`. A bare number other than 0 is refused: it would be ambiguous.
pub fn parse(text: &str) -> Result<Duration, String> {
    let bad = || format!("{text:?} is not a duration like 200ms, 1.5s, 5m or 1h30m");
    let trimmed = text.trim();
    if trimmed == "0" {
        return Ok(Duration::ZERO);
    }
    if trimmed.is_empty() {
        return Err(bad());
    }
    let mut total = 0.0_f64;
    let mut rest = trimmed;
    while !rest.is_empty() {
        let number_end = rest
            .find(|c: char| !c.is_ascii_digit() && c != '.')
            .ok_or_else(bad)?;
        if number_end == 0 {
            return Err(bad());
        }
        let number: f64 = rest[..number_end].parse().map_err(|_| bad())?;
        rest = &rest[number_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds_per_unit = match &rest[..unit_end] {
            "ms" => 0.001,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        total += number * seconds_per_unit;
        rest = &rest[unit_end..];
    }
    Duration::try_from_secs_f64(total).map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations_parse_and_everything_else_says_why_not() {
        let good = [
            ("200ms", Duration::from_millis(200)),
            ("30s", Duration::from_secs(30)),
            ("1.5s", Duration::from_millis(1500)),
            ("5m", Duration::from_secs(300)),
            ("1h", Duration::from_secs(3600)),
            ("1h30m", Duration::from_secs(5400)),
            ("1m0.5s", Duration::from_millis(60_500)),
            ("0", Duration::ZERO),
            (" 2m ", Duration::from_secs(120)),
        ];
        for (text, want) in good {
            assert_eq!(parse(text), Ok(want), "{text}");
        }
        for bad in ["", "30", "1.5", "s", "1d", "-1s", "1..5s", "ms5", "1h 30m"] {
            let error = parse(bad).unwrap_err();
            assert!(error.contains("is not a duration like"), "{bad}: {error}");
        }
    }
}
