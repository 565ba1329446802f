//! One HTTP/1.x request head, parsed by `httparse` within a size bound.

/// The most a request head may take (request line and headers).
pub const MAX_HEAD: usize = 16 * 1024;

/// The most header lines a head may carry.
const MAX_HEADERS: usize = 64;

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

    /// How many times header `name` appears.
    pub fn count(&self, name: &str) -> usize {
        self.headers
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case(name))
            .count()
    }
}

/// Parse the head at the start of `buf`: `Ok(None)` while it is incomplete (read more, up to
/// [`MAX_HEAD`]), or the head and what followed it.
pub fn parse_head(buf: &[u8]) -> Result<Option<Head>, String> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let end = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() >= MAX_HEAD => {
            return Err(format!("request head larger than {MAX_HEAD} bytes"));
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(format!("more than {MAX_HEADERS} header lines"));
        }
        Err(e) => return Err(format!("malformed request head ({e})")),
    };
    if end > MAX_HEAD {
        return Err(format!("request head larger than {MAX_HEAD} bytes"));
    }
    let (Some(method), Some(target)) = (req.method, req.path) else {
        return Err("malformed request line".into());
    };
    let mut out = Vec::with_capacity(req.headers.len());
    for h in req.headers.iter() {
        let v = std::str::from_utf8(h.value)
            .map_err(|_| format!("header {:?} is not UTF-8", h.name))?;
        out.push((h.name.to_owned(), v.trim().to_owned()));
    }
    Ok(Some(Head {
        method: method.to_owned(),
        target: target.to_owned(),
        headers: out,
        rest: buf[end..].to_vec(),
    }))
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
        let r =
            &b"CONNECT vault.example:8200 HTTP/1.1\r\nHost: vault.example:8200\r\n\r\nhello"[..];
        let h = parse_head(r).expect("ok").expect("head");
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
        assert!(parse_head(&big).expect_err("too big").contains("larger"));
        assert!(parse_head(b"GET  HTTP/1.1\r\n\r\n").is_err());
        assert!(parse_head(b"GET / HTTP/2\r\n\r\n").is_err());
        assert!(parse_head(b"GET / HTTP/1.1\r\nBad Name: x\r\n\r\n").is_err());
        let many: String = (0..70).map(|i| format!("X{i}: y\r\n")).collect();
        assert!(
            parse_head(format!("GET / HTTP/1.1\r\n{many}\r\n").as_bytes())
                .expect_err("many")
                .contains("header lines")
        );
        // Incomplete: more is needed.
        assert!(parse_head(b"").expect("ok").is_none());
        assert!(
            parse_head(b"CONNECT a:1 HTTP/1.1\r\n")
                .expect("ok")
                .is_none()
        );
    }

    /// A complete head is accepted up to exactly MAX_HEAD bytes.
    #[test]
    fn a_complete_head_is_bounded_at_its_edge() {
        let of = |n: usize| {
            let fixed = "GET / HTTP/1.1\r\nX: \r\n\r\n".len();
            format!("GET / HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(n - fixed))
        };
        // A head with a 10 KiB header (a long token, a cookie) is an honest one.
        assert!(
            parse_head(of(10 * 1024).as_bytes())
                .expect("10 KiB")
                .is_some()
        );
        assert_eq!(of(MAX_HEAD).len(), MAX_HEAD);
        assert!(
            parse_head(of(MAX_HEAD).as_bytes())
                .expect("at the bound")
                .is_some()
        );
        assert!(
            parse_head(of(MAX_HEAD + 1).as_bytes())
                .expect_err("past it")
                .contains("larger")
        );
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
