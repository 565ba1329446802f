//! One sidecar, many tenants: a policy directory whose `team-a` policy (selected by Argo CD's
//! `ARGOCD_APP_PROJECT_NAME`) passes a token and allows one destination, through the real
//! server with the entries Argo CD's repo-server sends. `team-b`, an unknown project and a
//! request that names `team-a` only through what an application's author controls
//! (`ARGOCD_ENV_*`, parameters) get neither; each audit event names its policy.

#[macro_use]
mod common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::Path;

use common::*;

const NEEDS_ROOT: &str = "tenant tests need root (CI runs as root): leased UIDs need CAP_SETUID";

/// What the plugin reports: the token it sees, and whether team A's secret store answered.
const PLUGIN: &str = r#"
import json, os, urllib.request
out = {"token": os.environ.get("TEAM_A_VAULT_TOKEN", "<none>")}
url = "http://vault.team-a.test:%s/v1/secret" % os.environ["ARGOCD_ENV_PORT"]
try:
    out["reached"] = urllib.request.urlopen(url, timeout=5).read().decode()
except Exception as e:
    out["reached"] = "failed: %s" % e
print(json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "tenant"}, "data": out}))
"#;

/// A stand-in for team A's secret store: answers every request with `team-a-secret`.
fn secret_store() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = l.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for mut c in l.incoming().flatten() {
            let mut buf = [0u8; 4096];
            let _ = c.read(&mut buf);
            let _ = c.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Length: 13\r\nConnection: close\r\n\r\nteam-a-secret",
            );
        }
    });
    port
}

/// The default policy (as the tests write it) in `dir/default.yaml`, and `team-a.yaml`: the
/// same without its node-wide fields, selected by project `team-a`, passing
/// `TEAM_A_VAULT_TOKEN` and allowing team A's store only.
fn policy_dir(dir: &Path, port: u16) {
    write_policy(&dir.join("default.yaml"), &[]);
    let default = std::fs::read_to_string(dir.join("default.yaml")).expect("read");
    let mut team_a = selected_policy(&default, "team-a", "team-a");
    for (from, to) in [
        (
            "pass: [PATH, LANG, LC_ALL, TZ]",
            "pass: [PATH, LANG, LC_ALL, TZ, TEAM_A_VAULT_TOKEN]".to_owned(),
        ),
        (
            "network: {mode: none}",
            format!(
                "network: {{mode: allowList, allow: [{{host: vault.team-a.test, ports: [{port}], internal: true}}], hosts: {{vault.team-a.test: [127.0.0.1]}}}}"
            ),
        ),
    ] {
        assert!(team_a.contains(from), "fixture: {from}");
        team_a = team_a.replacen(from, &to, 1);
    }
    std::fs::write(dir.join("team-a.yaml"), team_a).expect("write");
}

fn sha256_of(path: &Path) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(std::fs::read(path).expect("read")))
}

