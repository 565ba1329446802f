//! One HTTP/1.x request head, read with a size bound.

use std::io::Read;

/// The most a request head may take (request line and headers).
pub const MAX_HEAD: usize = 16 * 1024;

/// A parsed request head and the bytes the client sent after it.
#[derive(Debug)]
pub struct Head {
    pub method: String,
    pub target: String,
    pub headers: Vec<(String, String)>,
    /// Bytes read past the blank line (a pipelined body or TLS hello).
    pub rest: Vec<u8>,
}

impl Head {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Read and parse one head. `Ok(None)` when the client closed before sending anything.
pub fn read_head(r: &mut impl Read) -> Result<Option<Head>, String> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    let end = loop {
        if let Some(i) = find(&buf, b"\r\n\r\n") {
            break i;
        }
        if buf.len() > MAX_HEAD {
            return Err(format!("request head larger than {MAX_HEAD} bytes"));
        }
        let n = r
            .read(&mut chunk)
            .map_err(|e| format!("reading the request: {e}"))?;
        if n == 0 {
            return if buf.is_empty() {
                Ok(None)
            } else {
                Err("the client closed mid-request".into())
            };
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let text = std::str::from_utf8(&buf[..end]).map_err(|_| "request head is not UTF-8")?;
    let mut lines = text.split("\r\n");
    let line = lines.next().unwrap_or_default();
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(format!("malformed request line {line:?}"));
    };
    if !matches!(version, "HTTP/1.1" | "HTTP/1.0") || method.is_empty() || target.is_empty() {
        return Err(format!("malformed request line {line:?}"));
    }
    let mut headers = Vec::new();
    for l in lines {
        let (k, v) = l
            .split_once(':')
            .ok_or_else(|| format!("malformed header line {l:?}"))?;
        if k.is_empty() || k.bytes().any(|b| b.is_ascii_whitespace()) {
            return Err(format!("malformed header name {k:?}"));
        }
        headers.push((k.to_owned(), v.trim().to_owned()));
    }
    Ok(Some(Head {
        method: method.to_owned(),
        target: target.to_owned(),
        headers,
        rest: buf[end + 4..].to_vec(),
    }))
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Split `host:port` (IPv6 in brackets); `default` when the port is absent.
pub fn split_authority(a: &str, default: Option<u16>) -> Result<(String, u16), String> {
    let bad = || format!("bad destination {a:?}: want host:port");
    let (host, port) = if let Some(rest) = a.strip_prefix('[') {
        let (h, after) = rest.split_once(']').ok_or_else(bad)?;
        (format!("[{h}]"), after.strip_prefix(':'))
    } else {
        match a.rsplit_once(':') {
            Some((h, p)) => (h.to_owned(), Some(p)),
            None => (a.to_owned(), None),
        }
    };
    let port = match port {
        Some(p) => p.parse::<u16>().ok().filter(|p| *p != 0).ok_or_else(bad)?,
        None => default.ok_or_else(bad)?,
    };
    if host.is_empty() {
        return Err(bad());
    }
    Ok((host, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_parse_and_bounds_hold() {
        let mut r =
            &b"CONNECT vault.example:8200 HTTP/1.1\r\nHost: vault.example:8200\r\n\r\nhello"[..];
        let h = read_head(&mut r).expect("ok").expect("head");
        assert_eq!(
            (h.method.as_str(), h.target.as_str()),
            ("CONNECT", "vault.example:8200")
        );
        assert_eq!(h.header("host"), Some("vault.example:8200"));
        assert_eq!(h.rest, b"hello");
        let big = [
            b"GET http://x/ HTTP/1.1\r\nX: ".as_slice(),
            &[b'a'; MAX_HEAD + 10],
        ]
        .concat();
        assert!(
            read_head(&mut &big[..])
                .expect_err("too big")
                .contains("larger")
        );
        assert!(read_head(&mut &b"GET  HTTP/1.1\r\n\r\n"[..]).is_err());
        assert!(read_head(&mut &b"GET / HTTP/2\r\n\r\n"[..]).is_err());
        assert!(read_head(&mut &b"GET / HTTP/1.1\r\nBad Name: x\r\n\r\n"[..]).is_err());
        assert!(read_head(&mut &b""[..]).expect("ok").is_none());
    }

    #[test]
    fn authorities_split() {
        assert_eq!(split_authority("a.b:443", None), Ok(("a.b".into(), 443)));
        assert_eq!(split_authority("[::1]:80", None), Ok(("[::1]".into(), 80)));
        assert_eq!(split_authority("a.b", Some(80)), Ok(("a.b".into(), 80)));
        assert!(split_authority("a.b", None).is_err());
        assert!(split_authority("a.b:0", None).is_err());
        assert!(split_authority("a.b:99999", None).is_err());
        assert!(split_authority(":80", None).is_err());
    }
}
