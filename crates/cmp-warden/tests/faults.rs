//! Faults, not attacks: the node's disk under the work directory fills up while a request
//! extracts. The request fails with a message that names that disk (not the request's own
//! limit, which was not reached), the server keeps serving, nothing of the request is left, and
//! the next request succeeds once there is room again.
#![allow(clippy::print_stderr)] // a skip must say why

#[macro_use]
mod common;

use std::path::Path;
use std::process::Command;

use common::*;

const NEEDS_ROOT: &str = "fault tests need root (CI runs as root): a tmpfs mount, leased UIDs";

/// `ARGOCD_ENV_MODE=fill`: write until the disk is full (`dd` fails), then print the manifest
/// (the failure is hidden from the exit code, as a careless script's would be).
const SPEC: &str = "  generate:\n    command: [sh, -c]\n    args:\n      - |\n        if [ \"$ARGOCD_ENV_MODE\" = fill ]; then dd if=/dev/zero of=fill bs=1M count=64 2>/dev/null; fi\n        cat cm.yaml\n";

/// A tmpfs of `size` at `at`, unmounted (lazily) when dropped.
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(at).expect("mkdir");
        let st = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0755"),
                "tmpfs",
            ])
            .arg(at)
            .status()
            .expect("mount");
        assert!(st.success(), "mount tmpfs at {}", at.display());
        Tmpfs(at.to_owned())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Incompressible bytes (the archive's limits are not what this test is about).
fn noise(n: usize) -> String {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            char::from(b'a' + (x % 26) as u8)
        })
        .collect()
}

#[test]
fn a_full_work_disk_fails_the_request_naming_the_disk_and_the_next_one_succeeds() {
    needs_root!(NEEDS_ROOT);
    let base = tempfile::Builder::new()
        .prefix("cmpw-disk")
        .tempdir()
        .expect("tmp");
    let work = base.path().join("work");
    let _disk = Tmpfs::mount(&work, "4m");
    // No mount namespace: the request's tree is extracted into the work directory itself (as
    // under containerd's RuntimeDefault profile), on the disk that fills.
    let pol = base.path().join("policy/policy.yaml");
    write_policy(
        &pol,
        &[(
            "namespaces: [mount, pid, net, ipc, uts, cgroup]",
            "namespaces: [pid, net, ipc, uts, cgroup]",
        )],
    );
    let s = Server::start_env(
        &plugin(SPEC),
        &["--policy", pol.to_str().expect("utf8")],
        &[("ARGOCD_CMP_WORKDIR", work.to_str().expect("utf8"))],
    );
    let big = noise(6 << 20);
    let full = repo(&[("cm.yaml", "a: 1\n"), ("big.txt", &big)]);
    let small = repo(&[("cm.yaml", "kind: ConfigMap\n")]);
    let (code, msg) = go(
        &s,
        "generate",
        &["-dir", full.path().to_str().expect("utf8")],
    )
    .expect_err("a tree larger than the work disk");
    // The disk that filled, and what changes it; not the request's own disk limit, which
    // does not apply here (mutant: the jail's WorkDisk branch removed -> no such text).
    assert_eq!(code, RESOURCE_EXHAUSTED, "{msg}");
    assert!(
        msg.contains("the work directory's disk is full")
            && msg.contains("spec.namespaces")
            && msg.contains("No space left on device")
            && !msg.contains("disk limit reached"),
        "{msg}"
    );
    s.wait_settled(1);
    let ev = s.audit_events();
    assert_eq!(ev[0]["limit"], "workDisk", "{ev:?}");
    // Nothing of the request is left, so the disk has its room back ...
    s.assert_work_dir_empties();
    let free = rustix::fs::statvfs(&work).expect("statvfs");
    assert!(
        free.f_bavail * free.f_bsize > 3 << 20,
        "the failed request's bytes stay on the work disk: {} bytes free",
        free.f_bavail * free.f_bsize
    );
    // ... and the server, still serving, answers the next request.
    let small_dir = small.path().to_str().expect("utf8");
    let v = go(&s, "generate", &["-dir", small_dir]).expect("the next request, with room again");
    assert_eq!(manifests(&v), vec![r#"{"kind":"ConfigMap"}"#]);
    // Mid-command: a command that fills the disk and hides it (its script exits 0) is not
    // served as a success with whatever it printed; the disk is named.
    let (code, msg) = go(
        &s,
        "generate",
        &["-dir", small_dir, "-env", "ARGOCD_ENV_MODE=fill"],
    )
    .expect_err("a command that filled the work disk");
    assert_eq!(code, RESOURCE_EXHAUSTED, "{msg}");
    assert!(msg.contains("the work directory's disk is full"), "{msg}");
    s.wait_settled(3);
    assert_eq!(s.audit_events()[2]["limit"], "workDisk");
    s.assert_work_dir_empties();
    go(&s, "generate", &["-dir", small_dir]).expect("served again once the tree is gone");
}
