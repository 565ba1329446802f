//! HTTP/2 `:authority` tolerance: Argo CD's repo-server (grpc-go dialling a unix socket) sends
//! the socket path, or an escaped form of it, as `:authority`, which hyper refuses.
//!
//! Argo CD's repo-server dials the plugin socket with grpc-go, which sends the socket path as
//! `:authority` (`/home/argocd/cmp-server/plugins/x.sock`, `%2Fhome%2F...` or `home%2F...`
//! depending on the version). hyper's h2 rejects those streams with PROTOCOL_ERROR before any
//! service sees them. This layer sits between the socket and hyper on the client-to-server
//! direction only: it passes frames through, but decodes each header block (HEADERS and its
//! CONTINUATIONs) with HPACK, replaces an `:authority` that is not a valid URI authority with
//! `localhost`, and re-encodes the block as literals without indexing, so hyper's HPACK table
//! stays empty and can never disagree with ours. Padding and priority fields are dropped.
//! Decoding is bounded (table size, decoded list size, block size).

use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADER: usize = 9;
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// Largest frame we emit (the HTTP/2 default SETTINGS_MAX_FRAME_SIZE).
const MAX_OUT_FRAME: usize = 16_384;
/// Largest header block we assemble.
const MAX_BLOCK: usize = 1 << 20;
/// Largest decoded header list (names + values) we accept per block.
const MAX_DECODED: usize = 256 * 1024;
/// Largest HPACK dynamic table the client may ask for.
const MAX_TABLE: usize = 64 * 1024;
/// What replaces an invalid authority.
const REPLACEMENT: &[u8] = b"localhost";

/// A client stream that is not HTTP/2 we can safely rewrite.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("http/2 authority layer: {0}")]
pub struct RewriteError(pub &'static str);

#[derive(Debug)]
enum State {
    Preface,
    Header,
    /// Forwarding `remaining` payload bytes of a non-header frame as they arrive.
    Passthrough(usize),
    /// Collecting a HEADERS/CONTINUATION payload.
    Collect {
        ftype: u8,
        flags: u8,
        stream: u32,
        len: usize,
    },
}

/// Sans-IO rewriter for the client-to-server byte stream.
pub struct Rewriter {
    state: State,
    input: Vec<u8>,
    /// A header block waiting for CONTINUATION: (stream, END_STREAM set, fragment so far).
    pending: Option<(u32, bool, Vec<u8>)>,
    decoder: loona_hpack::Decoder<'static>,
    /// Number of `:authority` values replaced (for logs and tests).
    pub rewritten: u64,
}

impl std::fmt::Debug for Rewriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rewriter")
            .field("state", &self.state)
            .field("rewritten", &self.rewritten)
            .finish()
    }
}

impl Default for Rewriter {
    fn default() -> Self {
        let mut decoder = loona_hpack::Decoder::new();
        decoder.set_max_allowed_table_size(MAX_TABLE);
        Self {
            state: State::Preface,
            input: Vec::new(),
            pending: None,
            decoder,
            rewritten: 0,
        }
    }
}

