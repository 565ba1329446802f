//! Kubernetes-style quantities: `100Mi`, `1G`, `512`, `1.5Gi`.

/// A quantity that does not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid quantity '{input}': {why}")]
pub struct QuantityError {
    input: String,
    why: &'static str,
}

/// Parse a non-negative quantity into a whole number (bytes, counts). Binary suffixes
/// `Ki Mi Gi Ti Pi Ei`, decimal `k K M G T P E`; a fraction is allowed when the result is whole.
pub fn parse_quantity(input: &str) -> Result<u64, QuantityError> {
    let err = |why| QuantityError {
        input: input.to_owned(),
        why,
    };
    let s = input.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, suffix) = s.split_at(split);
    let mult: u128 = match suffix {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "Pi" => 1 << 50,
        "Ei" => 1 << 60,
        "k" | "K" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "P" => 1_000_000_000_000_000,
        "E" => 1_000_000_000_000_000_000,
        _ => return Err(err("unknown suffix")),
    };
    let (int, frac) = match num.split_once('.') {
        Some((i, f)) => (i, f),
        None => (num, ""),
    };
    if int.is_empty()
        || !int.bytes().all(|b| b.is_ascii_digit())
        || !frac.bytes().all(|b| b.is_ascii_digit())
    {
        return Err(err("not a number"));
    }
    if num.ends_with('.') || frac.len() > 9 {
        return Err(err("not a number"));
    }
    let int: u128 = int.parse().map_err(|_| err("too large"))?;
    let scale = 10u128.pow(frac.len() as u32);
    let frac_v: u128 = if frac.is_empty() {
        0
    } else {
        frac.parse().map_err(|_| err("not a number"))?
    };
    let total = (int * scale + frac_v)
        .checked_mul(mult)
        .ok_or_else(|| err("too large"))?;
    if total % scale != 0 {
        return Err(err("not a whole number"));
    }
    u64::try_from(total / scale).map_err(|_| err("too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities() {
        assert_eq!(parse_quantity("512"), Ok(512));
        assert_eq!(parse_quantity("100Mi"), Ok(100 << 20));
        assert_eq!(parse_quantity("1Gi"), Ok(1 << 30));
        assert_eq!(parse_quantity("1.5Gi"), Ok(3 << 29));
        assert_eq!(parse_quantity("2k"), Ok(2000));
        assert_eq!(parse_quantity("64M"), Ok(64_000_000));
        for bad in [
            "",
            "Mi",
            "-1",
            "1.5",
            "1x",
            "1..2Mi",
            "99999999999999999999999Ei",
            "1.Mi",
        ] {
            assert!(parse_quantity(bad).is_err(), "{bad}");
        }
    }
}
