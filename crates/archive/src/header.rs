//! Strict reading of one raw 512-byte tar header.
//!
//! We re-read every field ourselves instead of trusting the tar crate's lenient accessors, so
//! that what we extract is exactly what Go's writer meant: base-256 numbers, garbage after NUL
//! terminators, odd magic/version pairs and prefix bytes on non-ustar headers are all refused.

use crate::error::Reason;

/// Size of a tar block.
pub const BLOCK: usize = 512;

/// The header layouts we accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// POSIX ustar (`ustar\0` `00`), what Go writes.
    Ustar,
    /// GNU (`ustar ` ` \0`), what GNU tar writes by default.
    Gnu,
    /// Pre-POSIX v7 (no magic).
    V7,
}

/// The fields of a header the extractor uses, already checked for strictness.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// Typeflag byte.
    pub typeflag: u8,
    /// Name, with the ustar prefix joined when present (raw bytes, not normalised).
    pub name: Vec<u8>,
    /// Link target (raw bytes).
    pub linkname: Vec<u8>,
    /// Mode bits as written.
    pub mode: u32,
    /// Data size as written.
    pub size: u64,
    /// Layout.
    pub format: Format,
}

/// Parse one header block. The tar crate has already checked the (unsigned) checksum.
pub fn parse(block: &[u8; BLOCK]) -> Result<Header, Reason> {
    let format = match &block[257..265] {
        b"ustar\x0000" => Format::Ustar,
        b"ustar  \x00" => Format::Gnu,
        // A v7 header has nothing past the link name; anything there is an ambiguous layout.
        _ if block[257..].iter().all(|&b| b == 0) => Format::V7,
        _ => return Err(Reason::BadMagic),
    };
    let mode = number(&block[100..108], "mode")?;
    number(&block[108..116], "uid")?;
    number(&block[116..124], "gid")?;
    let size = number(&block[124..136], "size")?;
    number(&block[136..148], "mtime")?;
    number(&block[148..156], "chksum")?;
    if format != Format::V7 {
        number(&block[329..337], "devmajor")?;
        number(&block[337..345], "devminor")?;
        cstr(&block[265..297], "uname")?;
        cstr(&block[297..329], "gname")?;
    }
    let mut name = cstr(&block[0..100], "name")?.to_vec();
    if format == Format::Ustar {
        let prefix = cstr(&block[345..500], "prefix")?;
        if !prefix.is_empty() {
            let mut joined = Vec::with_capacity(prefix.len() + 1 + name.len());
            joined.extend_from_slice(prefix);
            joined.push(b'/');
            joined.extend_from_slice(&name);
            name = joined;
        }
    }
    let linkname = cstr(&block[157..257], "linkname")?.to_vec();
    let mode = u32::try_from(mode).map_err(|_| Reason::BadNumber("mode"))?;
    Ok(Header {
        typeflag: block[156],
        name,
        linkname,
        mode,
        size,
        format,
    })
}

/// The typeflag byte and declared size, for deciding whether to read a PAX body before
/// [`parse`] runs in the validator.
pub fn typeflag_and_size(block: &[u8; BLOCK]) -> Result<(u8, u64), Reason> {
    Ok((block[156], number(&block[124..136], "size")?))
}

/// A NUL-terminated string field; bytes after the terminator must be NUL too.
fn cstr<'a>(field: &'a [u8], what: &'static str) -> Result<&'a [u8], Reason> {
    match field.iter().position(|&b| b == 0) {
        None => Ok(field),
        Some(end) => {
            if field[end..].iter().any(|&b| b != 0) {
                return Err(Reason::GarbageAfterNul(what));
            }
            Ok(&field[..end])
        }
    }
}

/// A strict octal field: optional leading spaces, octal digits, then only NUL/space.
/// An all-NUL/space field reads as 0 (GNU tar leaves some fields empty).
pub fn number(field: &[u8], what: &'static str) -> Result<u64, Reason> {
    if field.first().is_some_and(|b| b & 0x80 != 0) {
        return Err(Reason::Base256(what));
    }
    let mut i = 0;
    while i < field.len() && field[i] == b' ' {
        i += 1;
    }
    let mut value: u64 = 0;
    while i < field.len() && (b'0'..=b'7').contains(&field[i]) {
        value = value
            .checked_mul(8)
            .and_then(|v| v.checked_add(u64::from(field[i] - b'0')))
            .ok_or(Reason::BadNumber(what))?;
        i += 1;
    }
    // Only NUL/space may follow the digits (a full-width field has no terminator, as Go allows).
    if field[i..].iter().any(|&b| b != 0 && b != b' ') {
        return Err(Reason::BadNumber(what));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers() {
        assert_eq!(number(b"0000644\0", "mode").unwrap(), 0o644);
        assert_eq!(number(b"    644 ", "mode").unwrap(), 0o644);
        assert_eq!(number(b"\0\0\0\0\0\0\0\0", "mode").unwrap(), 0);
        assert_eq!(number(b"77777777777\0", "size").unwrap(), 0o77777777777);
        assert_eq!(number(b"777777777777", "size").unwrap(), 0o777777777777);
        assert!(matches!(
            number(b"\x80\0\0\0\0\0\0\x02", "size"),
            Err(Reason::Base256(_))
        ));
        assert!(matches!(
            number(b"0000648\0", "mode"),
            Err(Reason::BadNumber(_))
        ));
        assert!(matches!(
            number(b"-000001\0", "mode"),
            Err(Reason::BadNumber(_))
        ));
        assert!(matches!(
            number(b"00 00644", "mode"),
            Err(Reason::BadNumber(_))
        ));
        assert!(matches!(
            number(b"0x1\0\0\0\0\0", "mode"),
            Err(Reason::BadNumber(_))
        ));
    }

    #[test]
    fn cstr_garbage() {
        assert_eq!(cstr(b"abc\0\0", "name").unwrap(), b"abc");
        assert!(cstr(b"abc\0d", "name").is_err());
        assert_eq!(cstr(b"abcde", "name").unwrap(), b"abcde");
    }
}