impl Rewriter {
    /// Feed bytes from the client; rewritten bytes are appended to `out`.
    pub fn feed(&mut self, data: &[u8], out: &mut Vec<u8>) -> Result<(), RewriteError> {
        self.input.extend_from_slice(data);
        loop {
            match self.state {
                State::Preface => {
                    let n = self.input.len().min(PREFACE.len());
                    if self.input[..n] != PREFACE[..n] {
                        return Err(RewriteError("not an HTTP/2 connection preface"));
                    }
                    if n < PREFACE.len() {
                        return Ok(());
                    }
                    out.extend_from_slice(PREFACE);
                    self.input.drain(..PREFACE.len());
                    self.state = State::Header;
                }
                State::Header => {
                    if self.input.len() < FRAME_HEADER {
                        return Ok(());
                    }
                    let h: [u8; FRAME_HEADER] =
                        self.input[..FRAME_HEADER].try_into().expect("9 bytes");
                    let len =
                        (usize::from(h[0]) << 16) | (usize::from(h[1]) << 8) | usize::from(h[2]);
                    let (ftype, flags) = (h[3], h[4]);
                    let stream = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
                    if self.pending.is_some() && ftype != CONTINUATION {
                        return Err(RewriteError("frame interleaved in a header block"));
                    }
                    if ftype == HEADERS || ftype == CONTINUATION {
                        if len > MAX_BLOCK {
                            return Err(RewriteError("header frame too large"));
                        }
                        self.input.drain(..FRAME_HEADER);
                        self.state = State::Collect {
                            ftype,
                            flags,
                            stream,
                            len,
                        };
                    } else {
                        out.extend_from_slice(&h);
                        self.input.drain(..FRAME_HEADER);
                        self.state = State::Passthrough(len);
                    }
                }
                State::Passthrough(remaining) => {
                    let n = remaining.min(self.input.len());
                    out.extend_from_slice(&self.input[..n]);
                    self.input.drain(..n);
                    if n == remaining {
                        self.state = State::Header;
                    } else {
                        self.state = State::Passthrough(remaining - n);
                        return Ok(());
                    }
                }
                State::Collect {
                    ftype,
                    flags,
                    stream,
                    len,
                } => {
                    if self.input.len() < len {
                        return Ok(());
                    }
                    let payload: Vec<u8> = self.input.drain(..len).collect();
                    self.state = State::Header;
                    self.header_frame(ftype, flags, stream, payload, out)?;
                }
            }
        }
    }

    fn header_frame(
        &mut self,
        ftype: u8,
        flags: u8,
        stream: u32,
        payload: Vec<u8>,
        out: &mut Vec<u8>,
    ) -> Result<(), RewriteError> {
        let fragment = if ftype == HEADERS {
            if self.pending.is_some() {
                return Err(RewriteError("HEADERS inside a header block"));
            }
            let mut p = &payload[..];
            let mut pad = 0usize;
            if flags & PADDED != 0 {
                let (&n, rest) = p.split_first().ok_or(RewriteError("missing pad length"))?;
                pad = usize::from(n);
                p = rest;
            }
            if flags & PRIORITY != 0 {
                p = p.get(5..).ok_or(RewriteError("short priority field"))?;
            }
            if pad > p.len() {
                return Err(RewriteError("padding exceeds payload"));
            }
            self.pending = Some((stream, flags & END_STREAM != 0, Vec::new()));
            p[..p.len() - pad].to_vec()
        } else {
            match &self.pending {
                Some((s, _, _)) if *s == stream => payload,
                _ => return Err(RewriteError("unexpected CONTINUATION")),
            }
        };
        let Some((s, end_stream, mut block)) = self.pending.take() else {
            return Err(RewriteError("no header block in progress"));
        };
        if block.len() + fragment.len() > MAX_BLOCK {
            return Err(RewriteError("header block too large"));
        }
        block.extend_from_slice(&fragment);
        if flags & END_HEADERS == 0 {
            self.pending = Some((s, end_stream, block));
            return Ok(());
        }
        self.emit_block(s, end_stream, &block, out)
    }

    fn emit_block(
        &mut self,
        stream: u32,
        end_stream: bool,
        block: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), RewriteError> {
        let mut fields: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        let mut decoded = 0usize;
        let mut too_big = false;
        self.decoder
            .decode_with_cb(block, |n, v| {
                decoded += n.len() + v.len() + 32;
                if decoded > MAX_DECODED {
                    too_big = true;
                } else {
                    fields.push((n.into_owned(), v.into_owned()));
                }
            })
            .map_err(|_| RewriteError("hpack decoding failed"))?;
        if too_big {
            return Err(RewriteError("header list too large"));
        }
        let mut enc = Vec::with_capacity(block.len() * 2);
        for (name, value) in &mut fields {
            if name.as_slice() == b":authority"
                && http::uri::Authority::try_from(value.as_slice()).is_err()
            {
                tracing::debug!(original = %String::from_utf8_lossy(value), "rewrote :authority");
                *value = REPLACEMENT.to_vec();
                self.rewritten += 1;
            }
            // Literal header field without indexing, new name (RFC 7541 §6.2.2), no Huffman.
            enc.push(0x00);
            put_string(&mut enc, name);
            put_string(&mut enc, value);
        }
        let mut chunks = enc.chunks(MAX_OUT_FRAME).peekable();
        let mut first = true;
        if enc.is_empty() {
            frame(
                out,
                HEADERS,
                END_HEADERS | if end_stream { END_STREAM } else { 0 },
                stream,
                &[],
            );
        }
        while let Some(c) = chunks.next() {
            let last = chunks.peek().is_none();
            let mut flags = if last { END_HEADERS } else { 0 };
            if first && end_stream {
                flags |= END_STREAM;
            }
            frame(
                out,
                if first { HEADERS } else { CONTINUATION },
                flags,
                stream,
                c,
            );
            first = false;
        }
        Ok(())
    }
}

