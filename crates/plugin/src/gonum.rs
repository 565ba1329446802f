//! Go's `strconv` as Argo CD's readers use it: `ParseInt`/`ParseUint` with base prefixes,
//! `ParseFloat`'s range errors, `FormatFloat(f, 'g', -1, bits)`, `Quote`; and go-yaml's
//! float pattern and timestamp layouts.

/// `strconv.ParseInt(s, base, 64)` (`base` 0: the prefix decides), `None` on any error.
pub fn parse_int(s: &str, base: u32) -> Option<i64> {
    let (neg, body) = match s.as_bytes().first()? {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    let mag = parse_uint(body, base)?;
    if neg {
        if mag <= i64::MAX as u64 + 1 {
            Some((mag as i128).wrapping_neg() as i64)
        } else {
            None
        }
    } else {
        i64::try_from(mag).ok()
    }
}

/// `strconv.ParseUint(s, base, 64)`, `None` on any error.
pub fn parse_uint(s: &str, base: u32) -> Option<u64> {
    if s.is_empty() {
        return None;
    }
    let (radix, digits, prefixed) = if base == 0 {
        let lower = s.to_ascii_lowercase();
        if lower.starts_with("0x") {
            (16, &s[2..], true)
        } else if lower.starts_with("0o") {
            (8, &s[2..], true)
        } else if lower.starts_with("0b") {
            (2, &s[2..], true)
        } else if s.len() > 1 && s.starts_with('0') {
            (8, &s[1..], true)
        } else {
            (10, s, false)
        }
    } else {
        (base, s, false)
    };
    let digits: String = if base == 0 && digits.contains('_') {
        if !underscore_ok(s) {
            return None;
        }
        digits.replace('_', "")
    } else {
        digits.to_owned()
    };
    let _ = prefixed;
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    u64::from_str_radix(&digits, radix).ok()
}

/// Go's `underscoreOK`: underscores only between digits, or between a base prefix and a digit.
fn underscore_ok(s: &str) -> bool {
    let b = s.as_bytes();
    let mut saw = b'^';
    let mut i = 0;
    if !b.is_empty() && (b[0] == b'-' || b[0] == b'+') {
        i = 1;
    }
    let mut hex = false;
    if b.len() - i >= 2 && b[i] == b'0' && matches!(b[i + 1] | 0x20, b'b' | b'o' | b'x') {
        hex = b[i + 1] | 0x20 == b'x';
        i += 2;
        saw = b'0';
    }
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_digit() || (hex && c.is_ascii_hexdigit()) {
            saw = b'0';
        } else if c == b'_' {
            if saw != b'0' {
                return false;
            }
            saw = b'_';
        } else {
            if saw == b'_' {
                return false;
            }
            saw = b'!';
        }
        i += 1;
    }
    saw != b'_'
}

/// `strconv.ParseFloat(s, 64)` for the decimal forms go-yaml hands it, `None` on a syntax or
/// range error (a value past ±MaxFloat64 is a range error in Go; underflow to zero is not).
pub fn parse_float(s: &str) -> Option<f64> {
    let owned;
    let s = if s.contains('_') {
        if !underscore_ok(s) {
            return None;
        }
        owned = s.replace('_', "");
        &owned
    } else {
        s
    };
    let bytes = s.trim_start_matches(['+', '-']).as_bytes();
    // Rust accepts `inf`, `nan` and `infinity`; go-yaml never passes them here, but be exact.
    if bytes.first().is_some_and(|c| c.is_ascii_alphabetic()) {
        let l = s.trim_start_matches(['+', '-']).to_ascii_lowercase();
        return match l.as_str() {
            "inf" | "infinity" => Some(if s.starts_with('-') {
                f64::NEG_INFINITY
            } else {
                f64::INFINITY
            }),
            "nan" => Some(f64::NAN),
            _ => None,
        };
    }
    let f: f64 = s.parse().ok()?;
    if f.is_infinite() {
        return None;
    }
    Some(f)
}

