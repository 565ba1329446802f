//! Exactly one gzip member (RFC 1952), strictly framed.
//!
//! Multi-member handling: Argo CD's writer emits one member. A second member, or any byte after
//! the first member's trailer, is refused (`TrailingGzipData`): Go's reader would silently
//! concatenate members, so accepting them would let a sender hide data behind the archive that the
//! checksum covers but a reviewer's tool does not show. Optional header fields are capped, the
//! header CRC is checked when present, and the trailer's CRC-32 and ISIZE are verified.

use std::io::{self, BufRead, BufReader, Read};

use flate2::bufread::DeflateDecoder;

use crate::error::{LimitKind, Reason};
use crate::stream::Tripwire;

const FHCRC: u8 = 0x02;
const FEXTRA: u8 = 0x04;
const FNAME: u8 = 0x08;
const FCOMMENT: u8 = 0x10;
const FRESERVED: u8 = 0xe0;

/// Buffer between the input and the inflater; large enough that syscalls are not the bottleneck.
const BUF: usize = 64 * 1024;

#[derive(Debug)]
enum State {
    Header,
    Body,
    Done,
}

/// Decompresses one gzip member from `R`, verifying framing, and fails on trailing bytes.
pub(crate) struct GzipReader<R: Read> {
    deflate: DeflateDecoder<BufReader<R>>,
    state: State,
    crc: crc32fast::Hasher,
    size: u32,
    field_cap: usize,
    wire: Tripwire,
}

impl<R: Read> std::fmt::Debug for GzipReader<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GzipReader")
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

impl<R: Read> GzipReader<R> {
    pub(crate) fn new(inner: R, field_cap: usize, wire: Tripwire) -> Self {
        Self {
            deflate: DeflateDecoder::new(BufReader::with_capacity(BUF, inner)),
            state: State::Header,
            crc: crc32fast::Hasher::new(),
            size: 0,
            field_cap,
            wire,
        }
    }

    pub(crate) fn into_inner(self) -> R {
        self.deflate.into_inner().into_inner()
    }

    fn fail(&self, msg: &str) -> io::Error {
        self.wire.trip(Reason::Gzip(msg.to_owned()))
    }

    /// Map an error from the input side: keep a tripped reason, else treat as corrupt data.
    fn input_err(&self, e: io::Error, what: &str) -> io::Error {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            return self.wire.trip(Reason::Truncated);
        }
        // A tripped reason (limit, input error) is kept; otherwise this is a decode error.
        self.wire.trip(Reason::Gzip(format!("{what}: {e}")))
    }

    fn read_header(&mut self) -> io::Result<()> {
        let mut hcrc = crc32fast::Hasher::new();
        let (empty, bad_magic) = match self.deflate.get_mut().fill_buf() {
            Ok(b) => (
                b.is_empty(),
                b.first().is_some_and(|&x| x != 0x1f) || b.get(1).is_some_and(|&x| x != 0x8b),
            ),
            Err(e) => return Err(self.input_err(e, "header")),
        };
        if empty {
            return Err(self.wire.trip(Reason::Truncated));
        }
        if bad_magic {
            return Err(self.fail("not gzip data (bad magic)"));
        }
        let mut fixed = [0u8; 10];
        read_exact(self.deflate.get_mut(), &mut fixed, &mut hcrc)
            .map_err(|e| self.input_err(e, "header"))?;
        if fixed[0] != 0x1f || fixed[1] != 0x8b {
            return Err(self.fail("not gzip data (bad magic)"));
        }
        if fixed[2] != 8 {
            return Err(self.fail("unsupported compression method"));
        }
        let flags = fixed[3];
        if flags & FRESERVED != 0 {
            return Err(self.fail("reserved header flags set"));
        }
        if flags & FEXTRA != 0 {
            let mut len = [0u8; 2];
            read_exact(self.deflate.get_mut(), &mut len, &mut hcrc)
                .map_err(|e| self.input_err(e, "header"))?;
            let len = u16::from_le_bytes(len) as usize;
            if len > self.field_cap {
                return Err(self.over_cap());
            }
            let mut extra = vec![0u8; len];
            read_exact(self.deflate.get_mut(), &mut extra, &mut hcrc)
                .map_err(|e| self.input_err(e, "header"))?;
        }
        for flag in [FNAME, FCOMMENT] {
            if flags & flag != 0 {
                self.skip_cstring(&mut hcrc)?;
            }
        }
        if flags & FHCRC != 0 {
            let expect = (hcrc.clone().finalize() & 0xffff) as u16;
            let mut got = [0u8; 2];
            read_exact(
                self.deflate.get_mut(),
                &mut got,
                &mut crc32fast::Hasher::new(),
            )
            .map_err(|e| self.input_err(e, "header"))?;
            if u16::from_le_bytes(got) != expect {
                return Err(self.fail("header crc mismatch"));
            }
        }
        Ok(())
    }

    fn over_cap(&self) -> io::Error {
        self.wire.trip(Reason::limit(
            LimitKind::GzipHeaderBytes,
            self.field_cap as u64,
        ))
    }

    fn skip_cstring(&mut self, hcrc: &mut crc32fast::Hasher) -> io::Result<()> {
        let mut seen = 0usize;
        loop {
            let mut b = [0u8; 1];
            read_exact(self.deflate.get_mut(), &mut b, hcrc)
                .map_err(|e| self.input_err(e, "header"))?;
            if b[0] == 0 {
                return Ok(());
            }
            seen += 1;
            if seen > self.field_cap {
                return Err(self.over_cap());
            }
        }
    }

    fn read_trailer(&mut self) -> io::Result<()> {
        let mut t = [0u8; 8];
        read_exact(
            self.deflate.get_mut(),
            &mut t,
            &mut crc32fast::Hasher::new(),
        )
        .map_err(|e| self.input_err(e, "trailer"))?;
        let crc = u32::from_le_bytes([t[0], t[1], t[2], t[3]]);
        let isize = u32::from_le_bytes([t[4], t[5], t[6], t[7]]);
        if crc != self.crc.clone().finalize() {
            return Err(self.fail("crc32 mismatch"));
        }
        if isize != self.size {
            return Err(self.fail("length mismatch"));
        }
        let more = match self.deflate.get_mut().fill_buf() {
            Ok(rest) => !rest.is_empty(),
            Err(e) => return Err(self.input_err(e, "trailer")),
        };
        if more {
            return Err(self.wire.trip(Reason::TrailingGzipData));
        }
        Ok(())
    }
}

/// `read_exact` that also feeds the header CRC.
fn read_exact<B: BufRead>(
    src: &mut B,
    out: &mut [u8],
    hcrc: &mut crc32fast::Hasher,
) -> io::Result<()> {
    src.read_exact(out)?;
    hcrc.update(out);
    Ok(())
}

impl<R: Read> Read for GzipReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            match self.state {
                State::Header => {
                    self.read_header()?;
                    self.state = State::Body;
                }
                State::Body => {
                    if buf.is_empty() {
                        return Ok(0);
                    }
                    let n = self
                        .deflate
                        .read(buf)
                        .map_err(|e| self.input_err(e, "deflate"))?;
                    if n == 0 {
                        self.read_trailer()?;
                        self.state = State::Done;
                        return Ok(0);
                    }
                    self.crc.update(&buf[..n]);
                    self.size = self.size.wrapping_add(n as u32);
                    return Ok(n);
                }
                State::Done => return Ok(0),
            }
        }
    }
}
