//! `cmp-warden doctor`: a true account of this machine as root and as an unprivileged user,
//! a refusal (exit 1, saying what) whenever the policy requires something missing, and the
//! same report logged by `serve` at start-up.

#![allow(clippy::print_stderr)]

#[macro_use]
mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};

use common::{Server, bin, plugin, selected_policy, write_policy};
use serde_json::Value;

/// Why these tests need root (printed when one skips).
const NEEDS_ROOT: &str = "doctor tests compare root and unprivileged runs (CI runs as root)";

fn doctor(prefix: &[&str], args: &[&str], env: &[(&str, &str)]) -> (Output, Value) {
    let mut cmd = if prefix.is_empty() {
        Command::new(bin())
    } else {
        let mut c = Command::new(prefix[0]);
        c.args(&prefix[1..]).arg(bin());
        c
    };
    let out = cmd
        .args(["doctor", "--json"])
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("run doctor");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "doctor --json is not JSON ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out, v)
}

fn check<'a>(v: &'a Value, name: &str) -> &'a Value {
    v["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no check {name} in {v:#}"))
}

fn assert_check(v: &Value, name: &str, available: bool, required: bool, status: &str) {
    let c = check(v, name);
    assert_eq!(
        (
            c["available"].as_bool(),
            c["required"].as_bool(),
            c["status"].as_str()
        ),
        (Some(available), Some(required), Some(status)),
        "{name}: {c:#}"
    );
}

const UNPRIVILEGED: &[&str] = &[
    "setpriv",
    "--reuid=65000",
    "--regid=65000",
    "--clear-groups",
    "--inh-caps=-all",
];

