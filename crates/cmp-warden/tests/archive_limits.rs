//! Every archive limit of a custom policy is enforced by every command that extracts an archive
//! from its policy: `serve` (through the grpc-go client, as the repo-server sends) and `render`
//! here, `appset serve` in `appset.rs`. One repository per limit, each over exactly that limit
//! and under every other; the refusal names the limit with the policy's value. A command that
//! took one of these limits from anywhere but the policy (as `render` once used the built-in
//! defaults) fails here.

#[macro_use]
mod common;

use std::path::Path;
use std::process::Command;

use common::archive_cases::{WALL_LIMITS, cases, incompressible};
use common::{Server, bin, go, plugin, write_policy};

/// Why these tests need root (printed when one skips).
const NEEDS_ROOT: &str = "archive limit tests start the confined server, which needs root";

const CAT: &str = "  generate:\n    command: [sh, -c, 'cat *.yaml']\n";

fn serve_with(edits: &[(&str, &str)]) -> (Server, tempfile::TempDir) {
    let d = tempfile::tempdir().expect("tmp");
    let policy = d.path().join("policy/policy.yaml");
    write_policy(&policy, edits);
    let s = Server::start(&plugin(CAT), &["--policy", policy.to_str().expect("utf8")]);
    (s, d)
}

#[test]
fn serve_enforces_every_archive_limit_of_its_policy() {
    needs_root!(NEEDS_ROOT);
    for case in cases() {
        let (s, _d) = serve_with(case.policy);
        let repo = tempfile::tempdir().expect("tmp");
        (case.fill)(repo.path());
        let got = go(
            &s,
            "generate",
            &["-dir", repo.path().to_str().expect("utf8")],
        );
        let (_, msg) = got.expect_err(case.name);
        assert!(
            msg.contains(case.expect),
            "{}: {msg}\n{}",
            case.name,
            s.logs()
        );
        // An honest repository passes under the same policy.
        let ok = common::repo(&[("cm.yaml", "kind: ConfigMap\n")]);
        go(&s, "generate", &["-dir", ok.path().to_str().expect("utf8")])
            .unwrap_or_else(|e| panic!("{}: honest request failed: {e:?}", case.name));
    }
}

#[test]
fn serve_enforces_the_archive_wall_clock_of_its_policy() {
    needs_root!(NEEDS_ROOT);
    let (s, _d) = serve_with(WALL_LIMITS);
    let repo = tempfile::tempdir().expect("tmp");
    std::fs::write(repo.path().join("noise.bin"), incompressible(40 << 10)).expect("write");
    // 40 chunks, 60 ms apart: receiving the archive outlives the policy's one second (the
    // archive's wall clock bounds receiving too, so a slow client holds a jail no longer).
    let got = go(
        &s,
        "generate",
        &[
            "-dir",
            repo.path().to_str().expect("utf8"),
            "-chunk-delay",
            "60ms",
        ],
    );
    let (_, msg) = got.expect_err("a slow archive");
    assert!(
        msg.contains(
            "error receiving tgz file: the archive did not arrive within 1 s (policy spec.archive.wallSeconds)"
        ),
        "{msg}\n{}",
        s.logs()
    );
    let ok = common::repo(&[("cm.yaml", "kind: ConfigMap\n")]);
    go(&s, "generate", &["-dir", ok.path().to_str().expect("utf8")]).expect("honest request");
}

fn render(repo: &Path, policy: &Path) -> std::process::Output {
    let cfg = tempfile::tempdir().expect("tmp");
    std::fs::write(cfg.path().join("plugin.yaml"), plugin(CAT)).expect("plugin");
    Command::new(bin())
        .arg("render")
        .arg(repo)
        .arg("--config-dir-path")
        .arg(cfg.path())
        .arg("--policy")
        .arg(policy)
        .output()
        .expect("render")
}

#[test]
fn render_enforces_every_archive_limit_of_its_policy() {
    needs_root!(NEEDS_ROOT);
    for case in cases() {
        let d = tempfile::tempdir().expect("tmp");
        let policy = d.path().join("policy/policy.yaml");
        write_policy(&policy, case.policy);
        let repo = tempfile::tempdir().expect("tmp");
        (case.fill)(repo.path());
        let out = render(repo.path(), &policy);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{}: rendered anyway", case.name);
        assert!(stderr.contains(case.expect), "{}: {stderr}", case.name);
        let ok = common::repo(&[("cm.yaml", "kind: ConfigMap\n")]);
        let out = render(ok.path(), &policy);
        assert!(
            out.status.success(),
            "{}: honest render failed: {}",
            case.name,
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// What Argo CD's own extractor accepts from a real checkout, through the real server: an
/// absolute link (rebased into the tree and written relative, as Argo CD writes it) and names
/// with `\` and a newline (ordinary bytes on Linux). The strict mode refuses the same archive.
#[test]
fn serve_accepts_what_argo_cd_accepts_and_strict_names_refuses_it() {
    needs_root!(NEEDS_ROOT);
    let repo = tempfile::tempdir().expect("tmp");
    let r = repo.path();
    std::fs::write(
        r.join("cm.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm\n",
    )
    .expect("write");
    std::fs::create_dir(r.join("conf")).expect("mkdir");
    std::os::unix::fs::symlink("/dev/null", r.join("conf/null")).expect("symlink");
    std::fs::write(r.join("conf/dev-x\\x2dy.service"), "unit").expect("write");
    std::fs::write(r.join("conf/new\nline"), "n").expect("write");
    // A relative target with an inner `..` that stays inside: written cleaned, as Argo CD does.
    std::os::unix::fs::symlink("../conf/../cm.yaml", r.join("conf/cm")).expect("symlink");
    let show = "  generate:\n    command: [sh, -c, 'cat cm.yaml; echo \"---\"; printf \"kind: Seen\\nlink: %s\\ninner: %s\\nfiles: %s\\n\" \"$(readlink conf/null)\" \"$(readlink conf/cm)\" \"$(set -- conf/*; echo $#)\"']\n";
    let d = tempfile::tempdir().expect("tmp");
    let policy = d.path().join("policy/policy.yaml");
    write_policy(&policy, &[]);
    let s = Server::start(&plugin(show), &["--policy", policy.to_str().expect("utf8")]);
    let dir = r.to_str().expect("utf8");
    let v = go(&s, "generate", &["-dir", dir]).expect("accepted as Argo CD accepts it");
    assert_eq!(
        v["manifests"][1], r#"{"files":4,"inner":"../cm.yaml","kind":"Seen","link":"dev/null"}"#,
        "{v}"
    );
    drop(s);
    let strict = d.path().join("strict/policy.yaml");
    write_policy(
        &strict,
        &[(
            "wallSeconds: 120",
            "wallSeconds: 120\n    strictNames: true",
        )],
    );
    let s = Server::start(&plugin(show), &["--policy", strict.to_str().expect("utf8")]);
    let (code, msg) = go(&s, "generate", &["-dir", dir]).expect_err("strict refuses");
    assert_eq!(code, common::INVALID_ARGUMENT, "{msg}");
}