#[test]
fn a_tenants_policy_gives_its_token_and_destination_to_its_project_only() {
    needs_root!(NEEDS_ROOT);
    let port = secret_store();
    let pol = tempfile::tempdir().expect("tmp");
    policy_dir(pol.path(), port);
    let s = Server::start_env(
        &plugin("  generate: {command: [python3, plugin.py]}\n"),
        &[
            "--policy",
            pol.path().to_str().expect("utf8"),
            "--metrics-address",
            "127.0.0.1:0",
        ],
        &[("TEAM_A_VAULT_TOKEN", "s.team-a-token")],
    );
    // The start-up table.
    s.wait_logged("policy selected by Argo CD's own variables", 1);
    let r = repo(&[("plugin.py", PLUGIN)]);
    let port_env = format!("ARGOCD_ENV_PORT={port}");
    let call = |env: &[&str]| {
        let mut args = vec!["-dir", r.path().to_str().expect("utf8"), "-env", &port_env];
        for e in env {
            args.extend(["-env", e]);
        }
        go(&s, "generate", &args)
    };
    let data = |v: &serde_json::Value| -> (String, String) {
        let m: serde_json::Value = serde_json::from_str(&manifests(v)[0]).expect("manifest");
        (
            m["data"]["token"].as_str().expect("token").to_owned(),
            m["data"]["reached"].as_str().expect("reached").to_owned(),
        )
    };

    // Team A's application: the token, and its store answers.
    let a = call(&[
        "ARGOCD_APP_NAME=billing",
        "ARGOCD_APP_NAMESPACE=billing",
        "ARGOCD_APP_PROJECT_NAME=team-a",
    ])
    .unwrap_or_else(|e| panic!("{e:?}\n{}", s.logs()));
    assert_eq!(data(&a), ("s.team-a-token".into(), "team-a-secret".into()));

    // Team B's, an unknown project's, and one without a project (Argo CD before 3.0): the
    // default policy, so neither the token nor a way out.
    let hostile_params =
        r#"ARGOCD_APP_PARAMETERS=[{"name":"ARGOCD_APP_PROJECT_NAME","string":"team-a"}]"#;
    let others: [&[&str]; 4] = [
        &["ARGOCD_APP_NAME=shop", "ARGOCD_APP_PROJECT_NAME=team-b"],
        &["ARGOCD_APP_NAME=x", "ARGOCD_APP_PROJECT_NAME=unknown"],
        &["ARGOCD_APP_NAME=billing"],
        // Team B's author names team A through everything an author controls.
        &[
            "ARGOCD_APP_NAME=shop",
            "ARGOCD_APP_PROJECT_NAME=team-b",
            "ARGOCD_ENV_ARGOCD_APP_PROJECT_NAME=team-a",
            "PARAM_ARGOCD_APP_PROJECT_NAME=team-a",
            hostile_params,
        ],
    ];
    for env in others {
        let v = call(env).unwrap_or_else(|e| panic!("{env:?}: {e:?}\n{}", s.logs()));
        let (token, reached) = data(&v);
        assert_eq!(token, "<none>", "{env:?}");
        assert!(reached.starts_with("failed: "), "{env:?}: {reached}");
    }

    // Both tenants at once, each on its own policy's spare jails: neither leaks into the other.
    std::thread::scope(|sc| {
        let runs: Vec<_> = (0..6)
            .map(|i| {
                let team = if i % 2 == 0 { "team-a" } else { "team-b" };
                let call = &call;
                let data = &data;
                sc.spawn(move || {
                    let project = format!("ARGOCD_APP_PROJECT_NAME={team}");
                    let v = call(&[project.as_str()]).unwrap_or_else(|e| panic!("{team}: {e:?}"));
                    (team, data(&v))
                })
            })
            .collect();
        for r in runs {
            let (team, (token, reached)) = r.join().expect("thread");
            if team == "team-a" {
                assert_eq!(
                    (token.as_str(), reached.as_str()),
                    ("s.team-a-token", "team-a-secret")
                );
            } else {
                assert_eq!(token, "<none>", "{team}");
                assert!(reached.starts_with("failed: "), "{team}: {reached}");
            }
        }
    });

    // The variable that selects, given twice with different values: refused, not guessed.
    let (code, msg) = call(&[
        "ARGOCD_APP_PROJECT_NAME=team-b",
        "ARGOCD_APP_PROJECT_NAME=team-a",
    ])
    .expect_err("two projects");
    assert_eq!(code, INVALID_ARGUMENT, "{msg}");
    assert!(
        msg.contains("ARGOCD_APP_PROJECT_NAME is given twice") && msg.contains("spec.select"),
        "{msg}"
    );

    // Each event names the policy it ran under, with the file's SHA-256; only team A's
    // reached the network, through its proxy.
    s.wait_settled(12);
    let events = s.audit_events();
    let policies: Vec<(&str, &str)> = events
        .iter()
        .map(|e| (e.policy.name.as_str(), e.policy.sha256.as_str()))
        .collect();
    let (team_a_sha, default_sha) = (
        sha256_of(&pol.path().join("team-a.yaml")),
        sha256_of(&pol.path().join("default.yaml")),
    );
    assert_eq!(policies.len(), 12, "{events:?}");
    assert_eq!(policies[0], ("team-a", team_a_sha.as_str()));
    for (e, p) in events.iter().zip(&policies).skip(1) {
        let want = if e.project.as_deref() == Some("team-a") {
            ("team-a", team_a_sha.as_str())
        } else {
            ("default", default_sha.as_str())
        };
        assert_eq!(*p, want, "{e}");
    }
    // The refused one claims no project: its two said different things.
    let refused = events.last().expect("event");
    assert_eq!(refused.code, "InvalidArgument", "{refused}");
    assert!(refused.project.is_none(), "{refused}");
    for e in &events {
        let team_a = e.policy.name == "team-a";
        assert_eq!(!e.egress.is_empty(), team_a, "{e}");
    }
    // Metrics carry the policy.
    let body = scrape(&s.metrics_address());
    for line in [
        r#"cmp_warden_requests_total{rpc="GenerateManifest",code="Ok",policy="team-a"} 4"#,
        r#"cmp_warden_requests_total{rpc="GenerateManifest",code="Ok",policy="default"} 7"#,
        r#"cmp_warden_requests_total{rpc="GenerateManifest",code="InvalidArgument",policy="default"} 1"#,
    ] {
        assert!(body.lines().any(|l| l == line), "{line}:\n{body}");
    }
    assert!(
        body.contains(r#"cmp_warden_egress_connections_total{decision="allowed",policy="team-a"}"#),
        "{body}"
    );
    // No two requests that ran at the same time shared an identity, across tenants too: each
    // event's run is (its end - its duration, its end], and the six run at once above overlap
    // (mutant: the pool's in-use check and lease lock both ignored -> two at once on one UID).
    assert_eq!(epoch_ms("2000-03-01T00:00:01.25Z"), 951_868_801_250);
    let runs: Vec<(u32, i64, i64)> = events
        .iter()
        .filter_map(|e| {
            let end = epoch_ms(&e.time);
            Some((e.uid?, end - e.duration_ms as i64, end))
        })
        .collect();
    let mut overlapping = 0;
    for (i, a) in runs.iter().enumerate() {
        for b in &runs[i + 1..] {
            if a.1 < b.2 && b.1 < a.2 {
                overlapping += 1;
                assert_ne!(
                    a.0, b.0,
                    "two requests at once on one UID: {a:?} {b:?}\n{events:#?}"
                );
            }
        }
    }
    assert!(overlapping > 0, "no two requests overlapped: {runs:?}");
}

/// Milliseconds since the epoch of an audit event's RFC 3339 UTC time.
fn epoch_ms(t: &str) -> i64 {
    let bad = || -> ! { panic!("not an RFC 3339 UTC time: {t}") };
    let (date, clock) = t
        .strip_suffix('Z')
        .and_then(|t| t.split_once('T'))
        .unwrap_or_else(|| bad());
    let num = |s: &str| s.parse::<i64>().unwrap_or_else(|_| bad());
    let d: Vec<i64> = date.split('-').map(num).collect();
    let (hms, frac) = clock.split_once('.').unwrap_or((clock, "0"));
    let c: Vec<i64> = hms.split(':').map(num).collect();
    let ms = num(&format!("{frac:0<3}")[..3]);
    // Days from the civil date (Howard Hinnant's algorithm).
    let (y, m) = if d[1] <= 2 {
        (d[0] - 1, d[1] + 9)
    } else {
        (d[0], d[1] - 3)
    };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * m + 2) / 5 + d[2] - 1;
    let days = era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468;
    ((days * 24 + c[0]) * 60 + c[1]) * 60_000 + c[2] * 1000 + ms
}