/// A policy directory readable by the unprivileged UID.
fn policy_dir(edits: &[(&str, &str)]) -> (tempfile::TempDir, std::path::PathBuf) {
    let d = tempfile::Builder::new()
        .prefix("cmpw-doctor")
        .tempdir()
        .expect("tmp");
    let p = d.path().join("policy.yaml");
    write_policy(&p, edits);
    for sub in [d.path().to_path_buf(), d.path().join("seccomp")] {
        std::fs::set_permissions(&sub, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    (d, p)
}

#[test]
fn as_root_every_protection_is_enforced_and_serve_would_start() {
    needs_root!(NEEDS_ROOT);
    let (out, v) = doctor(&[], &[], &[]);
    assert!(out.status.success(), "{v:#}");
    assert_eq!(v["schema"], "cmp-warden.doctor/v1");
    assert_eq!(v["verdict"], "start");
    assert!(v["refusal"].is_null());
    assert_eq!(v["policy"], "default");
    assert_eq!(v["policySha256"].as_str().map(str::len), Some(64));
    assert_eq!(v["commit"].as_str(), Some(head_commit().0.as_str()));
    assert_eq!(v["privilegeModel"], "minimalCapsRoot");
    assert_eq!(v["euid"], 0);
    let kept: Vec<&str> = v["capabilitiesKept"]
        .as_array()
        .expect("kept")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(kept, ["CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP"]);
    for (name, required) in [
        ("uniqueUid", true),
        ("capabilities", true),
        ("noNewPrivs", true),
        ("landlock", true),
        ("seccomp", true),
        ("rlimits", true),
        ("cgroups", false),
        ("landlockNetwork", false),
        ("diskLimit", false),
    ] {
        assert_check(&v, name, true, required, "enforced");
    }
    for ns in ["user", "mount", "pid", "net", "ipc", "uts", "cgroup"] {
        assert_check(&v, &format!("namespace.{ns}"), true, false, "enforced");
    }
    // The probe's own /proc status lines prove the capability claim.
    let caps = check(&v, "capabilities")["detail"].as_str().unwrap_or("");
    for set in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert!(caps.contains(&format!("{set}: 0000000000000000")), "{caps}");
    }
    let ll = check(&v, "landlock")["detail"].as_str().unwrap_or("");
    assert!(ll.contains("kernel ABI 7"), "{ll}");
    assert!(
        ll.contains("net:ConnectTcp") && ll.contains("scope:Signal"),
        "{ll}"
    );
    let cg = check(&v, "cgroups")["detail"].as_str().unwrap_or("");
    assert!(
        cg.contains("cgroup v1") && cg.contains("memory, pids, cpu"),
        "{cg}"
    );
    // What the kernel holds for the probe's own request cgroup, read back after it ran there,
    // each with the policy field that sets it (mutant: the kernel's values alone).
    for held in [
        "read back: memory.limit_in_bytes=1073741824 (spec.limits.memoryBytes)",
        "pids.max=512 (spec.limits.pids)",
        "cpu.cfs_quota_us=200000, cpu.cfs_period_us=100000 (spec.limits.cpuMillis)",
    ] {
        assert!(cg.contains(held), "{held} in {cg}");
    }
    let rl = check(&v, "rlimits")["detail"].as_str().unwrap_or("");
    // Each with the policy field an operator changes it by (mutant: the values alone).
    assert!(
        rl.contains("CORE=0")
            && rl.contains("NOFILE=4096 (spec.limits.openFiles)")
            && rl.contains("DATA=1073741824 (spec.limits.dataBytes)"),
        "{rl}"
    );
    // This VM's root filesystem is writable, and doctor says so.
    assert_check(&v, "readOnlyRootFilesystem", false, false, "unavailable");
    // The tree cache's keeper started as `serve` starts it (and stopped with doctor).
    assert_check(&v, "treeCache", true, false, "info");
    let tc = check(&v, "treeCache")["detail"].as_str().unwrap_or("");
    assert_eq!(
        tc,
        "on (512 MiB of sealed trees; the keeper and each filler confined by Landlock, required, and seccomp)"
    );

    // The text form says the same.
    let text = Command::new(bin()).arg("doctor").output().expect("doctor");
    assert!(text.status.success());
    let t = String::from_utf8_lossy(&text.stdout);
    assert!(t.contains("verdict: serve would START"), "{t}");
    assert!(
        t.lines()
            .any(|l| l.starts_with("uniqueUid") && l.contains("enforced")),
        "{t}"
    );
}

/// Every field `doctor --json` writes is in docs/audit.md's example of the format, and every
/// check it runs is in the doc's list of stable check names (mutant: a field or check the
/// doc leaves out, as `gaps` and `environment` were).
#[test]
fn every_doctor_field_and_check_is_documented() {
    needs_root!(NEEDS_ROOT);
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/audit.md"))
            .expect("docs/audit.md");
    let section = doc
        .split("## Audit events")
        .next()
        .expect("the doctor section");
    let example = section
        .split("```json")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("the doctor JSON example");
    let documented: Value = serde_json::from_str(example).expect("the example parses");
    // A policy directory adds `selected`: run with one, so every optional field is there.
    let pol = tempfile::tempdir().expect("tmp");
    write_policy(&pol.path().join("default.yaml"), &[]);
    let default = std::fs::read_to_string(pol.path().join("default.yaml")).expect("read");
    let team = selected_policy(&default, "team-a", "team-a");
    std::fs::write(pol.path().join("team-a.yaml"), team).expect("write");
    let (out, v) = doctor(&[], &["--policy", pol.path().to_str().expect("utf8")], &[]);
    assert!(out.status.success(), "{v:#}");
    let missing: Vec<&String> = v
        .as_object()
        .expect("object")
        .keys()
        .filter(|k| documented.get(k.as_str()).is_none())
        .collect();
    assert!(
        missing.is_empty(),
        "not in docs/audit.md's example: {missing:?}"
    );
    for c in v["checks"].as_array().expect("checks") {
        let name = c["name"].as_str().expect("name");
        let listed = match name.strip_prefix("namespace.") {
            Some(ns) => {
                section.contains("`namespace.user|mount|pid|net|ipc|uts|cgroup`")
                    && ["user", "mount", "pid", "net", "ipc", "uts", "cgroup"].contains(&ns)
            }
            None => section.contains(&format!("`{name}`")),
        };
        assert!(
            listed,
            "check {name} is not in docs/audit.md's stable names"
        );
    }
}

/// doctor says what the network policy lets commands reach, in its fields' names (mutant:
/// no `network` check -> "no check network").
#[test]
fn doctor_shows_the_network_policy_with_its_fields() {
    needs_root!(NEEDS_ROOT);
    let pol = tempfile::tempdir().expect("tmp");
    let file = pol.path().join("policy.yaml");
    write_policy(
        &file,
        &[(
            "network: {mode: none}",
            "network: {mode: allowList, allow: [{host: vault.example, ports: [8200]}, {host: charts.example.test, ports: [443], internal: true}], hosts: {charts.example.test: [127.0.0.1]}}",
        )],
    );
    let (out, v) = doctor(&[], &["--policy", file.to_str().expect("utf8")], &[]);
    assert!(out.status.success(), "{v:#}");
    assert_eq!(
        check(&v, "network")["detail"],
        "spec.network.mode: allowList, through the egress proxy; spec.network.allow: vault.example:8200, charts.example.test:443 (internal); spec.network.hosts: charts.example.test -> 127.0.0.1"
    );
    let (_, v) = doctor(&[], &[], &[]);
    assert_eq!(
        check(&v, "network")["detail"],
        "spec.network.mode: none: commands get no network (no inet socket; loopback only)"
    );
}

#[test]
fn unprivileged_with_the_default_policy_refuses_and_says_why() {
    needs_root!(NEEDS_ROOT);
    let (out, v) = doctor(UNPRIVILEGED, &[], &[]);
    assert_eq!(out.status.code(), Some(1), "{v:#}");
    assert_eq!(v["verdict"], "refuse");
    assert_eq!(v["privilegeModel"], "unprivileged");
    let why = v["refusal"].as_str().expect("refusal");
    assert!(
        why.contains("requires uniqueUid") && why.contains("cannot switch UIDs"),
        "{why}"
    );
    assert_check(&v, "uniqueUid", false, true, "unavailable");
    // What still works is still reported as such.
    assert_check(&v, "landlock", true, true, "enforced");
    assert_check(&v, "seccomp", true, true, "enforced");
    assert_check(&v, "noNewPrivs", true, true, "enforced");
    assert_check(&v, "cgroups", false, false, "unavailable");
    let text = Command::new(UNPRIVILEGED[0])
        .args(&UNPRIVILEGED[1..])
        .arg(bin())
        .arg("doctor")
        .output()
        .expect("doctor");
    assert_eq!(text.status.code(), Some(1));
    let t = String::from_utf8_lossy(&text.stdout);
    assert!(
        t.contains("verdict: serve would REFUSE to start: policy \"default\" requires uniqueUid"),
        "{t}"
    );
}

#[test]
fn unprivileged_with_a_policy_that_accepts_a_shared_uid_would_start() {
    needs_root!(NEEDS_ROOT);
    let (_d, p) = policy_dir(&[(
        "require: [uniqueUid, noNewPrivs, landlock, seccomp]",
        "require: [noNewPrivs, landlock, seccomp]",
    )]);
    let (out, v) = doctor(UNPRIVILEGED, &["--policy", p.to_str().expect("utf8")], &[]);
    assert!(out.status.success(), "{v:#}");
    assert_eq!(v["verdict"], "start");
    assert_check(&v, "uniqueUid", false, false, "unavailable");
    assert_check(&v, "landlock", true, true, "enforced");
    // No leased UIDs here: the tree cache cannot lend trees, and doctor says why.
    assert_check(&v, "treeCache", false, false, "info");
    let tc = check(&v, "treeCache")["detail"].as_str().unwrap_or("");
    assert!(tc.starts_with("off: "), "{tc}");
}

/// `spec.cache.enabled: false` is reported as the policy's choice.
#[test]
fn a_policy_without_the_tree_cache_says_so() {
    needs_root!(NEEDS_ROOT);
    let (_d, p) = policy_dir(&[(
        "cache: {enabled: true, bytes: 512Mi}",
        "cache: {enabled: false, bytes: 512Mi}",
    )]);
    let (out, v) = doctor(&[], &["--policy", p.to_str().expect("utf8")], &[]);
    assert!(out.status.success(), "{v:#}");
    assert_check(&v, "treeCache", false, false, "info");
    assert_eq!(
        check(&v, "treeCache")["detail"],
        "off in the policy (spec.cache.enabled: false)"
    );
}

#[test]
fn a_required_protection_that_is_missing_makes_doctor_fail() {
    needs_root!(NEEDS_ROOT);
    // cgroups required, but the configured delegated directory does not exist.
    let (_d, p) = policy_dir(&[(
        "require: [uniqueUid, noNewPrivs, landlock, seccomp]",
        "require: [uniqueUid, noNewPrivs, landlock, seccomp, cgroups]",
    )]);
    let missing = "/sys/fs/cgroup/does-not-exist-cmpw";
    let (out, v) = doctor(
        &[],
        &["--policy", p.to_str().expect("utf8")],
        &[("CMP_WARDEN_CGROUP_ROOT", missing)],
    );
    assert_eq!(out.status.code(), Some(1), "{v:#}");
    let why = v["refusal"].as_str().expect("refusal");
    assert!(why.contains("requires cgroups"), "{why}");
    assert_check(&v, "cgroups", false, true, "unavailable");
    assert_check(&v, "uniqueUid", true, true, "enforced");

    // Unprivileged: cgroups cannot be created at all.
    let (out, v) = doctor(UNPRIVILEGED, &["--policy", p.to_str().expect("utf8")], &[]);
    assert_eq!(out.status.code(), Some(1), "{v:#}");
    let why = v["refusal"].as_str().expect("refusal");
    assert!(why.contains("requires uniqueUid"), "{why}");

    // Namespaces required while the policy's network mode keeps the host network: still
    // fine (net is not asked for) — but a malformed policy is a usage error (2).
    let bad = p.with_file_name("bad.yaml");
    std::fs::write(&bad, "apiVersion: x\n").expect("write");
    let out = Command::new(bin())
        .args(["doctor", "--policy"])
        .arg(&bad)
        .output()
        .expect("doctor");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("policy"));
}