/// go-yaml's `yamlStyleFloat`: `^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$`.
pub fn is_yaml_style_float(s: &str) -> bool {
    let b = s.as_bytes();
    let mut i = 0;
    if i < b.len() && (b[i] == b'-' || b[i] == b'+') {
        i += 1;
    }
    let digits = |i: &mut usize| {
        let s = *i;
        while *i < b.len() && b[*i].is_ascii_digit() {
            *i += 1;
        }
        *i - s
    };
    if i < b.len() && b[i] == b'.' {
        i += 1;
        if digits(&mut i) == 0 {
            return false;
        }
    } else {
        if digits(&mut i) == 0 {
            return false;
        }
        if i < b.len() && b[i] == b'.' {
            i += 1;
            digits(&mut i);
        }
    }
    if i < b.len() && (b[i] == b'e' || b[i] == b'E') {
        i += 1;
        if i < b.len() && (b[i] == b'-' || b[i] == b'+') {
            i += 1;
        }
        if digits(&mut i) == 0 {
            return false;
        }
    }
    i == b.len()
}

/// go-yaml's `parseTimestamp`: a year of four digits and `-`, then one of its layouts
/// (`2006-1-2T15:4:5.999999999Z07:00`, the same with `t`, `2006-1-2 15:4:5.999999999`,
/// `2006-1-2`), as Go's `time.Parse` accepts them.
pub fn is_timestamp(s: &str) -> bool {
    let b = s.as_bytes();
    let year = b.iter().take_while(|c| c.is_ascii_digit()).count();
    if year != 4 || b.len() == 4 || b[4] != b'-' {
        return false;
    }
    let mut p = Cursor { b, i: 5 };
    let Some(month) = p.num(1, 2) else {
        return false;
    };
    if !p.eat(b'-') {
        return false;
    }
    let Some(day) = p.num(1, 2) else {
        return false;
    };
    let y: u32 = s[..4].parse().unwrap_or(0);
    let leap = (y.is_multiple_of(4) && !y.is_multiple_of(100)) || y.is_multiple_of(400);
    let days = [
        31,
        if leap { 29 } else { 28 },
        31,
        30,
        31,
        30,
        31,
        31,
        30,
        31,
        30,
        31,
    ];
    if !(1..=12).contains(&month) || day < 1 || day > days[month as usize - 1] {
        return false;
    }
    if p.i == b.len() {
        return true;
    }
    let sep = b[p.i];
    let zoned = match sep {
        b'T' | b't' => true,
        b' ' => false,
        _ => return false,
    };
    p.i += 1;
    let (Some(h), true, Some(m), true, Some(sec)) = (
        p.num(1, 2),
        p.eat(b':'),
        p.num(1, 2),
        p.eat(b':'),
        p.num(1, 2),
    ) else {
        return false;
    };
    if h > 23 || m > 59 || sec > 59 {
        return false;
    }
    if p.i < b.len() && b[p.i] == b'.' {
        let start = p.i + 1;
        let n = b[start..].iter().take_while(|c| c.is_ascii_digit()).count();
        if n == 0 {
            return false;
        }
        p.i = start + n;
    }
    if !zoned {
        return p.i == b.len();
    }
    if p.eat(b'Z') {
        return p.i == b.len();
    }
    if p.i < b.len() && (b[p.i] == b'+' || b[p.i] == b'-') {
        p.i += 1;
        let (Some(zh), true, Some(zm)) = (p.num(2, 2), p.eat(b':'), p.num(2, 2)) else {
            return false;
        };
        return zh <= 24 && zm <= 59 && p.i == b.len();
    }
    false
}

struct Cursor<'a> {
    b: &'a [u8],
    i: usize,
}

impl Cursor<'_> {
    fn num(&mut self, min: usize, max: usize) -> Option<u32> {
        let n = self.b[self.i.min(self.b.len())..]
            .iter()
            .take(max)
            .take_while(|c| c.is_ascii_digit())
            .count();
        if n < min {
            return None;
        }
        let v = std::str::from_utf8(&self.b[self.i..self.i + n])
            .ok()?
            .parse()
            .ok()?;
        self.i += n;
        Some(v)
    }
    fn eat(&mut self, c: u8) -> bool {
        if self.b.get(self.i) == Some(&c) {
            self.i += 1;
            true
        } else {
            false
        }
    }
}

