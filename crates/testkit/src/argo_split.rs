//! Argo CD's own reading of plugin output, as a process to ask: `argo-split`
//! (tests/system/argo-split, built by `scripts/argo-build --driver` from Argo CD's release
//! module) runs the cmp-server's `kube.SplitYAMLToString` on a generate command's output and its
//! `json.Unmarshal` on a dynamic parameters command's output. [`ArgoSplit::ask`] sends one input
//! and returns Argo CD's [`Answer`]; the tests and the `split_differential` fuzz target compare
//! it with cmp-warden's.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

/// What a reader made of one input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// A generate command's output, accepted: the manifests, byte for byte.
    Manifests(Vec<Vec<u8>>),
    /// A dynamic parameters command's output, accepted: the announcements as Go's
    /// `encoding/json` writes `[]*apiclient.ParameterAnnouncement` (empty fields left out).
    Params(serde_json::Value),
    /// Refused, with the error's text.
    Refused(Vec<u8>),
    /// Accepted, but a response gRPC's codec cannot marshal (a string that is not UTF-8):
    /// the codec's error, on which the cmp-server's `SendAndClose` fails.
    Unsendable(Vec<u8>),
}

impl Answer {
    /// Argo CD's answer as it reaches a client, and as cmp-warden sends it: a manifest's bytes
    /// that are not UTF-8 (only inside a JSON string a plugin printed raw) each as U+FFFD —
    /// protobuf strings are UTF-8, and the repo-server's JSON reading makes U+FFFD of each
    /// such byte itself (docs/repo-server.md lists the difference) — and an error's likewise,
    /// as gRPC sends a status message.
    pub fn as_sent(self) -> Answer {
        match self {
            Answer::Manifests(m) => Answer::Manifests(
                m.into_iter()
                    .map(|raw| match String::from_utf8(raw) {
                        Ok(s) => s.into_bytes(),
                        Err(e) => go_lossy(e.as_bytes()).into_bytes(),
                    })
                    .collect(),
            ),
            // gRPC's status message: its invalid UTF-8, byte for byte, as U+FFFD (grpc-go's
            // `encodeGrpcMessage`).
            Answer::Refused(e) => Answer::Refused(go_lossy(&e).into_bytes()),
            Answer::Unsendable(e) => Answer::Unsendable(go_lossy(&e).into_bytes()),
            other => other,
        }
    }
}

/// Each byte of invalid UTF-8 as U+FFFD (Go's `utf8.DecodeRune` steps one byte over it).
fn go_lossy(b: &[u8]) -> String {
    let mut out = String::new();
    let mut i = 0;
    while i < b.len() {
        let end = (i + 4).min(b.len());
        let mut taken = None;
        for w in 1..=end - i {
            if let Ok(s) = std::str::from_utf8(&b[i..i + w]) {
                taken = Some((s.chars().next().unwrap_or('\u{fffd}'), w));
                break;
            }
        }
        match taken {
            Some((c, w)) => {
                out.push(c);
                i += w;
            }
            None => {
                out.push('\u{fffd}');
                i += 1;
            }
        }
    }
    out
}

/// What is read: a generate command's output or a dynamic parameters command's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `kube.SplitYAMLToString`.
    Manifests,
    /// `json.Unmarshal` into `[]*apiclient.ParameterAnnouncement`.
    Params,
}

/// A running `argo-split`.
#[derive(Debug)]
pub struct ArgoSplit {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl ArgoSplit {
    /// Where `argo-split` is: `$CMP_WARDEN_ARGO_SPLIT`, else scripts/argo-build's place for
    /// Argo CD v3 (`$CMP_WARDEN_ARGO_CACHE`, default /var/cache/cmp-warden-argo).
    pub fn path() -> PathBuf {
        if let Some(p) = std::env::var_os("CMP_WARDEN_ARGO_SPLIT").filter(|p| !p.is_empty()) {
            return PathBuf::from(p);
        }
        let cache = std::env::var_os("CMP_WARDEN_ARGO_CACHE")
            .filter(|p| !p.is_empty())
            .map_or_else(
                || PathBuf::from("/var/cache/cmp-warden-argo"),
                PathBuf::from,
            );
        cache.join("v3.5.7/argo-split")
    }

    /// Start the program at `path`.
    pub fn start(path: &Path) -> std::io::Result<ArgoSplit> {
        let mut child = Command::new(path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        Ok(ArgoSplit {
            child,
            stdin,
            stdout,
        })
    }

    /// Argo CD's answer to `input` read as `mode`.
    pub fn ask(&mut self, mode: Mode, input: &[u8]) -> Answer {
        let tag = match mode {
            Mode::Manifests => b'm',
            Mode::Params => b'p',
        };
        let len = u32::try_from(input.len()).expect("an input under 4 GiB");
        let mut msg = Vec::with_capacity(input.len() + 5);
        msg.push(tag);
        msg.extend_from_slice(&len.to_be_bytes());
        msg.extend_from_slice(input);
        self.stdin.write_all(&msg).expect("argo-split's stdin");
        self.stdin.flush().expect("argo-split's stdin");
        let mut line = String::new();
        self.stdout
            .read_line(&mut line)
            .expect("argo-split's answer");
        assert!(!line.is_empty(), "argo-split ended");
        let v: serde_json::Value = serde_json::from_str(&line).expect("argo-split's JSON");
        let unhex =
            |v: &serde_json::Value| hex::decode(v.as_str().unwrap_or_default()).expect("hex");
        if v["accepted"] != true {
            return Answer::Refused(unhex(&v["error"]));
        }
        if v["marshalError"].is_string() {
            return Answer::Unsendable(unhex(&v["marshalError"]));
        }
        match mode {
            Mode::Manifests => Answer::Manifests(
                v["manifests"]
                    .as_array()
                    .map(|m| m.iter().map(unhex).collect())
                    .unwrap_or_default(),
            ),
            Mode::Params => Answer::Params(match &v["params"] {
                serde_json::Value::Null => serde_json::json!([]),
                p => p.clone(),
            }),
        }
    }
}

impl Drop for ArgoSplit {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
