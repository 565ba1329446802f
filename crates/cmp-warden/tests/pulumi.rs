//! The fifth seed, pulumi-argocd-plugin, through the real server and Argo CD's own client: its
//! plugin.yaml's `init` (`npm ci`, `pulumi login --local`, `pulumi down`, `pulumi up`) and
//! `generate` (`find ./yaml … -exec cat`) unchanged, on the seed's TypeScript program (one Pod)
//! and a second one (a Deployment and its Service), with the Pulumi CLI, its Node.js language
//! host and the Kubernetes provider built from their Go modules (scripts/pulumi-build) and
//! installed where an image has them, under /opt. Each program renders twice in a row under
//! examples/pulumi/policy.yaml; the default policy cannot run it, and each of the example
//! policy's widenings, taken away, ends the request with an error that names it.

#[macro_use]
mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use common::examples::*;
use common::*;
use server::audit::AuditEvent;

const NEEDS_ROOT: &str = "pulumi tests need root (CI runs as root): leased UIDs need CAP_SETUID";

/// Where the tests install the image's /opt/pulumi (inside /opt, read-only to the jail, as in
/// the image).
const INSTALL: &str = "/opt/cmp-warden-tools/pulumi";

/// The port examples/pulumi/policy.yaml and README.md give the registry; the tests' stand-in
/// listens on a free port instead, written over this one.
const EXAMPLE_PORT: &str = "4873";

/// The sidecar's environment as examples/pulumi/README.md gives it, with the image's path
/// replaced by [`INSTALL`] and the registry's port by the stand-in's; PULUMI_ACCESS_TOKEN is
/// set as in the seed's sidecar.
fn sidecar_env(port: u16) -> Vec<(String, String)> {
    let path = format!("{INSTALL}/bin:{}", path_with_tools());
    vec![
        ("PATH".into(), path),
        ("PULUMI_CONFIG_PASSPHRASE".into(), "argocd-render".into()),
        ("PULUMI_SKIP_UPDATE_CHECK".into(), "true".into()),
        ("PULUMI_ACCESS_TOKEN".into(), "pul-not-for-commands".into()),
        (
            "npm_config_registry".into(),
            format!("http://npm.example.test:{port}/"),
        ),
        ("npm_config_ignore_scripts".into(), "true".into()),
    ]
}

/// scripts/pulumi-build (once per test binary): its bin/ installed into [`INSTALL`]; the
/// directory of its npm packages.
fn built() -> &'static Path {
    static ONCE: OnceLock<PathBuf> = OnceLock::new();
    ONCE.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let run = |args: &[&str]| {
            let out = Command::new(root.join("scripts/pulumi-build"))
                .args(args)
                .output()
                .expect("scripts/pulumi-build");
            assert!(
                out.status.success(),
                "scripts/pulumi-build failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8_lossy(&out.stdout).trim().to_owned()
        };
        run(&["--install", INSTALL]);
        PathBuf::from(run(&[])).join("npm-packages")
    })
}

/// The stand-in registry (fixtures/npm-registry.py) on a free port, and that port.
fn registry() -> (Fixture, u16) {
    let packages = built();
    let mut child = Command::new("python3")
        .arg(examples_dir().join("pulumi/fixtures/npm-registry.py"))
        .arg("0")
        .arg(packages)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("npm-registry.py");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("port line");
    let port: u16 = line.trim().parse().expect("a port");
    (Fixture::listening(child, port, "npm-registry.py"), port)
}

/// A server for the example with `policy` (the example's, or a variant of its text), the
/// sidecar's environment less the variables named in `without`, reaching the registry on
/// `port`.
fn server(policy: Option<&str>, without: &[&str], port: u16, dir: &Path) -> Server {
    built();
    let env = sidecar_env(port);
    let env: Vec<(&str, &str)> = env
        .iter()
        .filter(|(k, _)| !without.contains(&k.as_str()))
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let plugin = std::fs::read_to_string(examples_dir().join("pulumi/plugin.yaml"))
        .expect("plugin.yaml");
    let p = example_policy("pulumi", dir);
    let text = match policy {
        Some(t) => t.to_owned(),
        None => std::fs::read_to_string(&p).expect("policy"),
    };
    std::fs::write(
        &p,
        text.replace(
            &format!("ports: [{EXAMPLE_PORT}]"),
            &format!("ports: [{port}]"),
        ),
    )
    .expect("write policy");
    Server::start_env(
        &plugin,
        &[
            "--policy",
            p.to_str().expect("utf8"),
            "--allowed-uids",
            "any",
        ],
        &env,
    )
}

