//! The four failures a new operator meets first, walked as docs/troubleshooting.md tells them
//! to: the request through `serve` and Argo CD's client, the end of its error, the guide's row
//! for that ending, `doctor`'s field for it, `policy suggest` on the request's audit event, and
//! the fix the guide names, after which the same request renders.
//!
//! 1. A Helm chart repository on the network (`network: none`).
//! 2. A values file outside the request's tree (Landlock).
//! 3. A token from the sidecar's environment (`spec.env.pass`).
//! 4. Too much memory for one process (`spec.limits.dataBytes`, not `memoryBytes`).
//!
//! And two the guide's rows cover that a reader mistakes for something else: a tool's
//! configuration in the sidecar's `$HOME`, and Argo CD's own deadline (not `wallSeconds`).

#[macro_use]
mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use audit_event::AuditEvent;
use common::examples::*;
use common::*;
use serde_json::Value;
use vocab::record::Limit;

const NEEDS_ROOT: &str =
    "troubleshooting tests need root (CI runs as root): leased UIDs need CAP_SETUID";

/// The guide's row for an error ending: the row whose first cell holds `key` (which must also
/// be in the last words of `msg`, where the guide tells the reader to look); its "What changes
/// it" cell.
fn guide_fix(msg: &str, key: &str) -> String {
    let tail: String = {
        let chars: Vec<char> = msg.chars().collect();
        chars[chars.len().saturating_sub(400)..].iter().collect()
    };
    assert!(
        tail.contains(key),
        "the end of the error lacks {key:?}: {msg}"
    );
    let guide = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/troubleshooting.md"),
    )
    .expect("docs/troubleshooting.md");
    let row = guide
        .lines()
        .filter(|l| l.starts_with("| `"))
        .find(|l| {
            l.split(" | ")
                .next()
                .is_some_and(|first| first.contains(key))
        })
        .unwrap_or_else(|| panic!("docs/troubleshooting.md has no row for {key:?}"));
    row.trim_end_matches(" |")
        .rsplit(" | ")
        .next()
        .expect("a last cell")
        .to_owned()
}