#[test]
fn serve_logs_the_same_report_once_at_start_up() {
    needs_root!(NEEDS_ROOT);
    let mut s = Server::start(&plugin("  generate:\n    command: [echo, '{}']\n"), &[]);
    // The socket is bound before the probe runs: wait for the report.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !s.logs().contains("\"doctor report\"") && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let logs = s.logs();
    let lines: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("\"doctor report\""))
        .collect();
    assert_eq!(lines.len(), 1, "{logs}");
    let ev: Value = serde_json::from_str(lines[0]).expect("json log line");
    let report: Value =
        serde_json::from_str(ev["report"].as_str().expect("report field")).expect("report is JSON");
    assert_eq!(report["schema"], "cmp-warden.doctor/v1");
    assert_eq!(report["verdict"], "start");
    assert_check(&report, "uniqueUid", true, true, "enforced");
    assert_check(&report, "seccomp", true, true, "enforced");
    let sock = check(&report, "socketDirectory");
    assert!(
        sock["detail"]
            .as_str()
            .is_some_and(|d| d.contains(s.sock.parent().and_then(Path::to_str).unwrap_or("?"))),
        "{sock:#}"
    );
    assert!(s.stop().success());
}

/// The checkout's HEAD as build.rs names it: (12-hex commit, its committer date).
fn head_commit() -> (String, String) {
    let git = |args: &[&str]| {
        let out = Command::new("git")
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .expect("git");
        assert!(out.status.success(), "git {args:?}");
        String::from_utf8(out.stdout)
            .expect("utf8")
            .trim()
            .to_owned()
    };
    (
        git(&["rev-parse", "--short=12", "HEAD"]),
        git(&["show", "-s", "--format=%cs", "HEAD"]),
    )
}