/// `strconv.FormatFloat(f, 'g', -1, bits)`: shortest digits (of the `float32` nearest `f`
/// when `bits` is 32), exponent form below 1e-4 and from 1e6 on (`1e+06`).
pub fn format_g(f: f64, bits: u32) -> String {
    // `float32(f)`: past its range it is infinite.
    let f = if bits == 32 { f64::from(f as f32) } else { f };
    if f.is_nan() {
        return "NaN".to_owned();
    }
    if f.is_infinite() {
        return if f > 0.0 { "+Inf" } else { "-Inf" }.to_owned();
    }
    let sign = if f.is_sign_negative() { "-" } else { "" };
    if f == 0.0 {
        return format!("{sign}0");
    }
    let (digits, exp) = shortest(f, bits);
    if !(-4..6).contains(&exp) {
        let (first, rest) = digits.split_at(1);
        let dot = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        let esign = if exp < 0 { '-' } else { '+' };
        return format!("{sign}{first}{dot}e{esign}{:02}", exp.abs());
    }
    if exp < 0 {
        let zeros = "0".repeat((-exp - 1) as usize);
        return format!("{sign}0.{zeros}{digits}");
    }
    let int_len = exp as usize + 1;
    if digits.len() <= int_len {
        format!("{sign}{digits}{}", "0".repeat(int_len - digits.len()))
    } else {
        format!("{sign}{}.{}", &digits[..int_len], &digits[int_len..])
    }
}