/// `cmp-warden doctor --json --policy POLICY` with the server's environment: the detail of
/// check `name`.
fn doctor_detail(policy: &Path, env: &[(&str, &str)], name: &str) -> String {
    let out = Command::new(bin())
        .args(["doctor", "--json", "--policy"])
        .arg(policy)
        .envs(env.iter().copied())
        .output()
        .expect("doctor");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "doctor --json: {e}: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    v["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no doctor check {name}: {v:#}"))["detail"]
        .as_str()
        .expect("detail")
        .to_owned()
}

/// `policy suggest` from the server's log (its audit events among other lines, as `kubectl
/// logs` gives them), on the policy it ran: the proposed policy file and the notes.
fn suggest(s: &Server, policy: &Path, out: &Path) -> (PathBuf, String, String) {
    let log = out.with_extension("log");
    std::fs::write(&log, s.logs()).expect("log");
    let o = policy_suggest(&log, policy, out);
    let notes = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{notes}");
    let file = out.join("policy.yaml");
    let yaml = std::fs::read_to_string(&file).expect("policy.yaml");
    (file, yaml, notes)
}

/// The last audit event of a server (a failed request's event follows its answer), read back
/// through the type the server writes it with.
fn last_event(s: &Server) -> AuditEvent {
    s.last_audit_event()
}

/// What a case starts from: an app to send, and the default policy written with this test's
/// own UID range (what doctor and suggest are given too) in a scratch directory.
struct Case {
    app: tempfile::TempDir,
    scratch: tempfile::TempDir,
    policy: PathBuf,
}

impl Case {
    fn new() -> Case {
        let scratch = tempfile::tempdir().expect("tmp");
        let policy = scratch.path().join("policy/policy.yaml");
        write_policy(&policy, &[]);
        Case {
            app: repo(&[("app.yaml", "x: 1\n")]),
            scratch,
            policy,
        }
    }

    fn dir(&self) -> &str {
        self.app.path().to_str().expect("utf8")
    }
}

fn policy_of(s: &Server) -> PathBuf {
    s.dir.path().join("policy/policy.yaml")
}

/// Helm's chart dependency from a repository, under the default `network: none`: the sockets
/// are refused and the error ends by naming the mode and the allow list; doctor says
/// `spec.network.mode: none`; `policy suggest` proposes a learning run (`allowList`, audit);
/// the fix (the example's `allowList` naming that repository) renders.
#[test]
fn a_chart_repository_on_the_network() {
    needs_root!(NEEDS_ROOT);
    assert!(
        Path::new(TOOLS).join("bin/helm").exists(),
        "{TOOLS}/bin/helm missing: run scripts/setup"
    );
    let (_repo, port) = fixture_on_any_port("helm-dependencies", "chart-repo.py");
    let placed = Placed::new("helm-dependencies", port);
    let example = placed.name();
    let t = tempfile::tempdir().expect("tmp");
    let s = example_server(example, false, &[], t.path());
    let (_, msg) = generate(&s, example).expect_err("network: none");
    assert!(
        msg.ends_with(
            "spec.network.mode is none; allowList with spec.network.allow (or egress) allows connections)"
        ),
        "{msg}"
    );
    let fix = guide_fix(&msg, "spec.network.mode is none");
    assert!(
        fix.contains("spec.network.mode: allowList") && fix.contains("spec.network.allow"),
        "{fix}"
    );
    let detail = doctor_detail(&policy_of(&s), &[], "network");
    assert!(detail.starts_with("spec.network.mode: none"), "{detail}");
    let (_, yaml, notes) = suggest(&s, &policy_of(&s), &t.path().join("suggested"));
    assert!(
        yaml.contains("mode: allowList") && yaml.contains("audit: true"),
        "{yaml}"
    );
    assert!(
        notes.contains(
            "run `policy suggest` again: it turns what the plugin reached into spec.network.allow"
        ),
        "{notes}"
    );
    drop(s);
    // The fix: allowList with the repository (the example's policy).
    let fixed = example_server(example, true, &[], &t.path().join("fixed"));
    let v = generate(&fixed, example).unwrap_or_else(|e| panic!("{e:?}\n{}", fixed.logs()));
    assert_eq!(manifests(&v), expected(example));
    let detail = doctor_detail(&t.path().join("fixed/policy.yaml"), &[], "network");
    assert!(
        detail.contains("spec.network.mode: allowList") && detail.contains("charts.example.test"),
        "{detail}"
    );
}

/// `helm template -f` a values file the sidecar's image holds outside the request's tree: the
/// error ends with the path and `spec.filesystem.readOnly`; doctor lists that field's paths;
/// `policy suggest` proposes exactly that file (from the kernel's record of the refusal); with
/// it the chart renders with those values. (Helm, a Go program, is also refused the paths Go
/// probes at start; they are not the cause and stay in the audit event: mutant, every
/// refused path listed -> the error ends with `hpage_pmd_size` and cgroup files.)
#[test]
fn a_values_file_outside_the_tree() {
    needs_root!(NEEDS_ROOT);
    let _audit =
        AuditOn::enable().unwrap_or_else(|e| panic!("kernel audit cannot be enabled here ({e})"));
    // Readable by any UID (only Landlock stands in the way), outside every readOnly path.
    let shared = tempfile::Builder::new()
        .prefix("cmpw-shared-values")
        .tempdir_in("/var/tmp")
        .expect("tmp");
    let values = shared.path().join("common.yaml");
    std::fs::write(&values, "greeting: hello-from-shared-values\n").expect("values");
    for (p, mode) in [(shared.path(), 0o755), (values.as_path(), 0o644)] {
        std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(mode))
            .expect("chmod");
    }
    let values = values.to_str().expect("utf8").to_owned();
    let cfg = plugin(&format!(
        "  generate:\n    command: [sh, -c, 'helm template \"$ARGOCD_APP_NAME\" . -f {values}']\n"
    ));
    let app = repo(&[
        ("Chart.yaml", "apiVersion: v2\nname: app\nversion: 0.1.0\n"),
        (
            "templates/cm.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: greeting\ndata:\n  greeting: {{ .Values.greeting }}\n",
        ),
    ]);
    let dir = app.path().to_str().expect("utf8");
    let path = path_with_tools();
    let env = [("PATH", path.as_str())];
    let t = tempfile::tempdir().expect("tmp");
    let pol = t.path().join("policy/policy.yaml");
    write_policy(&pol, &[]);
    let run = |policy: &Path| {
        let s = Server::start_env(&cfg, &["--policy", policy.to_str().expect("utf8")], &env);
        let r = go(
            &s,
            "generate",
            &["-dir", dir, "-env", "ARGOCD_APP_NAME=web"],
        );
        (s, r)
    };
    let (s, r) = run(&pol);
    let (_, msg) = r.expect_err("the values file is outside the file rules");
    assert!(
        msg.ends_with(&format!(
            "permission denied (the sandbox refused: fs.read_file on {values} (Landlock; spec.filesystem.readOnly (or readWrite) lists a directory above it))"
        )),
        "{msg}"
    );
    let fix = guide_fix(&msg, "(Landlock; spec.filesystem.readOnly");
    assert!(fix.contains("spec.filesystem.readOnly"), "{fix}");
    let detail = doctor_detail(&pol, &env, "filesystem");
    assert!(
        detail.contains("spec.filesystem.readOnly: /usr, ") && !detail.contains(&values),
        "{detail}"
    );
    let (suggested, yaml, notes) = suggest(&s, &pol, &t.path().join("suggested"));
    assert!(
        notes.contains(&format!("filesystem.readOnly: added {values}")),
        "{notes}"
    );
    assert!(yaml.contains(&values), "{yaml}");
    drop(s);
    // The fix: the suggested policy, which reads that one file and nothing else new.
    let (s, r) = run(&suggested);
    let v = r.unwrap_or_else(|e| panic!("{e:?}\n{}", s.logs()));
    assert!(
        manifests(&v)
            .iter()
            .any(|m| m.contains("hello-from-shared-values")),
        "{v}"
    );
    assert!(
        doctor_detail(&suggested, &env, "filesystem").contains(&values),
        "doctor shows the new path"
    );
}