/// `--version` names the commit the binary was built from and that commit's date (not the
/// build's, so two builds of one commit are the same bytes), as doctor's `commit` does.
#[test]
fn the_version_names_the_commit_it_was_built_from() {
    let (commit, date) = head_commit();
    for flag in ["--version", "-V"] {
        let out = Command::new(bin()).arg(flag).output().expect("run");
        assert!(out.status.success());
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            format!(
                "cmp-warden {} (commit {commit}, {date})\n",
                env!("CARGO_PKG_VERSION")
            )
        );
    }
}

/// One version for the binary, the Helm chart (its version and appVersion, which is the image
/// tag the chart deploys by default), the image every manifest of deploy/ names, and
/// CHANGELOG.md.
#[test]
fn one_version_names_the_binary_the_chart_and_the_changelog() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let v = env!("CARGO_PKG_VERSION");
    let chart = std::fs::read_to_string(root.join("deploy/helm/cmp-warden/Chart.yaml"))
        .expect("Chart.yaml");
    let field = |name: &str| {
        chart
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|s| s.trim().trim_matches('"').to_owned())
            .unwrap_or_else(|| panic!("{name} in Chart.yaml"))
    };
    assert_eq!(field("version:"), v);
    assert_eq!(field("appVersion:"), v);
    let mut images = 0;
    for dir in [
        "deploy/components/cmp-warden",
        "deploy/services/cmp",
        "deploy/services/appset",
        "deploy/helm",
    ] {
        for f in std::fs::read_dir(root.join(dir))
            .expect("deploy dir")
            .flatten()
        {
            let text = std::fs::read_to_string(f.path()).unwrap_or_default();
            for tag in text
                .lines()
                .filter_map(|l| l.trim().strip_prefix("image: cmp-warden:"))
            {
                assert_eq!(tag, v, "{}", f.path().display());
                images += 1;
            }
        }
    }
    assert!(images >= 5, "{images} images found in deploy/");
    let changelog = std::fs::read_to_string(root.join("CHANGELOG.md")).expect("CHANGELOG.md");
    assert!(
        changelog.lines().any(|l| l == format!("## {v}")),
        "CHANGELOG.md has no `## {v}` section"
    );
}