/// The example policy's text as the test runs it (its own UID range), with `from` → `to`.
fn policy_with(dir: &Path, from: &str, to: &str) -> String {
    let p = example_policy("pulumi", dir);
    let text = std::fs::read_to_string(p).expect("policy");
    assert!(text.contains(from), "fixture: {from}");
    text.replacen(from, to, 1)
}

/// `generate` for the program in repo/`app` through the grpc-go client, with Argo CD's own
/// time limit for a plugin (ARGOCD_EXEC_TIMEOUT's default, 90 s) as its deadline.
fn render(s: &Server, app: &str) -> CallResult {
    let repo = examples_dir().join("pulumi/repo");
    go(
        s,
        "generate",
        &[
            "-dir",
            repo.to_str().expect("utf8"),
            "-app-rel-path",
            app,
            "-app",
            app,
            "-timeout",
            "90s",
        ],
    )
}

/// The last audit event, read through the server's own type.
fn last_event(s: &Server) -> AuditEvent {
    let v = s.audit_events().pop().expect("an audit event");
    serde_json::from_value(v).expect("an AuditEvent")
}

/// The seed's Pod: Pulumi names it `my-pod-` and eight random hex digits (auto-naming), so
/// the name is checked by its shape and the rest of the object exactly.
fn the_seeds_pod(manifests: &[String]) -> String {
    assert_eq!(manifests.len(), 1, "{manifests:?}");
    let mut pod: serde_json::Value = serde_json::from_str(&manifests[0]).expect("json");
    let name = pod["metadata"]["name"].as_str().expect("name").to_owned();
    assert!(
        name.len() == "my-pod-".len() + 8
            && name.starts_with("my-pod-")
            && name["my-pod-".len()..]
                .chars()
                .all(|c| c.is_ascii_hexdigit()),
        "{name}"
    );
    pod["metadata"]["name"] = "my-pod-XXXXXXXX".into();
    let expected = std::fs::read_to_string(examples_dir().join("pulumi/expected.jsonl"))
        .expect("expected.jsonl");
    assert_eq!(pod.to_string(), expected.trim_end(), "{}", manifests[0]);
    name
}

#[test]
fn the_seeds_plugin_renders_its_program_twice_in_a_row() {
    needs_root!(NEEDS_ROOT);
    let dir = tempfile::tempdir().expect("tmp");
    let (_registry, port) = registry();
    let s = server(None, &[], port, dir.path());
    let mut names = Vec::new();
    for round in 1..=2 {
        let v = render(&s, "pod").unwrap_or_else(|e| panic!("round {round}: {e:?}\n{}", s.logs()));
        names.push(the_seeds_pod(&manifests(&v)));
        let e = last_event(&s);
        assert_eq!(e.outcome, "ok", "{e:?}");
        let init: Vec<_> = e.commands.iter().map(|c| c.argv.join(" ")).collect();
        assert!(init.iter().any(|a| a.contains("pulumi up -f -y --non-interactive -s dev")), "{init:?}");
        println!(
            "pulumi: round {round}: {} ms, peak memory {:?} of the policy's 1Gi, the Pod named {}",
            e.duration_ms,
            e.peak_memory_bytes,
            names.last().expect("name")
        );
    }
    // Each request starts from the repository's tree and a fresh home: the committed stack
    // is empty, so `pulumi down` has nothing to destroy and `pulumi up` creates the Pod anew,
    // under a new random name (as the seed's own down-then-up does on every refresh).
    assert_ne!(names[0], names[1]);
    s.assert_work_dir_empties();
}