/// `policy check DIR` and `doctor --policy DIR` validate every policy and say which selects
/// what; a selected policy is compiled and probed at start-up as the default is, so one whose
/// seccomp filter cannot be built here stops `serve`, named.
#[test]
fn every_policy_of_a_directory_is_checked_and_probed_before_serving() {
    use std::process::Command;
    needs_root!(NEEDS_ROOT);
    let pol = tempfile::tempdir().expect("tmp");
    policy_dir(pol.path(), 18299);

    let out = Command::new(bin())
        .args(["policy", "check"])
        .arg(pol.path())
        .output()
        .expect("policy check");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains(r#"policy "team-a" runs requests of projects [team-a]"#)
            && err.contains(
                r#"policy "default" (the default) runs every request no other policy selects"#
            ),
        "{err}"
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v[1]["name"], "team-a");
    assert_eq!(v[1]["select"]["projects"], serde_json::json!(["team-a"]));
    assert_eq!(v[1]["uidFirst"], v[0]["uidFirst"]);

    let out = Command::new(bin())
        .args(["doctor", "--json", "--policy"])
        .arg(pol.path())
        .output()
        .expect("doctor");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert!(out.status.success(), "{v:#}");
    assert_eq!(v["policy"], "default");
    assert_eq!(v["selected"][0]["name"], "team-a");
    assert_eq!(v["selected"][0]["select"]["projects"][0], "team-a");

    // A node-wide field in team-a's file: refused, naming the file and the field.
    let team_a = pol.path().join("team-a.yaml");
    let text = std::fs::read_to_string(&team_a).expect("read");
    std::fs::write(
        &team_a,
        text.replacen(
            "spec:\n",
            "spec:\n  uidRange: {first: 30000, count: 10}\n",
            1,
        ),
    )
    .expect("write");
    let out = Command::new(bin())
        .args(["policy", "check"])
        .arg(pol.path())
        .output()
        .expect("policy check");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("team-a.yaml: policy: line ") && err.contains("spec.uidRange: is node-wide"),
        "{err}"
    );
    std::fs::write(&team_a, &text).expect("restore");

    // Team A's seccomp profile names a call this architecture lacks: `serve` compiles every
    // policy's filter before serving, and refuses (the default requires seccomp), naming it.
    let dir = tempfile::tempdir().expect("tmp");
    let (cfg, socks, work) = (
        dir.path().join("config"),
        dir.path().join("plugins"),
        dir.path().join("work"),
    );
    for d in [&cfg, &socks, &work] {
        std::fs::create_dir_all(d).expect("mkdir");
    }
    std::fs::write(
        cfg.join("plugin.yaml"),
        plugin("  generate: {command: [cat, x]}\n"),
    )
    .expect("plugin");
    let profile = std::fs::read_to_string(pol.path().join("seccomp/default.json")).expect("read");
    let foreign = profile.replacen("\"unshare\"", "\"socketcall\", \"unshare\"", 1);
    assert_ne!(foreign, profile, "fixture: unshare");
    std::fs::write(pol.path().join("seccomp/team-a.json"), foreign).expect("write");
    std::fs::write(
        &team_a,
        text.replacen("seccomp/default.json", "seccomp/team-a.json", 1),
    )
    .expect("write");
    let mut serve = Command::new(bin())
        .arg("--config-dir-path")
        .arg(&cfg)
        .arg("--policy")
        .arg(pol.path())
        .env("ARGOCD_PLUGINSOCKFILEPATH", &socks)
        .env("ARGOCD_CMP_WORKDIR", &work)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("serve");
    // A server that started anyway would serve forever: give it 30 s to refuse.
    let refused = wait_until(std::time::Duration::from_secs(30), || {
        serve.try_wait().ok().flatten().is_some()
    });
    if !refused {
        let _ = serve.kill();
    }
    let out = serve.wait_with_output().expect("serve");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(refused && !out.status.success(), "{err}");
    assert!(
        err.contains(r#"policy \"team-a\": seccomp: "#) && err.contains("socketcall"),
        "{err}"
    );
}

