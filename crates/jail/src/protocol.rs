//! The supervisor ⇄ jail pipe protocol. Trusted in both directions only as far as framing: the
//! supervisor writes the preparation, the request header and the archive; the jail answers one
//! [`Reply`], which the supervisor parses with a size cap (the jail runs hostile commands, so its
//! answer is input).
//!
//! stdin:  `P` len json(prepare) · `H` len json(header) · (`D` len bytes)* · `E`
//!         `P` is written when the jail is started (a spare confines itself while it waits for
//!         a request); `E` only after the checksum matched; after `E`, EOF on stdin means
//!         "cancel". Closing without `E` aborts the extraction; closing before `H` retires an
//!         unused jail.
//! stdout: one JSON [`Reply`], then EOF (none for a retired jail).

use std::io::{self, Read, Write};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::confine::{Report, Sandbox};
use crate::request::Outcome;

/// Largest frame accepted (the header carries the plugin config; data frames are ≤ 64 KiB).
pub const MAX_FRAME: usize = 16 << 20;

/// What the jail should do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum JailOp {
    /// GenerateManifest.
    Generate,
    /// MatchRepository.
    Match,
    /// GetParametersAnnouncement.
    Parameters,
    /// ApplicationSet plugin generator.
    Generator,
    /// Confine, report, exit (start-up probe and `doctor`).
    Probe,
}

/// The first frame, written when the jail is started: everything it needs to confine itself,
/// none of it from a request.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Prepare {
    /// The work root (sticky, world-writable, not listable) the jail's directory is made in.
    pub work_root: PathBuf,
    /// The jail's directory name (chosen by the supervisor, unique per jail).
    pub name: String,
    /// The confinement to apply.
    pub sandbox: Sandbox,
    /// The jail's cgroup, joined before anything else.
    #[serde(default)]
    pub cgroup: Option<crate::cgroup::RequestCgroup>,
}

/// The second frame: the request, read only once the jail is confined.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Header {
    /// Operation.
    pub op: JailOp,
    /// The request's name in the supervisor's logs.
    pub request: String,
    /// The plugin.
    pub config: plugin::PluginConfig,
    /// `appRelPath`.
    pub app_rel_path: String,
    /// Composed request environment (HOME and TMPDIR are set by the jail).
    pub env: Vec<(String, String)>,
    /// Archive options.
    pub archive: archive::Options,
    /// Per-command output budget.
    pub output_bytes: u64,
    /// Milliseconds left until the request's deadline.
    pub deadline_ms: Option<u64>,
    /// Which limit the deadline comes from.
    pub deadline_limit: crate::run::TimeLimit,
    /// Per-command timeout in milliseconds, with its configured text.
    pub command_timeout: Option<(u64, String)>,
    /// Probe only: directories outside the request directory the extractor must fail to
    /// write into once confined (the self-test; the work root is always tried).
    #[serde(default)]
    pub probe_writes: Vec<PathBuf>,
}

/// How a failure maps onto the client's error classes (the server turns these into gRPC codes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorKind {
    /// Bad input (archive policy, appRelPath).
    InvalidArgument,
    /// A limit.
    ResourceExhausted,
    /// Integrity.
    DataLoss,
    /// Deadline.
    DeadlineExceeded,
    /// Client cancel or shutdown.
    Cancelled,
    /// A command or its output failed.
    Unknown,
    /// Our own failure (including a sandbox that could not be built).
    Internal,
}

/// The jail's answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Reply {
    /// Success.
    Ok {
        /// The result (`None` for a probe).
        outcome: Option<Outcome>,
        /// What was enforced.
        report: Report,
        /// What ran (audit).
        #[serde(default)]
        record: crate::record::RunRecord,
    },
    /// Failure, with the message the client sees.
    Err {
        /// Class.
        kind: ErrorKind,
        /// Message (Argo-compatible where Argo has one).
        message: String,
        /// What was enforced, if confinement got that far.
        report: Option<Report>,
        /// What ran before the failure (audit).
        #[serde(default)]
        record: crate::record::RunRecord,
    },
}

