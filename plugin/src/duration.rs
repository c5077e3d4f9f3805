//! Durations as kubectl writes them: `30s`, `5m`, `1h30m`, `500ms`; a bare number is seconds.

use std::time::Duration;

/// Parses a duration flag; the error says what a valid value looks like.
pub fn parse(text: &str) -> Result<Duration, String> {
    let invalid = || {
        format!("invalid duration {text:?}: use a number with a unit, e.g. 30s, 5m, 1h30m or 500ms")
    };
    let text = text.trim();
    if text.is_empty() {
        return Err(invalid());
    }
    if let Ok(seconds) = text.parse::<u64>() {
        return Ok(Duration::from_secs(seconds));
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        if digits == 0 {
            return Err(invalid());
        }
        let (number, tail) = rest.split_at(digits);
        let number: u64 = number.parse().map_err(|_| invalid())?;
        let unit_len = tail.len()
            - tail
                .trim_start_matches(|c: char| c.is_ascii_alphabetic())
                .len();
        let (unit, tail) = tail.split_at(unit_len);
        let unit = match unit {
            "ms" => Duration::from_millis(1),
            "s" => Duration::from_secs(1),
            "m" => Duration::from_secs(60),
            "h" => Duration::from_secs(3600),
            _ => return Err(invalid()),
        };
        let part = u32::try_from(number)
            .ok()
            .and_then(|n| unit.checked_mul(n))
            .ok_or_else(invalid)?;
        total = total.checked_add(part).ok_or_else(invalid)?;
        rest = tail;
    }
    Ok(total)
}

/// A duration the way [`parse`] reads it back, e.g. `1m30s`.
pub fn format(duration: Duration) -> String {
    let total = duration.as_secs();
    if total == 0 {
        return format!("{}ms", duration.as_millis());
    }
    let (h, m, s) = (total / 3600, total / 60 % 60, total % 60);
    let mut out = String::new();
    for (value, unit) in [(h, "h"), (m, "m"), (s, "s")] {
        if value > 0 {
            out.push_str(&format!("{value}{unit}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_kubectl_durations() {
        let cases = [
            ("0", 0),
            ("30", 30_000),
            ("30s", 30_000),
            ("5m", 300_000),
            ("1h30m", 5_400_000),
            ("500ms", 500),
            ("1m30s", 90_000),
        ];
        for (text, millis) in cases {
            assert_eq!(parse(text), Ok(Duration::from_millis(millis)), "{text}");
        }
    }

    #[test]
    fn refuses_what_is_not_a_duration() {
        for text in ["", "5x", "m", "-1s", "1.5h", "5 m", "99999999999999999999h"] {
            assert!(parse(text).is_err(), "{text}");
        }
    }

    #[test]
    fn formats_round_trip() {
        for text in ["5m", "1h30m", "45s", "500ms"] {
            assert_eq!(parse(text).map(format), Ok(text.to_owned()));
        }
    }
}