/// Team A's plugin needs its token and its store; team B's needs neither.
const LEARNING_PLUGIN: &str = r#"
import json, os, sys, urllib.request
out = {"token": os.environ.get("TEAM_A_VAULT_TOKEN", "<none>"), "reached": "<none>"}
if os.environ.get("ARGOCD_APP_PROJECT_NAME") == "team-a":
    url = "http://vault.team-a.test:%s/v1/secret" % os.environ["ARGOCD_ENV_PORT"]
    out["reached"] = urllib.request.urlopen(url, timeout=5).read().decode()
    if "TEAM_A_VAULT_TOKEN" not in os.environ:
        sys.exit("TEAM_A_VAULT_TOKEN is not set")
print(json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "tenant"}, "data": out}))
"#;

/// The operator's path to per-project policies: one learning run (an audit-mode allow list)
/// serving two projects, `policy suggest` over its audit log writes a policy directory with a
/// policy per project from that project's requests alone, and served from it, team A's
/// application gets its token and store while team B's gets neither.
#[test]
fn policy_suggest_writes_a_policy_per_project_that_serves_as_a_directory() {
    needs_root!(NEEDS_ROOT);
    let port = secret_store();
    let work = tempfile::tempdir().expect("tmp");
    let learning = work.path().join("learning/policy.yaml");
    write_policy(
        &learning,
        &[(
            "network: {mode: none}",
            "network: {mode: allowList, audit: true, hosts: {vault.team-a.test: [127.0.0.1]}}",
        )],
    );
    // The plugin is the repository's own script: only the operator naming the variable (here
    // in the learning policy) lets suggest propose it, never the script's words.
    let text = std::fs::read_to_string(&learning).expect("read");
    std::fs::write(
        &learning,
        format!("{text}# team-a's plugin reads TEAM_A_VAULT_TOKEN\n"),
    )
    .expect("write");
    let plugin_yaml = plugin("  generate: {command: [python3, plugin.py]}\n");
    let server_env = [("TEAM_A_VAULT_TOKEN", "s.team-a-token")];
    let r = repo(&[("plugin.py", LEARNING_PLUGIN)]);
    let port_env = format!("ARGOCD_ENV_PORT={port}");
    let call = |s: &Server, project: &str| {
        let project = format!("ARGOCD_APP_PROJECT_NAME={project}");
        go(
            s,
            "generate",
            &[
                "-dir",
                r.path().to_str().expect("utf8"),
                "-env",
                &port_env,
                "-env",
                &project,
            ],
        )
    };

    let s = Server::start_env(
        &plugin_yaml,
        &["--policy", learning.to_str().expect("utf8")],
        &server_env,
    );
    // The log says what audit mode does: nothing refused (mutant: the allowList line as for
    // an enforced list -> "commands reach only spec.network.allow").
    let logs = s.logs();
    assert!(
        logs.contains(
            "NETWORK AUDIT MODE: spec.network.audit: true lets every destination through"
        ) && !logs.contains("commands reach only spec.network.allow"),
        "{logs}"
    );
    let (_, msg) = call(&s, "team-a").expect_err("the token is withheld");
    assert!(msg.contains("TEAM_A_VAULT_TOKEN"), "{msg}");
    call(&s, "team-b").unwrap_or_else(|e| panic!("{e:?}\n{}", s.logs()));
    s.wait_settled(2);
    let log = work.path().join("audit.jsonl");
    let events: Vec<String> = s.audit_events().iter().map(|e| e.to_string()).collect();
    assert_eq!(events.len(), 2, "{events:?}");
    std::fs::write(&log, events.join("\n") + "\n").expect("write");

    let out = work.path().join("suggested");
    let run = policy_suggest(&log, &learning, &out);
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{err}");
    assert!(
        err.contains("requests of 2 projects (team-a, team-b)"),
        "{err}"
    );
    let read = |f: &str| std::fs::read_to_string(out.join(f)).expect(f);
    let (a, b) = (read("project-team-a.yaml"), read("project-team-b.yaml"));
    assert!(a.contains(r#"select: {projects: ["team-a"]}"#), "{a}");
    assert!(a.contains(r#""TEAM_A_VAULT_TOKEN""#), "{a}");
    assert!(
        a.contains("vault.team-a.test") && !a.contains("audit: true"),
        "{a}"
    );
    assert!(
        !b.contains("TEAM_A_VAULT_TOKEN") && b.contains("mode: none"),
        "{b}"
    );
    // The default runs every other project: nothing of the learning run's openness.
    let d = read("default.yaml");
    assert!(
        d.contains("network: {mode: none}") && !d.contains("audit: true"),
        "{d}"
    );
    for text in [&a, &b] {
        assert!(
            !text.contains("uidRange:") && !text.contains("require:"),
            "{text}"
        );
    }

    // Served from that directory (the learning server gone: the same UID range).
    drop(s);
    let s = Server::start_env(
        &plugin_yaml,
        &["--policy", out.to_str().expect("utf8")],
        &server_env,
    );
    let v = call(&s, "team-a").unwrap_or_else(|e| panic!("{e:?}\n{}", s.logs()));
    let m: serde_json::Value = serde_json::from_str(&manifests(&v)[0]).expect("manifest");
    assert_eq!(m["data"]["token"], "s.team-a-token");
    assert_eq!(m["data"]["reached"], "team-a-secret");
    let v = call(&s, "team-b").unwrap_or_else(|e| panic!("{e:?}\n{}", s.logs()));
    let m: serde_json::Value = serde_json::from_str(&manifests(&v)[0]).expect("manifest");
    assert_eq!(m["data"]["token"], "<none>");
    s.wait_settled(2);
    let names: Vec<String> = s
        .audit_events()
        .iter()
        .map(|e| e.policy.name.clone())
        .collect();
    assert_eq!(names, ["project-team-a", "project-team-b"]);
}

/// What a hostile request of team B does in the run `policy suggest` learns from: names its
/// own process with a newline and a YAML line (`prctl`), makes a call the profile denies
/// under that name, asks the egress proxy for a destination the list refuses, names team A's
/// token and `VAULT_TOKEN` in its error (the server withholds a cloud key too), claims
/// `/etc/shadow` was refused, and fails.
const HOSTILE_LEARNING: &str = r#"
import ctypes, os, socket, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl(15, b"x\nenv: {pass: [", 0, 0, 0)
libc.ptrace(0, 0, 0, 0)
p = int(os.environ["HTTP_PROXY"].rsplit(":", 1)[1])
s = socket.create_connection(("127.0.0.1", p), timeout=5)
s.sendall(b"CONNECT evil.example.test:443 HTTP/1.1\r\nHost: evil.example.test:443\r\n\r\n")
s.recv(4096)
sys.exit("missing VAULT_TOKEN and TEAM_A_VAULT_TOKEN\ncat: /etc/shadow: Permission denied")
"#;

/// The fourth and fifth attack rounds' findings on learning, attacked again: `policy suggest`
/// over the audit log of a hostile request grants nothing the request did or said. The
/// destination the proxy refused is not allowed, team A's token (which team A's policy passes),
/// the cloud key the request did not name (every failure lists it among the withheld) and
/// `VAULT_TOKEN`, which only its own output named, are not passed (the last is listed for the
/// reviewer), the path only its error named is not readable, the hostile process name stays
/// inside one comment, and what is written validates. The request's error names `VAULT_TOKEN`
/// as withheld but not team A's token: whether another tenant's variable exists is not team
/// B's to learn (mutant: the note from every withheld name -> TEAM_A_VAULT_TOKEN in the
/// error). A suggestion that does not validate writes nothing.
#[test]
fn policy_suggest_grants_nothing_a_hostile_request_did_or_said() {
    use std::process::Command;
    needs_root!(NEEDS_ROOT);
    let port = secret_store();
    let work = tempfile::tempdir().expect("tmp");
    let dir = work.path().join("policies");
    policy_dir(&dir, port);
    // The default: an allow list (one store), so the proxy refuses what is not on it.
    let default = dir.join("default.yaml");
    let text = std::fs::read_to_string(&default).expect("read");
    let text = text.replacen(
        "network: {mode: none}",
        "network: {mode: allowList, allow: [{host: store.example.test, ports: [443]}]}",
        1,
    );
    std::fs::write(&default, text).expect("write");
    let s = Server::start_env(
        &plugin("  generate: {command: [python3, plugin.py]}\n"),
        &["--policy", dir.to_str().expect("utf8")],
        &[
            ("TEAM_A_VAULT_TOKEN", "s.team-a-token"),
            ("VAULT_TOKEN", "s.shared"),
            ("AWS_SECRET_ACCESS_KEY", "cloud-key"),
        ],
    );
    let r = repo(&[("plugin.py", HOSTILE_LEARNING)]);
    let (_, msg) = go(
        &s,
        "generate",
        &[
            "-dir",
            r.path().to_str().expect("utf8"),
            "-env",
            "ARGOCD_APP_PROJECT_NAME=team-b",
        ],
    )
    .expect_err("the hostile request fails");
    assert!(
        msg.contains("(server variables not passed to commands: VAULT_TOKEN; "),
        "{msg}"
    );
    assert!(
        !msg.contains("TEAM_A_VAULT_TOKEN;") && !msg.contains(", TEAM_A_VAULT_TOKEN"),
        "another tenant's variable named to team B: {msg}"
    );
    assert!(
        event_withheld_names(&s).contains(&"AWS_SECRET_ACCESS_KEY".to_owned()),
        "the cloud key is among the withheld"
    );
    s.wait_settled(1);
    let event = s.audit_events().pop().expect("event");
    // The attack happened as described: the proxy refused, the call was denied under the
    // hostile name, the variables were withheld.
    assert!(
        event
            .egress
            .iter()
            .any(|c| c.decision == Decision::Denied && c.destination == "evil.example.test:443"),
        "{event}"
    );
    assert!(
        event
            .seccomp_audit
            .iter()
            .any(|c| c.syscall == "ptrace" && c.comm.contains('\n')),
        "{event}"
    );
    let log = work.path().join("audit.jsonl");
    std::fs::write(&log, format!("{event}\n")).expect("write");
    let out = work.path().join("suggested");
    let suggest = |policy: &Path, out: &Path| policy_suggest(&log, policy, out);
    let run = suggest(&dir, &out);
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{err}");
    let written = std::fs::read_to_string(out.join("policy.yaml")).expect("policy.yaml");
    let check = Command::new(bin())
        .args(["policy", "check"])
        .arg(out.join("policy.yaml"))
        .output()
        .expect("check");
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
    let effective: serde_json::Value = serde_json::from_slice(&check.stdout).expect("json");
    let spec = &effective;
    let pass: Vec<&str> = spec["envPass"]
        .as_array()
        .or(spec["env_pass"].as_array())
        .expect("envPass")
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    for never in ["VAULT_TOKEN", "TEAM_A_VAULT_TOKEN", "AWS_SECRET_ACCESS_KEY"] {
        assert!(!pass.contains(&never), "{never} passed:\n{written}");
    }
    assert!(
        err.contains("NOT adding \"VAULT_TOKEN\", named only by a failed command's own output"),
        "{err}"
    );
    let yaml_lines: Vec<&str> = written
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect();
    for never in ["evil.example.test", "/etc/shadow"] {
        assert!(
            !yaml_lines.iter().any(|l| l.contains(never)),
            "{never} granted:\n{written}"
        );
    }
    // The hostile name is in one comment line, escaped.
    assert!(
        written
            .lines()
            .any(|l| l.starts_with('#') && l.contains(r#""x\nenv: {pass: [""#)),
        "{written}"
    );
    assert!(
        !written.lines().any(|l| l.starts_with("env: {pass: [")),
        "{written}"
    );
    assert!(err.contains("NOT adding TEAM_A_VAULT_TOKEN"), "{err}");
    // The call enforce mode denied stays denied.
    let profile = std::fs::read_to_string(out.join("seccomp/profile.json")).expect("profile");
    assert!(profile.contains("\"ptrace\""), "ptrace allowed:\n{written}");
    // A suggestion that cannot validate (its base's profile missing) writes nothing at all.
    let broken = work.path().join("broken");
    std::fs::create_dir_all(&broken).expect("mkdir");
    std::fs::copy(&default, broken.join("policy.yaml")).expect("copy");
    std::fs::create_dir_all(broken.join("seccomp")).expect("mkdir");
    std::fs::write(broken.join("seccomp/default.json"), "{\"rules\": [{\"syscalls\": [\"no_such_call\"], \"action\": {\"errno\": \"EPERM\"}, \"reason\": \"x\"}]}").expect("write");
    let nothing = work.path().join("nothing");
    let run = suggest(&broken.join("policy.yaml"), &nothing);
    assert!(!run.status.success());
    assert!(
        !nothing.exists(),
        "a failed suggestion wrote {}",
        nothing.display()
    );
}

/// The names the last audit event lists as withheld from commands.
fn event_withheld_names(s: &Server) -> Vec<String> {
    s.wait_settled(1);
    s.audit_events().pop().expect("event").withheld_env
}