/// A plugin configured by a token in the sidecar's environment: the error ends with that
/// variable's name (only it: the server's other variables are not noise at the end) and
/// `spec.env.pass`; doctor lists it as withheld; `policy suggest` passes it; with that the
/// plugin gets the token.
#[test]
fn a_token_from_the_sidecars_environment() {
    needs_root!(NEEDS_ROOT);
    let cfg = plugin(
        "  generate:\n    command: [sh, -c]\n    args:\n      - |\n        if [ -z \"$VAULT_TOKEN\" ]; then echo \"error: VAULT_TOKEN is not set\" >&2; exit 1; fi\n        echo \"{\\\"apiVersion\\\": \\\"v1\\\", \\\"kind\\\": \\\"ConfigMap\\\", \\\"metadata\\\": {\\\"name\\\": \\\"token\\\"}, \\\"data\\\": {\\\"length\\\": \\\"${#VAULT_TOKEN}\\\"}}\"\n",
    );
    let env = [
        ("VAULT_TOKEN", "s.walk-token"),
        ("AWS_CA_BUNDLE", "/etc/ssl/aws.pem"),
    ];
    let case = Case::new();
    let (dir, t, pol) = (case.dir(), &case.scratch, &case.policy);
    let s = Server::start_env(&cfg, &["--policy", pol.to_str().expect("utf8")], &env);
    let (_, msg) = go(&s, "generate", &["-dir", dir]).expect_err("no token");
    assert!(
        msg.ends_with(
            "error: VAULT_TOKEN is not set (server variables not passed to commands: VAULT_TOKEN; spec.env.pass allows them)"
        ),
        "{msg}"
    );
    let fix = guide_fix(&msg, "server variables not passed to commands");
    assert!(fix.contains("spec.env.pass"), "{fix}");
    let event = last_event(&s);
    assert!(
        event.withheld_env.iter().any(|n| n == "AWS_CA_BUNDLE"),
        "the audit event keeps the full list: {event:?}"
    );
    let detail = doctor_detail(pol, &env, "environment");
    assert!(
        detail.contains("withheld: ") && detail.contains("VAULT_TOKEN"),
        "{detail}"
    );
    let (suggested, yaml, notes) = suggest(&s, pol, &t.path().join("suggested"));
    assert!(notes.contains("env.pass: added VAULT_TOKEN"), "{notes}");
    assert!(
        !notes.contains("added AWS_CA_BUNDLE") && !yaml.contains("AWS_CA_BUNDLE"),
        "{notes}"
    );
    drop(s);
    let s = Server::start_env(&cfg, &["--policy", suggested.to_str().expect("utf8")], &env);
    let v = go(&s, "generate", &["-dir", dir]).unwrap_or_else(|e| panic!("{e:?}\n{}", s.logs()));
    assert!(
        manifests(&v)
            .iter()
            .any(|m| m.contains(&format!("\"{}\"", "s.walk-token".len()))),
        "{v}"
    );
    assert!(!s.logs().contains("s.walk-token"), "the value is logged");
    let detail = doctor_detail(&suggested, &env, "environment");
    let (passed, withheld) = detail.split_once("; withheld: ").expect("two lists");
    assert!(
        passed.contains("VAULT_TOKEN") && !withheld.contains("VAULT_TOKEN"),
        "{detail}"
    );
}

