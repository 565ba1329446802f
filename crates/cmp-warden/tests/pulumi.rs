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

use audit_event::AuditEvent;
use common::examples::*;
use common::*;

/// What a test measured, in CI's log: written past the harness's capture (as faults.rs does).
macro_rules! say {
    ($($t:tt)*) => {{
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), $($t)*);
    }};
}

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
    let plugin =
        std::fs::read_to_string(examples_dir().join("pulumi/plugin.yaml")).expect("plugin.yaml");
    start(&plugin, policy, without, port, dir)
}

/// [`server`] with the example's policy and another plugin.yaml.
fn server_with_plugin(plugin: &str, port: u16, dir: &Path) -> Server {
    start(plugin, None, &[], port, dir)
}

fn start(plugin: &str, policy: Option<&str>, without: &[&str], port: u16, dir: &Path) -> Server {
    built();
    let env = sidecar_env(port);
    let env: Vec<(&str, &str)> = env
        .iter()
        .filter(|(k, _)| !without.contains(&k.as_str()))
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
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
        plugin,
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
    render_within(s, app, "90s")
}

/// [`render`] with another deadline.
fn render_within(s: &Server, app: &str, deadline: &str) -> CallResult {
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
            deadline,
        ],
    )
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
        let e = s.last_audit_event();
        assert_eq!(e.outcome, "ok", "{e:?}");
        let init: Vec<_> = e.commands.iter().map(|c| c.argv.join(" ")).collect();
        assert!(
            init.iter()
                .any(|a| a.contains("pulumi up -f -y --non-interactive -s dev")),
            "{init:?}"
        );
        say!(
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

/// The second program (a Deployment and its Service) shows what the seed's `generate` does
/// with more than one resource: `find … -exec cat {} +` joins the rendered files with no `---`
/// between them, so the repo-server receives one YAML document whose keys repeat, of which
/// the last win: one object instead of two. The generate line of examples/pulumi/README.md
/// (each file as its own document) renders both, exactly.
#[test]
fn a_second_program_needs_documents_separated() {
    needs_root!(NEEDS_ROOT);
    let dir = tempfile::tempdir().expect("tmp");
    let (_registry, port) = registry();
    let s = server(None, &[], port, dir.path());
    let v = render(&s, "web").unwrap_or_else(|e| panic!("{e:?}\n{}", s.logs()));
    let got = manifests(&v);
    assert_eq!(
        got.len(),
        1,
        "the seed's generate: one merged object: {got:?}"
    );

    let readme = std::fs::read_to_string(examples_dir().join("pulumi/README.md")).expect("README");
    let fixed = readme
        .lines()
        .find(|l| l.trim_start().starts_with("args: [\"find ./yaml"))
        .expect("README's generate line")
        .trim()
        .to_owned();
    let plugin =
        std::fs::read_to_string(examples_dir().join("pulumi/plugin.yaml")).expect("plugin.yaml");
    let seeds = plugin
        .lines()
        .find(|l| l.trim_start().starts_with("args: [\"find ./yaml"))
        .expect("plugin.yaml's generate line")
        .trim()
        .to_owned();
    let dir2 = tempfile::tempdir().expect("tmp");
    let s2 = server_with_plugin(&plugin.replacen(&seeds, &fixed, 1), port, dir2.path());
    let v = render(&s2, "web").unwrap_or_else(|e| panic!("{e:?}\n{}", s2.logs()));
    let mut got = manifests(&v);
    got.sort();
    let expected: Vec<String> =
        std::fs::read_to_string(examples_dir().join("pulumi/expected-web.jsonl"))
            .expect("expected-web.jsonl")
            .lines()
            .map(str::to_owned)
            .collect();
    assert_eq!(got, expected);
    s2.assert_work_dir_empties();
}

/// What each of the example policy's widenings is for: without it the request fails, and
/// its error names what was refused and the field that allows it. The default policy first.
/// (`PULUMI_SKIP_UPDATE_CHECK` only saves time — without it a render took 38 s instead of 21
/// in a CI run — so it is not taken away here.)
#[test]
fn each_widening_of_the_policy_is_needed_and_named() {
    needs_root!(NEEDS_ROOT);
    let dir = tempfile::tempdir().expect("tmp");
    let (_registry, port) = registry();
    // Each request fails; its error (or, where npm retries a refused connection past the
    // deadline, its audit event) says why. `deadline`: long enough for what runs before the
    // failure (`npm ci` first, 5 s here, over 15 s on a loaded CI machine), or short where
    // the request can only end at its deadline.
    let fails = |name: &str, policy: Option<String>, deadline: &str| -> (String, AuditEvent) {
        let d = dir.path().join(name);
        let s = server(policy.as_deref(), &[], port, &d);
        let (_, msg) = render_within(&s, "pod", deadline).expect_err(name);
        let e = s.last_audit_event();
        say!("pulumi: without {name}: {msg}");
        s.assert_work_dir_empties();
        (msg, e)
    };
    // Under the default policy npm retries its refused connections for over a minute, past
    // any deadline worth waiting for here: the request's audit event says why it failed.
    let d = dir.path().join("default");
    let s = Server::start_env(
        &std::fs::read_to_string(examples_dir().join("pulumi/plugin.yaml")).expect("plugin"),
        &["--allowed-uids", "any"],
        &sidecar_env(port)
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect::<Vec<_>>(),
    );
    let (_, msg) = render_within(&s, "pod", "15s").expect_err("the default policy");
    let e = s.last_audit_event();
    say!(
        "pulumi: the default policy: {msg}; audit: {:?}, {:?}",
        e.error,
        e.seccomp_audit
    );
    assert_eq!(e.policy.name, "default");
    assert!(
        e.seccomp_audit
            .iter()
            .any(|x| x.syscall == "socket" && x.comm == "npm" && x.count > 0),
        "{:?}",
        e.seccomp_audit
    );
    s.assert_work_dir_empties();
    drop(d);

    let (msg, _) = fails(
        "spec.network.loopback",
        Some(policy_with(dir.path(), "    loopback: true\n", "")),
        "90s",
    );
    assert!(
        msg.contains("listen tcp 127.0.0.1:0: bind: permission denied")
            && msg.contains("listening on 127.0.0.1:0: Landlock refuses TCP bind under spec.network.mode allowList; spec.network.loopback: true"),
        "{msg}"
    );

    let (msg, _) = fails(
        "PULUMI_CONFIG_PASSPHRASE in spec.env.pass",
        Some(policy_with(dir.path(), " PULUMI_CONFIG_PASSPHRASE,", "")),
        "90s",
    );
    assert!(
        msg.contains("server variables not passed to commands: PULUMI_CONFIG_PASSPHRASE; spec.env.pass allows them"),
        "{msg}"
    );

    // npm's default registry, refused by the egress proxy (npm retries it past the deadline).
    let (_, e) = fails(
        "npm_config_registry in spec.env.pass",
        Some(policy_with(
            dir.path(),
            "PULUMI_SKIP_UPDATE_CHECK,\n           npm_config_registry]",
            "PULUMI_SKIP_UPDATE_CHECK]",
        )),
        "15s",
    );
    let refused: Vec<String> = e
        .egress
        .iter()
        .filter(|c| c.decision == Decision::Denied)
        .map(|c| format!("{} {:?}", c.destination, c.reason))
        .collect();
    say!("pulumi: refused: {refused:?}");
    assert!(
        refused
            .iter()
            .any(|r| r.starts_with("registry.npmjs.org:443") && r.contains("spec.network.allow")),
        "{refused:?}"
    );
}
