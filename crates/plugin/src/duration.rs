//! Go `time.ParseDuration` (what Argo CD uses for `ARGOCD_EXEC_TIMEOUT`): a sequence of decimal
//! numbers with units `ns`, `us`/`µs`, `ms`, `s`, `m`, `h`, e.g. `90s`, `1m30s`, `1.5h`; `0`
//! alone is zero. Negative durations are refused here (a timeout cannot be negative).

use std::time::Duration;

/// Why a duration string was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("time: invalid duration {0:?}")]
pub struct DurationError(pub String);

/// Parse a Go duration string.
pub fn parse_go_duration(s: &str) -> Result<Duration, DurationError> {
    let bad = || DurationError(s.to_owned());
    let mut rest = s.strip_prefix('+').unwrap_or(s);
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() || rest.starts_with('-') {
        return Err(bad());
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let (num, tail) = rest.split_at(num_len);
        if num.is_empty() || num == "." || num.matches('.').count() > 1 {
            return Err(bad());
        }
        let value: f64 = num.parse().map_err(|_| bad())?;
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, next) = tail.split_at(unit_len);
        let scale = match unit {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        total += value * scale;
        rest = next;
    }
    if !total.is_finite() || total > 1e10 {
        return Err(bad());
    }
    Ok(Duration::from_secs_f64(total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        let d = |s| parse_go_duration(s).map(|d| d.as_millis());
        assert_eq!(d("90s"), Ok(90_000));
        assert_eq!(d("1m30s"), Ok(90_000));
        assert_eq!(d("1.5h"), Ok(5_400_000));
        assert_eq!(d("250ms"), Ok(250));
        assert_eq!(d("0"), Ok(0));
        assert_eq!(d("2h45m0.5s"), Ok(9_900_500));
        for bad in ["", "90", "-1s", "1x", "s", "1..2s", "1e3s", ".s"] {
            assert!(parse_go_duration(bad).is_err(), "{bad}");
        }
    }
}