/// A generator that needs one large allocation: Python's `MemoryError` under the default
/// policy, where raising `memoryBytes` would change nothing. The error ends with
/// `spec.limits.dataBytes`, the audit event says `limit: heap`, doctor shows `DATA=` with that
/// field, and `policy suggest` doubles it (mutant: suggest warns without raising dataBytes ->
/// the fixed run fails again).
#[test]
fn too_much_memory_for_one_process() {
    needs_root!(NEEDS_ROOT);
    // calloc'ed: 1.5 GiB of address space the kernel does not back until it is touched.
    let cfg = plugin(
        "  generate:\n    command: [python3, -c]\n    args:\n      - |\n        b = bytes(1536 << 20)\n        print('{\"apiVersion\": \"v1\", \"kind\": \"ConfigMap\", \"metadata\": {\"name\": \"big\"}, \"data\": {\"bytes\": \"%d\"}}' % len(b))\n",
    );
    let case = Case::new();
    let (dir, t, pol) = (case.dir(), &case.scratch, &case.policy);
    let s = Server::start(&cfg, &["--policy", pol.to_str().expect("utf8")]);
    let (_, msg) = go(&s, "generate", &["-dir", dir]).expect_err("MemoryError");
    assert!(
        msg.contains("MemoryError")
            && msg.ends_with(
                "(an allocation was refused: each process's heap is bounded by policy spec.limits.dataBytes: 1073741824; spec.limits.memoryBytes bounds the request as a whole)"
            ),
        "{msg}"
    );
    let fix = guide_fix(&msg, "an allocation was refused");
    assert!(fix.contains("spec.limits.dataBytes"), "{fix}");
    let event = last_event(&s);
    assert_eq!(event.limit, Some(Limit::Heap), "{event:?}");
    assert_eq!(event.oom_kills, Some(0), "{event:?}");
    let detail = doctor_detail(pol, &[], "rlimits");
    assert!(
        detail.contains("DATA=1073741824 (spec.limits.dataBytes)"),
        "{detail}"
    );
    let (suggested, yaml, notes) = suggest(&s, pol, &t.path().join("suggested"));
    assert!(
        notes.contains("limits.dataBytes: 2147483648 (x2: an allocation of app"),
        "{notes}"
    );
    assert!(yaml.contains("dataBytes: 2147483648"), "{yaml}");
    drop(s);
    let s = Server::start(&cfg, &["--policy", suggested.to_str().expect("utf8")]);
    let v = go(&s, "generate", &["-dir", dir]).unwrap_or_else(|e| panic!("{e:?}\n{}", s.logs()));
    assert!(
        manifests(&v)
            .iter()
            .any(|m| m.contains(&format!("\"{}\"", 1536u64 << 20))),
        "{v}"
    );
    assert!(
        doctor_detail(&suggested, &[], "rlimits")
            .contains("DATA=2147483648 (spec.limits.dataBytes)")
    );
    drop(s);

    // A policy that bounds the address space too: the error names both per-process limits.
    let tight = t.path().join("tight/policy.yaml");
    write_policy(
        &tight,
        &[("addressSpaceBytes: 64Gi", "addressSpaceBytes: 1280Mi")],
    );
    let s = Server::start(&cfg, &["--policy", tight.to_str().expect("utf8")]);
    let (_, msg) = go(&s, "generate", &["-dir", dir]).expect_err("MemoryError");
    assert!(
        msg.ends_with(
            "(an allocation was refused: each process's heap is bounded by policy spec.limits.dataBytes: 1073741824 and its address space by spec.limits.addressSpaceBytes: 1342177280; spec.limits.memoryBytes bounds the request as a whole)"
        ),
        "{msg}"
    );
}

