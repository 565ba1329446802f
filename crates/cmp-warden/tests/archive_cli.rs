//! `cmp-warden archive check|extract` as an operator runs it.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};

use testkit::{TarBuilder, describe_tree};

fn bin() -> Command {
    Command::new(common::bin())
}

fn good() -> Vec<u8> {
    let mut t = TarBuilder::new();
    t.dir(".")
        .dir("app")
        .file("app/a.yaml", b"a: 1\n")
        .file_mode("run.sh", b"#!/bin/sh\n", 0o755)
        .symlink("app/r", "../run.sh");
    t.tgz()
}

#[test]
fn check_accepts_from_file_and_stdin() {
    let dir = tempfile::tempdir().expect("tmp");
    let f = dir.path().join("a.tgz");
    std::fs::write(&f, good()).expect("write");
    let out = bin()
        .args(["archive", "check"])
        .arg(&f)
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = String::from_utf8(out.stdout).expect("utf8");
    assert!(
        line.starts_with("ok entries=4 files=2 dirs=1 symlinks=1 "),
        "{line}"
    );
    assert!(
        line.trim_end()
            .ends_with(&format!("sha256={}", sha(&good()))),
        "{line}"
    );

    let mut child = bin()
        .args(["archive", "check", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(&good())
        .expect("write");
    let out = child.wait_with_output().expect("wait");
    assert!(out.status.success());
}

/// The SHA-256 as coreutils computes it (not the library under test).
fn sha(b: &[u8]) -> String {
    let mut child = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("sha256sum");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(b)
        .expect("write");
    let out = child.wait_with_output().expect("sha256sum");
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .expect("digest")
        .to_owned()
}

#[test]
fn check_refuses_with_reason() {
    let mut t = TarBuilder::new();
    t.file("ok", b"x").symlink("evil", "../../etc/passwd");
    let dir = tempfile::tempdir().expect("tmp");
    let f = dir.path().join("bad.tgz");
    std::fs::write(&f, t.tgz()).expect("write");
    let out = bin()
        .args(["archive", "check"])
        .arg(&f)
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8(out.stderr).expect("utf8");
    assert!(
        err.contains(
            "rejected (policy violation): symlink target escapes the root (entry 1, name \"evil\")"
        ),
        "{err}"
    );
    assert!(out.stdout.is_empty());
}

#[test]
fn extract_creates_dir_and_refuses_non_empty() {
    let dir = tempfile::tempdir().expect("tmp");
    let f = dir.path().join("a.tgz");
    std::fs::write(&f, good()).expect("write");
    let into = dir.path().join("out/nested");
    let out = bin()
        .args(["archive", "extract", "--preserve-file-mode", "--into"])
        .arg(&into)
        .arg(&f)
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tree = describe_tree(&into);
    assert_eq!(tree.len(), 4);
    assert_eq!(
        tree["run.sh"],
        testkit::Node::File(0o755, tree_hash(b"#!/bin/sh\n"))
    );
    let again = bin()
        .args(["archive", "extract", "--into"])
        .arg(&into)
        .arg(&f)
        .output()
        .expect("run");
    assert_eq!(again.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&again.stderr).contains("destination directory is not empty"));
}

fn tree_hash(b: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(b))
}

#[test]
fn limits_and_checksum_flags() {
    let dir = tempfile::tempdir().expect("tmp");
    let f = dir.path().join("a.tgz");
    std::fs::write(&f, good()).expect("write");
    let out = bin()
        .args(["archive", "check", "--max-entries", "2"])
        .arg(&f)
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("rejected (limit exceeded): entry count limit of 2 exceeded")
    );
    let out = bin()
        .args(["archive", "check", "--sha256", &"0".repeat(64)])
        .arg(&f)
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("rejected (integrity): sha256 mismatch"));
    let out = bin()
        .args(["archive", "check", "--sha256", &sha(&good())])
        .arg(&f)
        .output()
        .expect("run");
    assert!(out.status.success());
    let out = bin()
        .args(["archive", "check", "--max-file", "lots"])
        .arg(&f)
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid quantity 'lots'"));
    let out = bin()
        .args(["archive", "check"])
        .arg(dir.path().join("missing.tgz"))
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
}