/// Write one frame.
pub fn write_frame(w: &mut impl Write, tag: u8, body: &[u8]) -> io::Result<()> {
    let len = u32::try_from(body.len()).map_err(|_| io::Error::other("frame too large"))?;
    let mut head = [0u8; 5];
    head[0] = tag;
    head[1..].copy_from_slice(&len.to_be_bytes());
    w.write_all(&head)?;
    w.write_all(body)
}

/// Read one frame header: `None` at a clean EOF. Frames over `max` bytes are refused.
pub fn read_frame_head(r: &mut impl Read, max: usize) -> io::Result<Option<(u8, usize)>> {
    let mut head = [0u8; 5];
    let mut got = 0;
    while got < head.len() {
        match r.read(&mut head[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let len = u32::from_be_bytes([head[1], head[2], head[3], head[4]]) as usize;
    if len > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "frame too large",
        ));
    }
    Ok(Some((head[0], len)))
}

/// Read one frame tagged `tag` holding JSON: `Ok(None)` at a clean EOF before the frame.
pub fn read_json_frame<T: serde::de::DeserializeOwned>(
    r: &mut impl Read,
    tag: u8,
) -> Result<Option<T>, String> {
    let name = char::from(tag);
    match read_frame_head(r, MAX_FRAME) {
        Ok(None) => Ok(None),
        Ok(Some((t, n))) if t == tag => {
            let mut body = vec![0u8; n];
            r.read_exact(&mut body)
                .map_err(|e| format!("reading frame {name}: {e}"))?;
            serde_json::from_slice(&body)
                .map(Some)
                .map_err(|e| format!("bad frame {name}: {e}"))
        }
        Ok(Some((t, _))) => Err(format!("expected frame {name}, got {:?}", char::from(t))),
        Err(e) => Err(format!("reading frame {name}: {e}")),
    }
}

/// Reads the archive out of `D` frames; EOF at `E`; an error if the stream ends without `E`.
#[derive(Debug)]
pub struct FrameReader<R> {
    inner: R,
    left: usize,
    ended: bool,
}

impl<R: Read> FrameReader<R> {
    /// Wrap the jail's stdin (after the header frame).
    pub fn new(inner: R) -> Self {
        Self {
            inner,
            left: 0,
            ended: false,
        }
    }

    /// Give the underlying reader back (to watch for cancellation after `E`).
    pub fn into_inner(self) -> R {
        self.inner
    }

    /// Whether the end frame was seen.
    pub fn ended(&self) -> bool {
        self.ended
    }
}

impl<R: Read> Read for FrameReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.left == 0 {
            if self.ended {
                return Ok(0);
            }
            match read_frame_head(&mut self.inner, MAX_FRAME)? {
                None => {
                    return Err(io::Error::new(
                        io::ErrorKind::ConnectionAborted,
                        "archive stream aborted",
                    ));
                }
                Some((b'D', n)) => self.left = n,
                Some((b'E', 0)) => self.ended = true,
                Some((t, _)) => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("unexpected frame {t}"),
                    ));
                }
            }
        }
        let n = buf.len().min(self.left);
        let got = self.inner.read(&mut buf[..n])?;
        if got == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        self.left -= got;
        Ok(got)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_abort_is_an_error() {
        let mut buf = Vec::new();
        write_frame(&mut buf, b'D', b"hello ").unwrap();
        write_frame(&mut buf, b'D', b"world").unwrap();
        write_frame(&mut buf, b'E', b"").unwrap();
        let mut r = FrameReader::new(&buf[..]);
        let mut s = String::new();
        r.read_to_string(&mut s).unwrap();
        assert_eq!(s, "hello world");
        assert!(r.ended());

        let mut cut = Vec::new();
        write_frame(&mut cut, b'D', b"partial").unwrap();
        let mut r = FrameReader::new(&cut[..]);
        let mut s = String::new();
        let e = r.read_to_string(&mut s).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionAborted);

        let mut huge = vec![b'D'];
        huge.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(FrameReader::new(&huge[..]).read(&mut [0; 4]).is_err());
    }
}