/// A tool's configuration in the sidecar's `$HOME`: each request has a `HOME` of its own, so
/// the tool finds nothing there. The error is the tool's own "No such file or directory"; the
/// guide's row for it, and doctor's `filesystem` check, say that `HOME` and `/tmp` are the
/// request's; the fix the guide names (the file under a `readOnly` path, the tool pointed there
/// by a passed variable) renders with it.
#[test]
fn a_tool_config_in_the_sidecars_home() {
    needs_root!(NEEDS_ROOT);
    let image = tempfile::Builder::new()
        .prefix("cmpw-sidecar-home")
        .tempdir_in("/var/tmp")
        .expect("tmp");
    let config = image.path().join(".config/tool.yaml");
    std::fs::create_dir_all(config.parent().expect("dir")).expect("mkdir");
    std::fs::write(&config, "from-the-image").expect("config");
    for (p, mode) in [
        (image.path().to_path_buf(), 0o755),
        (image.path().join(".config"), 0o755),
        (config.clone(), 0o644),
    ] {
        std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(mode))
            .expect("chmod");
    }
    let home = image.path().to_str().expect("utf8");
    let config = config.to_str().expect("utf8");
    let cfg = plugin(
        "  generate:\n    command: [sh, -c]\n    args:\n      - |\n        v=$(cat \"${TOOL_CONFIG:-$HOME/.config/tool.yaml}\") || exit 1\n        echo \"{\\\"apiVersion\\\": \\\"v1\\\", \\\"kind\\\": \\\"ConfigMap\\\", \\\"metadata\\\": {\\\"name\\\": \\\"tool\\\"}, \\\"data\\\": {\\\"config\\\": \\\"$v\\\"}}\"\n",
    );
    let case = Case::new();
    let (dir, t, pol) = (case.dir(), &case.scratch, &case.policy);
    let s = Server::start_env(
        &cfg,
        &["--policy", pol.to_str().expect("utf8")],
        &[("HOME", home)],
    );
    let (_, msg) = go(&s, "generate", &["-dir", dir]).expect_err("not in the request's HOME");
    assert!(
        msg.ends_with("/.config/tool.yaml: No such file or directory") && !msg.contains(home),
        "{msg}"
    );
    let fix = guide_fix(&msg, "No such file or directory");
    assert!(
        fix.contains("spec.filesystem.readOnly") && fix.contains("spec.env.pass"),
        "{fix}"
    );
    let detail = doctor_detail(pol, &[("HOME", home)], "filesystem");
    assert!(
        detail.contains("besides the request's own tree, HOME and /tmp"),
        "{detail}"
    );
    drop(s);
    // The fix: the file readable where the image has it, the tool pointed there.
    let fixed = t.path().join("fixed/policy.yaml");
    write_policy(
        &fixed,
        &[
            ("readOnly: [/usr, ", &format!("readOnly: [{config}, /usr, ")),
            ("pass: [", "pass: [TOOL_CONFIG, "),
        ],
    );
    let s = Server::start_env(
        &cfg,
        &["--policy", fixed.to_str().expect("utf8")],
        &[("HOME", home), ("TOOL_CONFIG", config)],
    );
    let v = go(&s, "generate", &["-dir", dir]).unwrap_or_else(|e| panic!("{e:?}\n{}", s.logs()));
    assert!(
        manifests(&v).iter().any(|m| m.contains("from-the-image")),
        "{v}"
    );
}

/// Argo CD's own deadline ends a slow request before the policy's wall clock: the user sees
/// only `context deadline exceeded`; the audit event says `limit: clientDeadline` (mutant: the
/// client's deadline audited as the policy's `timeout`); the guide's row names Argo CD's
/// timeouts, not `wallSeconds`; doctor's `limits` says so beside `wallSeconds`; a longer
/// client deadline is the fix.
#[test]
fn argo_cds_own_deadline() {
    needs_root!(NEEDS_ROOT);
    let cfg = plugin(
        "  generate:\n    command: [sh, -c, 'sleep 3; echo \"{\\\"apiVersion\\\": \\\"v1\\\", \\\"kind\\\": \\\"ConfigMap\\\", \\\"metadata\\\": {\\\"name\\\": \\\"slow\\\"}}\"']\n",
    );
    let case = Case::new();
    let (dir, pol) = (case.dir(), &case.policy);
    let s = Server::start(&cfg, &["--policy", pol.to_str().expect("utf8")]);
    let (code, msg) =
        go(&s, "generate", &["-dir", dir, "-timeout", "1s"]).expect_err("the client's deadline");
    assert_eq!(code, DEADLINE_EXCEEDED, "{msg}");
    let fix = guide_fix(&msg, "context deadline exceeded");
    assert!(
        fix.contains("controller.repo.server.timeout.seconds")
            && fix.contains("`spec.limits.wallSeconds` does not lengthen it"),
        "{fix}"
    );
    let event = last_event(&s);
    assert_eq!(event.limit, Some(Limit::ClientDeadline), "{event:?}");
    let detail = doctor_detail(pol, &[], "limits");
    assert!(
        detail.contains("wallSeconds=300")
            && detail.contains(
                "the client's deadline (Argo CD's controller.repo.server.timeout.seconds)"
            ),
        "{detail}"
    );
    let v = go(&s, "generate", &["-dir", dir, "-timeout", "20s"])
        .unwrap_or_else(|e| panic!("{e:?}\n{}", s.logs()));
    assert_eq!(manifests(&v).len(), 1, "{v}");
}
