//! PAX extended header records, parsed by their declared length with a key allowlist.
//!
//! The tar crate splits records on `\n` and skips malformed ones; Go parses by length. We parse
//! by length and refuse anything malformed, duplicated or unknown, so no two parsers can disagree
//! about what an accepted archive contains.

use crate::error::Reason;

/// The records that matter to extraction (others on the allowlist are checked and ignored).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pax {
    /// `path`: overrides the header name.
    pub path: Option<Vec<u8>>,
    /// `linkpath`: overrides the header link name.
    pub linkpath: Option<Vec<u8>>,
    /// `size`: must equal the header size.
    pub size: Option<u64>,
}

/// Keys Go's writer can emit for regular files, directories and symlinks.
const ALLOWED: &[&[u8]] = &[
    b"path",
    b"linkpath",
    b"size",
    b"uid",
    b"gid",
    b"uname",
    b"gname",
    b"mtime",
    b"atime",
    b"ctime",
];

/// Parse the body of a `x` header.
pub fn parse(mut data: &[u8]) -> Result<Pax, Reason> {
    let mut pax = Pax::default();
    let mut seen: Vec<&[u8]> = Vec::new();
    if data.is_empty() {
        return Err(Reason::PaxMalformed("empty extended header"));
    }
    while !data.is_empty() {
        let sp = data
            .iter()
            .take(20)
            .position(|&b| b == b' ')
            .ok_or(Reason::PaxMalformed("no length field"))?;
        let len_digits = &data[..sp];
        if len_digits.is_empty()
            || len_digits[0] == b'0'
            || !len_digits.iter().all(u8::is_ascii_digit)
        {
            return Err(Reason::PaxMalformed("bad length field"));
        }
        let len: usize = std::str::from_utf8(len_digits)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or(Reason::PaxMalformed("bad length field"))?;
        if len <= sp + 1 || len > data.len() {
            return Err(Reason::PaxMalformed("length out of range"));
        }
        let record = &data[sp + 1..len];
        data = &data[len..];
        let Some((&b'\n', body)) = record.split_last() else {
            return Err(Reason::PaxMalformed("record not terminated by newline"));
        };
        let eq = body
            .iter()
            .position(|&b| b == b'=')
            .ok_or(Reason::PaxMalformed("record without '='"))?;
        let (key, value) = (&body[..eq], &body[eq + 1..]);
        if key.is_empty() {
            return Err(Reason::PaxMalformed("empty key"));
        }
        if !ALLOWED.contains(&key) {
            return Err(Reason::PaxKeyNotAllowed(crate::error::escape(key)));
        }
        if seen.contains(&key) {
            return Err(Reason::PaxDuplicateKey(crate::error::escape(key)));
        }
        seen.push(key);
        if value.is_empty() {
            return Err(Reason::PaxMalformed("empty value"));
        }
        if value.contains(&0) {
            return Err(Reason::PaxMalformed("NUL in value"));
        }
        match key {
            b"path" => pax.path = Some(value.to_vec()),
            b"linkpath" => pax.linkpath = Some(value.to_vec()),
            b"size" => pax.size = Some(decimal(value)?),
            b"uid" | b"gid" => {
                decimal(value)?;
            }
            b"mtime" | b"atime" | b"ctime" => time(value)?,
            _ => {} // uname, gname: free text, ignored
        }
    }
    Ok(pax)
}

fn decimal(v: &[u8]) -> Result<u64, Reason> {
    if !v.iter().all(u8::is_ascii_digit) || v.len() > 19 {
        return Err(Reason::PaxMalformed("non-decimal number"));
    }
    std::str::from_utf8(v)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or(Reason::PaxMalformed("non-decimal number"))
}

fn time(v: &[u8]) -> Result<(), Reason> {
    let v = v.strip_prefix(b"-").unwrap_or(v);
    let (secs, frac) = match v.iter().position(|&b| b == b'.') {
        Some(dot) => (&v[..dot], Some(&v[dot + 1..])),
        None => (v, None),
    };
    let ok = !secs.is_empty()
        && secs.len() <= 19
        && secs.iter().all(u8::is_ascii_digit)
        && frac.is_none_or(|f| !f.is_empty() && f.iter().all(u8::is_ascii_digit));
    if ok {
        Ok(())
    } else {
        Err(Reason::PaxMalformed("bad time value"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(k: &str, v: &str) -> Vec<u8> {
        let body = format!(" {k}={v}\n");
        let mut len = body.len() + 1;
        loop {
            let s = format!("{len}{body}");
            if s.len() == len {
                return s.into_bytes();
            }
            len = s.len();
        }
    }

    #[test]
    fn good_records() {
        let mut d = rec("path", "a/b/ü");
        d.extend(rec("mtime", "1700000000.5"));
        d.extend(rec("size", "12"));
        let p = parse(&d).unwrap();
        assert_eq!(p.path.as_deref(), Some("a/b/ü".as_bytes()));
        assert_eq!(p.size, Some(12));
    }

    #[test]
    fn bad_records() {
        assert!(parse(b"").is_err());
        assert!(parse(b"13 path=abc\n").is_err()); // length lies (12 actual)
        assert!(parse(b"013 path=abc\n").is_err()); // leading zero
        assert!(parse(&[rec("path", "a"), rec("path", "b")].concat()).is_err());
        assert!(parse(&rec("SCHILY.xattr.user.x", "1")).is_err());
        assert!(parse(&rec("size", "-1")).is_err());
        assert!(parse(&rec("mtime", "1e9")).is_err());
        assert!(parse(b"11 path=ab\r").is_err());
    }
}