fn put_string(out: &mut Vec<u8>, s: &[u8]) {
    out.extend(loona_hpack::encoder::encode_integer(s.len(), 7));
    out.extend_from_slice(s);
}

fn frame(out: &mut Vec<u8>, ftype: u8, flags: u8, stream: u32, payload: &[u8]) {
    let len = payload.len();
    out.extend_from_slice(&[(len >> 16) as u8, (len >> 8) as u8, len as u8, ftype, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
}

/// An I/O stream whose incoming bytes pass through a [`Rewriter`]; writes pass straight through.
#[derive(Debug)]
pub struct AuthorityFix<S> {
    inner: S,
    rw: Rewriter,
    out: Vec<u8>,
    pos: usize,
    buf: Box<[u8]>,
}

impl<S> AuthorityFix<S> {
    /// Wrap a freshly accepted connection.
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            rw: Rewriter::default(),
            out: Vec::new(),
            pos: 0,
            buf: vec![0; 64 * 1024].into_boxed_slice(),
        }
    }

    /// The wrapped stream.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for AuthorityFix<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        dst: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.pos < this.out.len() {
                let n = (this.out.len() - this.pos).min(dst.remaining());
                dst.put_slice(&this.out[this.pos..this.pos + n]);
                this.pos += n;
                if this.pos == this.out.len() {
                    this.out.clear();
                    this.pos = 0;
                }
                return Poll::Ready(Ok(()));
            }
            let mut rb = ReadBuf::new(&mut this.buf);
            match Pin::new(&mut this.inner).poll_read(cx, &mut rb) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) => {
                    let n = rb.filled().len();
                    if n == 0 {
                        return Poll::Ready(Ok(()));
                    }
                    let data = this.buf[..n].to_vec();
                    if let Err(e) = this.rw.feed(&data, &mut this.out) {
                        return Poll::Ready(Err(std::io::Error::new(
                            std::io::ErrorKind::InvalidData,
                            e,
                        )));
                    }
                }
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for AuthorityFix<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// Fuzzing entry: feed arbitrary bytes (after a valid preface) in arbitrary splits.
#[doc(hidden)]
pub fn fuzz_feed(data: &[u8], split: usize) {
    let mut input = PREFACE.to_vec();
    input.extend_from_slice(data);
    let cut = split % (input.len() + 1);
    let whole = feed_chunks(&[&input]);
    let parts = feed_chunks(&[&input[..cut], &input[cut..]]);
    assert_eq!(
        whole, parts,
        "the rewriter's result depends on how reads are split"
    );
}