/// The shortest decimal digits of finite, non-zero `|f|` (as a float32 when `bits` is 32) that
/// read back as it, and the decimal exponent of the first: Go's `strconv` shortest formatting,
/// shared by every Go float format here.
pub fn shortest(f: f64, bits: u32) -> (String, i32) {
    let sci = if bits == 32 {
        format!("{:e}", (f as f32).abs())
    } else {
        format!("{:e}", f.abs())
    };
    let (mant, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mant.chars().filter(char::is_ascii_digit).collect();
    (ties_to_even(f, bits, digits, exp), exp)
}

/// The shortest digits of `f` (at decimal exponent `exp`) as Go's `strconv` chooses them: where
/// the value lies exactly halfway between two shortest candidates that both read back as `f`,
/// Go rounds to the even digit (`decimal.Round`'s "exactly halfway - round to even"); Rust's
/// formatter may give the other (2002000.25 as a float32: Go 2.0020002e+06, Rust 2.0020003e6).
fn ties_to_even(f: f64, bits: u32, digits: String, exp: i32) -> String {
    // The exact decimal value of `f` (every float is a finite decimal; 200 places hold any).
    let exact = format!("{:.200e}", f.abs());
    let Some((mant, e)) = exact.split_once('e') else {
        return digits;
    };
    if e.parse::<i32>() != Ok(exp) {
        return digits;
    }
    let all: String = mant.chars().filter(char::is_ascii_digit).collect();
    let exact_digits = all.trim_end_matches('0');
    let n = digits.len();
    // A tie: exactly one digit past the candidates' length, and it is a 5.
    if exact_digits.len() != n + 1 || !exact_digits.ends_with('5') {
        return digits;
    }
    let down = exact_digits[..n].to_owned();
    let Some(up) = increment(&down) else {
        return digits;
    };
    let even = if (down.as_bytes()[n - 1] - b'0').is_multiple_of(2) {
        down
    } else {
        up
    };
    if even == digits {
        return digits;
    }
    let reads_back = |d: &str| -> bool {
        let text = if d.len() == 1 {
            format!("{d}e{exp}")
        } else {
            format!("{}.{}e{exp}", &d[..1], &d[1..])
        };
        if bits == 32 {
            text.parse::<f32>().is_ok_and(|v| f64::from(v) == f.abs())
        } else {
            text.parse::<f64>().is_ok_and(|v| v == f.abs())
        }
    };
    if reads_back(&even) { even } else { digits }
}

/// `d` (decimal digits) plus one in its last place, or `None` when that carries past its
/// first digit.
fn increment(d: &str) -> Option<String> {
    let mut b = d.as_bytes().to_vec();
    for i in (0..b.len()).rev() {
        if b[i] == b'9' {
            b[i] = b'0';
        } else {
            b[i] += 1;
            return String::from_utf8(b).ok();
        }
    }
    None
}

/// Go's `strconv.Quote` of a Go string (any bytes).
pub fn quote(s: &[u8]) -> String {
    let mut out = String::from("\"");
    let mut i = 0;
    while i < s.len() {
        let (c, w) = decode_rune(&s[i..]);
        match c {
            None => {
                out.push_str(&format!("\\x{:02x}", s[i]));
            }
            Some('"') => out.push_str("\\\""),
            Some('\\') => out.push_str("\\\\"),
            Some(c) if is_print(c) => out.push(c),
            Some('\x07') => out.push_str("\\a"),
            Some('\x08') => out.push_str("\\b"),
            Some('\x0c') => out.push_str("\\f"),
            Some('\n') => out.push_str("\\n"),
            Some('\r') => out.push_str("\\r"),
            Some('\t') => out.push_str("\\t"),
            Some('\x0b') => out.push_str("\\v"),
            Some(c) if (c as u32) < 0x20 || c == '\x7f' => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            Some(c) if (c as u32) < 0x10000 => out.push_str(&format!("\\u{:04x}", c as u32)),
            Some(c) => out.push_str(&format!("\\U{:08x}", c as u32)),
        }
        i += w;
    }
    out.push('"');
    out
}

/// Go's `utf8.DecodeRune`: the rune and its width, `None` (width 1) for an invalid byte.
pub fn decode_rune(b: &[u8]) -> (Option<char>, usize) {
    let w = match b.first() {
        None => return (None, 0),
        Some(c) if *c < 0x80 => return (Some(*c as char), 1),
        Some(c) if *c & 0xE0 == 0xC0 => 2,
        Some(c) if *c & 0xF0 == 0xE0 => 3,
        Some(c) if *c & 0xF8 == 0xF0 => 4,
        _ => return (None, 1),
    };
    match b.get(..w).and_then(|s| std::str::from_utf8(s).ok()) {
        Some(s) => (s.chars().next(), w),
        None => (None, 1),
    }
}

/// `strconv.IsPrint`, from Go's own table (`crate::isprint`, generated from it).
pub fn is_print(c: char) -> bool {
    let u = c as u32;
    crate::isprint::PRINTABLE
        .binary_search_by(|&(lo, hi)| {
            if hi < u {
                std::cmp::Ordering::Less
            } else if lo > u {
                std::cmp::Ordering::Greater
            } else {
                std::cmp::Ordering::Equal
            }
        })
        .is_ok()
}

/// A Go string's bytes as UTF-8 the way Go's `utf8.DecodeRune` steps over them: each byte of
/// an invalid sequence as U+FFFD (what gRPC makes of a status message, or the repo-server's JSON
/// reading of a string; Rust's lossy conversion replaces a whole invalid sequence once).
pub fn go_lossy(b: &[u8]) -> String {
    match std::str::from_utf8(b) {
        Ok(s) => s.to_owned(),
        Err(_) => {
            let mut s = String::with_capacity(b.len() + 8);
            let mut i = 0;
            while i < b.len() {
                let (c, w) = decode_rune(&b[i..]);
                s.push(c.unwrap_or('\u{fffd}'));
                i += w.max(1);
            }
            s
        }
    }
}

#[cfg(test)]
mod tests {
    use super::format_g;

    /// A float32 exactly halfway between two shortest candidates is written with the even
    /// last digit, as Go's strconv writes it, down or up (found by the differential fuzz
    /// target: a float map key); values without a tie are unchanged.
    #[test]
    fn a_shortest_tie_rounds_to_the_even_digit_as_go_does() {
        assert_eq!(format_g(2002000.3002, 32), "2.0020002e+06"); // 2002000.25
        assert_eq!(format_g(2002000.75, 32), "2.0020008e+06");
        assert_eq!(format_g(-2002000.25, 32), "-2.0020002e+06");
        assert_eq!(format_g(0.1, 64), "0.1");
        assert_eq!(format_g(0.1, 32), "0.1");
        assert_eq!(format_g(1e21, 64), "1e+21");
        assert_eq!(format_g(123456.5, 64), "123456.5");
        assert_eq!(format_g(2.5, 32), "2.5");
    }
}