/// `scripts/sbom`: every crate the static binary links (cargo's own tree of normal
/// dependencies for the musl target), each registry crate with Cargo.lock's SHA-256, and the
/// same bytes twice (the commit's date, not the clock).
#[test]
fn the_sbom_lists_every_crate_the_static_binary_links() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let run = || {
        let out = Command::new(root.join("scripts/sbom"))
            .current_dir(&root)
            .output()
            .expect("scripts/sbom");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    };
    let first = run();
    assert_eq!(first, run(), "the SBOM is not reproducible");
    let bom: Value = serde_json::from_slice(&first).expect("JSON");
    assert_eq!(bom["bomFormat"], "CycloneDX");
    assert_eq!(bom["specVersion"], "1.5");
    let (commit, _) = head_commit();
    assert!(
        bom["metadata"]["component"]["description"]
            .as_str()
            .is_some_and(|d| d.contains(&commit[..12])),
        "{}",
        bom["metadata"]
    );
    let listed: std::collections::BTreeSet<String> = bom["components"]
        .as_array()
        .expect("components")
        .iter()
        .map(|c| {
            let name = c["name"].as_str().expect("name");
            if !name.starts_with("cmp-warden") {
                let sha = c["hashes"][0]["content"].as_str().unwrap_or_default();
                assert_eq!(sha.len(), 64, "{c}");
            }
            format!("{name} v{}", c["version"].as_str().expect("version"))
        })
        .collect();
    let tree = Command::new("cargo")
        .args([
            "tree",
            "--locked",
            "-e",
            "normal",
            "-p",
            "cmp-warden",
            "--target",
            "x86_64-unknown-linux-musl",
            "--prefix",
            "none",
        ])
        .current_dir(&root)
        .output()
        .expect("cargo tree");
    assert!(tree.status.success());
    let linked: std::collections::BTreeSet<String> = String::from_utf8_lossy(&tree.stdout)
        .lines()
        .map(|l| {
            let mut w = l.split_whitespace();
            format!("{} {}", w.next().unwrap_or(""), w.next().unwrap_or(""))
        })
        .filter(|l| !l.starts_with("cmp-warden v") && l.trim() != "")
        .collect();
    assert_eq!(listed, linked);
}