/// Feed `chunks` in order: what was written, and whether every chunk was accepted.
pub fn feed_chunks(chunks: &[&[u8]]) -> (Vec<u8>, bool) {
    let mut rw = Rewriter::default();
    let mut out = Vec::new();
    for c in chunks {
        if rw.feed(c, &mut out).is_err() {
            return (out, false);
        }
    }
    (out, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers_frame(block: &[u8], flags: u8, stream: u32) -> Vec<u8> {
        let mut v = Vec::new();
        frame(&mut v, HEADERS, flags, stream, block);
        v
    }

    fn decode_out(out: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
        let mut d = loona_hpack::Decoder::new();
        let mut fields = Vec::new();
        let mut rest = &out[PREFACE.len()..];
        while rest.len() >= 9 {
            let len =
                (usize::from(rest[0]) << 16) | (usize::from(rest[1]) << 8) | usize::from(rest[2]);
            if rest[3] == HEADERS || rest[3] == CONTINUATION {
                fields.extend(d.decode(&rest[9..9 + len]).unwrap());
            }
            rest = &rest[9 + len..];
        }
        fields
    }

    #[test]
    fn rewrites_socket_path_authorities_and_keeps_valid_ones() {
        for (auth, want) in [
            (
                &b"/home/argocd/cmp-server/plugins/x.sock"[..],
                &b"localhost"[..],
            ),
            (
                b"%2Fhome%2Fargocd%2Fcmp-server%2Fplugins%2Fx.sock",
                b"localhost",
            ),
            (
                b"home%2Fargocd%2Fcmp-server%2Fplugins%2Fx.sock",
                b"localhost",
            ),
            (b"localhost", b"localhost"),
            (b"example.com:8080", b"example.com:8080"),
        ] {
            let mut enc = loona_hpack::Encoder::new();
            let block = enc.encode([
                (&b":method"[..], &b"POST"[..]),
                (b":authority", auth),
                (b":path", b"/x"),
            ]);
            let mut input = PREFACE.to_vec();
            input.extend(headers_frame(&block, END_HEADERS, 1));
            // A second request on the same connection uses the dynamic table.
            let block2 = enc.encode([
                (&b":method"[..], &b"POST"[..]),
                (b":authority", auth),
                (b":path", b"/y"),
            ]);
            input.extend(headers_frame(&block2, END_HEADERS | END_STREAM, 3));
            let mut rw = Rewriter::default();
            let mut out = Vec::new();
            // Byte-at-a-time feeding must give the same result.
            for b in &input {
                rw.feed(std::slice::from_ref(b), &mut out).unwrap();
            }
            let fields = decode_out(&out);
            let auths: Vec<&[u8]> = fields
                .iter()
                .filter(|(n, _)| n == b":authority")
                .map(|(_, v)| v.as_slice())
                .collect();
            assert_eq!(auths, [want, want]);
            assert_eq!(rw.rewritten, if want == auth { 0 } else { 2 });
        }
    }

    #[test]
    fn continuation_padding_and_passthrough() {
        let mut enc = loona_hpack::Encoder::new();
        let block = enc.encode([
            (&b":authority"[..], &b"/a.sock"[..]),
            (b"x-big", &[b'v'; 100][..]),
        ]);
        let mut input = PREFACE.to_vec();
        // DATA frame before, passed through verbatim.
        frame(&mut input, 0x0, 0, 1, b"hello");
        let (a, b) = block.split_at(10);
        let mut padded = vec![3u8];
        padded.extend_from_slice(&[0, 0, 0, 0, 16]);
        padded.extend_from_slice(a);
        padded.extend_from_slice(&[0, 0, 0]);
        frame(
            &mut input,
            HEADERS,
            PADDED | PRIORITY | END_STREAM,
            5,
            &padded,
        );
        frame(&mut input, CONTINUATION, END_HEADERS, 5, b);
        let mut rw = Rewriter::default();
        let mut out = Vec::new();
        rw.feed(&input, &mut out).unwrap();
        assert_eq!(
            &out[PREFACE.len()..PREFACE.len() + 14],
            &input[PREFACE.len()..PREFACE.len() + 14]
        );
        let fields = decode_out(&out);
        assert_eq!(fields[0], (b":authority".to_vec(), b"localhost".to_vec()));
        assert_eq!(rw.rewritten, 1);
    }

    #[test]
    fn refuses_garbage() {
        let mut rw = Rewriter::default();
        assert!(rw.feed(b"GET / HTTP/1.1\r\n", &mut Vec::new()).is_err());
        let mut rw = Rewriter::default();
        let mut input = PREFACE.to_vec();
        frame(&mut input, CONTINUATION, END_HEADERS, 1, b"x");
        assert!(rw.feed(&input, &mut Vec::new()).is_err());
        // A HEADERS frame whose block is not HPACK: refused however it is split.
        let mut bad = PREFACE.to_vec();
        bad.extend_from_slice(&[0, 0, 5, 1, 4, 0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff, 0xff]);
        for cut in 0..=bad.len() {
            let (_, ok) = feed_chunks(&[&bad[..cut], &bad[cut..]]);
            assert!(!ok, "accepted when split at {cut}");
            fuzz_feed(&bad[PREFACE.len()..], cut);
        }
    }
}
