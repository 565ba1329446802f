//! The audit log and the metrics endpoint through the real server: one event per request with
//! the documented fields for success, command failure, timeout, OOM, seccomp denial and
//! archive rejection; no secret value anywhere in the events or the logs; `/metrics` scraped
//! and parsed.
#![allow(clippy::print_stderr)] // a skip must say why

#[macro_use]
mod common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

/// Why these tests need root (printed when one skips).
const NEEDS_ROOT: &str = "audit tests need root (CI runs as root): leased UIDs need CAP_SETUID";

const SECRET: &str = "s3cr3t-Vault-T0ken";
const URL_PASSWORD: &str = "hunter2pw";

/// Behaviour chosen by `ARGOCD_ENV_MODE`; default prints the manifest.
const SPEC: &str = r#"  init:
    command: [sh, -c, "true"]
  generate:
    command: [sh, -c]
    args:
      - |
        case "$ARGOCD_ENV_MODE" in
          fail) P=hunter; echo "fatal: could not read https://alice:${P}2pw@git.example.com/r.git token $ARGOCD_ENV_VAULT_TOKEN" >&2; exit 3 ;;
          hang) sleep 60 ;;
          oom) exec /usr/bin/python3 -c 'b = [bytearray(1 << 20) for _ in range(1024)]; print(len(b))' ;;
          unshare) unshare -U true || exit 1 ;;
          landlock) cat /var/lib/cmp-warden-tests/landlock/notes.txt >/dev/null || exit 1 ;;
          podread) cat /var/lib/cmp-warden-tests/pod-landlock/notes.txt >/dev/null || exit 1 ;;
          hostile) touch "$ARGOCD_ENV_WORK_ROOT/planted" /dev/shm/planted; cat "$ARGOCD_ENV_CFG" >/dev/null; sleep 0.5; exit 1 ;;
          flood) /usr/bin/python3 -c 'import ctypes; u = ctypes.CDLL(None, use_errno=True).unshare; print(sum(u(0x10000000) == -1 for _ in range(5000)))' > flood.txt ;;
        esac
        cat cm.yaml
"#;

const CM: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm\n";

fn events(path: &std::path::Path, n: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let v: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("audit line is JSON"))
            .collect();
        if v.len() >= n || Instant::now() > deadline {
            return v;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Parse the exposition format into `name{labels}` → value, checking every line's shape.
fn parse_metrics(body: &str) -> BTreeMap<String, f64> {
    let mut m = BTreeMap::new();
    for line in body.lines() {
        if line.starts_with("# HELP ") || line.starts_with("# TYPE ") {
            continue;
        }
        let (key, val) = line.rsplit_once(' ').expect("sample line");
        let v: f64 = val.parse().unwrap_or_else(|_| panic!("bad value: {line}"));
        let name_ok = key
            .split('{')
            .next()
            .is_some_and(|n| n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
        assert!(name_ok, "bad metric name: {line}");
        m.insert(key.to_owned(), v);
    }
    m
}

#[test]
fn every_request_is_audited_without_secrets_and_metrics_count_it() {
    needs_root!(NEEDS_ROOT);
    let pol = tempfile::tempdir().expect("tmp");
    let pol_file = pol.path().join("policy.yaml");
    write_policy(&pol_file, &[("memoryBytes: 1Gi", "memoryBytes: 96Mi")]);
    let audit = pol.path().join("audit.jsonl");
    let s = Server::start_env(
        &plugin(SPEC),
        &[
            "--policy",
            pol_file.to_str().expect("utf8"),
            "--audit-log",
            audit.to_str().expect("utf8"),
            "--metrics-address",
            "127.0.0.1:0",
        ],
        &[("ARGOCD_EXEC_TIMEOUT", "2s")],
    );
    let r = repo(&[("cm.yaml", CM)]);
    let dir = r.path().to_str().expect("utf8");
    let env = |mode: &str| {
        vec![
            "-dir".to_owned(),
            dir.to_owned(),
            "-env".to_owned(),
            format!("ARGOCD_ENV_MODE={mode}"),
            "-env".to_owned(),
            format!("ARGOCD_ENV_VAULT_TOKEN={SECRET}"),
            "-app".to_owned(),
            format!("app-{mode}"),
        ]
    };
    let call = |mode: &str| {
        let a = env(mode);
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        go(&s, "generate", &a)
    };
    // 1. success
    let ok = call("ok").expect("honest request");
    assert_eq!(ok["manifests"].as_array().map(Vec::len), Some(1));
    // 2. command failure: the credentials in stderr are redacted in the reply too.
    let (code, msg) = call("fail").expect_err("fails");
    assert_eq!(code, UNKNOWN);
    assert!(msg.contains("exit status 3"), "{msg}");
    assert!(
        !msg.contains(URL_PASSWORD) && !msg.contains(SECRET),
        "{msg}"
    );
    assert!(msg.contains("https://***@git.example.com"), "{msg}");
    // 3. timeout (ARGOCD_EXEC_TIMEOUT)
    let (code, _) = call("hang").expect_err("times out");
    assert_eq!(code, DEADLINE_EXCEEDED);
    // 4. OOM (96 MiB cgroup)
    let (code, msg) = call("oom").expect_err("oom");
    assert_eq!(code, RESOURCE_EXHAUSTED, "{msg}");
    // 5. seccomp denial: unshare(CLONE_NEWUSER) → EPERM
    let (code, msg) = call("unshare").expect_err("denied");
    assert_eq!(code, UNKNOWN, "{msg}");
    // 6. archive rejection: a symlink escaping the tree
    let bad = repo(&[("cm.yaml", CM), ("evil", "->../../etc/shadow")]);
    let (code, _) = go(
        &s,
        "generate",
        &[
            "-dir",
            bad.path().to_str().expect("utf8"),
            "-app",
            "app-archive",
        ],
    )
    .expect_err("refused");
    assert_eq!(code, INVALID_ARGUMENT);

    let ev = events(&audit, 6);
    assert_eq!(ev.len(), 6, "{ev:#?}");
    let by_app: BTreeMap<&str, &Value> = ev
        .iter()
        .map(|e| (e["app"].as_str().expect("app"), e))
        .collect();
    for e in &ev {
        assert_eq!(e["log"], "audit");
        assert_eq!(e["schema"], "cmp-warden.audit/v1");
        assert_eq!(e["rpc"], "GenerateManifest");
        assert_eq!(e["policy"]["name"], "default");
        assert_eq!(e["policy"]["sha256"].as_str().map(str::len), Some(64));
        assert_eq!(e["archive"]["sha256"].as_str().map(str::len), Some(64));
        assert!(e["archive"]["bytes"].as_u64() > Some(0));
        assert!(e["requestId"].as_str().is_some_and(|s| s.len() == 36));
        assert!(e["time"].as_str().is_some_and(|t| t.ends_with('Z')));
        assert!(e["uid"].as_u64().is_some() && e["uid"] == e["gid"], "{e:#}");
        assert!(e["cgroup"].is_string(), "{e:#}");
        assert_eq!(e["appRelPath"], ".");
    }
    let ok = by_app["app-ok"];
    assert_eq!(ok["outcome"], "ok");
    assert_eq!(ok["code"], "Ok");
    assert!(ok["limit"].is_null());
    assert_eq!(ok["archive"]["entries"], 1);
    let names: Vec<&str> = ok["envNames"]
        .as_array()
        .expect("env names")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(names.contains(&"ARGOCD_ENV_VAULT_TOKEN"), "{names:?}");
    let cmds = ok["commands"].as_array().expect("commands");
    assert_eq!(cmds.len(), 2);
    assert_eq!(cmds[0]["phase"], "init");
    assert_eq!(cmds[1]["phase"], "generate");
    assert_eq!(cmds[1]["exitCode"], 0);
    assert!(cmds[1]["stdoutBytes"].as_u64() >= Some(CM.len() as u64 - 1));
    assert!(cmds[1]["peakRssBytes"].as_u64() > Some(0), "{cmds:#?}");
    assert!(cmds[1]["durationMs"].is_u64());
    assert!(ok["peakMemoryBytes"].as_u64() > Some(0));

    let fail = by_app["app-fail"];
    assert_eq!(
        (fail["outcome"].as_str(), fail["code"].as_str()),
        (Some("error"), Some("Unknown"))
    );
    assert_eq!(fail["commands"][1]["exitCode"], 3);
    assert!(
        fail["error"]
            .as_str()
            .is_some_and(|e| e.contains("***@git.example.com"))
    );

    let hang = by_app["app-hang"];
    assert_eq!(hang["code"], "DeadlineExceeded");
    assert_eq!(hang["limit"], "timeout");
    assert_eq!(hang["commands"][1]["endedBy"], "timeout");

    let oom = by_app["app-oom"];
    assert_eq!(oom["code"], "ResourceExhausted");
    assert_eq!(oom["limit"], "memory");
    assert!(oom["oomKills"].as_u64() >= Some(1), "{oom:#}");

    // The denial that broke it is named: the call, its command, and the limit.
    let un = by_app["app-unshare"];
    assert_eq!(un["commands"][1]["exitCode"], 1, "{un:#}");
    assert_eq!(un["limit"], "seccomp", "{un:#}");
    let denied = un["seccompAudit"].as_array().expect("seccompAudit");
    assert!(
        denied.iter().any(|d| d["syscall"] == "unshare"
            && d["action"] == "denied"
            && d["comm"] == "unshare"),
        "{denied:#?}"
    );

    let arch = by_app["app-archive"];
    assert_eq!(arch["code"], "InvalidArgument");
    assert_eq!(arch["limit"], "archive");
    assert_eq!(arch["commands"].as_array().map(Vec::len), Some(0));

    // No secret value in any event or in the server's own log.
    let all = std::fs::read_to_string(&audit).expect("audit");
    for secret in [SECRET, URL_PASSWORD] {
        assert!(!all.contains(secret), "audit log leaks {secret}");
        assert!(!s.logs().contains(secret), "server log leaks {secret}");
    }

    // Metrics.
    let addr = s.metrics_address();
    // The last request's UID returns to the pool just after its response (reclaim is off the
    // response path), so wait for it before reading the gauges.
    let deadline = Instant::now() + Duration::from_secs(10);
    let m = loop {
        let m = parse_metrics(&scrape(&addr));
        if m.get("cmp_warden_uid_pool_in_use") == Some(&0.0) || Instant::now() > deadline {
            break m;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let get = |k: &str| {
        m.get(k)
            .copied()
            .unwrap_or_else(|| panic!("{k} missing: {m:#?}"))
    };
    assert_eq!(
        get(r#"cmp_warden_requests_total{rpc="GenerateManifest",code="Ok",policy="default"}"#),
        1.0
    );
    assert_eq!(
        get(r#"cmp_warden_requests_total{rpc="GenerateManifest",code="Unknown",policy="default"}"#),
        2.0
    );
    assert_eq!(
        get(
            r#"cmp_warden_requests_total{rpc="GenerateManifest",code="DeadlineExceeded",policy="default"}"#
        ),
        1.0
    );
    assert_eq!(
        get(r#"cmp_warden_sandbox_kills_total{reason="timeout",policy="default"}"#),
        1.0
    );
    assert_eq!(
        get(r#"cmp_warden_sandbox_kills_total{reason="memory",policy="default"}"#),
        1.0
    );
    assert_eq!(
        get(r#"cmp_warden_sandbox_kills_total{reason="seccomp",policy="default"}"#),
        1.0
    );
    assert!(get(r#"cmp_warden_seccomp_events_total{syscall="unshare",action="denied"}"#) >= 1.0);
    assert_eq!(
        get(r#"cmp_warden_archive_rejections_total{class="policy"}"#),
        1.0
    );
    assert_eq!(
        get(r#"cmp_warden_request_duration_seconds_count{rpc="GenerateManifest"}"#),
        6.0
    );
    assert_eq!(
        get(r#"cmp_warden_request_duration_seconds_bucket{rpc="GenerateManifest",le="+Inf"}"#),
        6.0
    );
    assert_eq!(get("cmp_warden_active_requests"), 0.0);
    assert_eq!(get("cmp_warden_uid_pool_in_use"), 0.0);
    assert_eq!(get("cmp_warden_uid_pool_capacity"), 16.0);
    assert!(get("cmp_warden_received_bytes_total") > 0.0);
    assert!(get("cmp_warden_sent_bytes_total") > 0.0);
    // Build information and the process's own resources, as Prometheus clients export them.
    assert_eq!(
        get(&format!(
            r#"cmp_warden_build_info{{version="{}",commit="{}"}}"#,
            env!("CARGO_PKG_VERSION"),
            env!("CMP_WARDEN_COMMIT")
        )),
        1.0
    );
    assert!(get("process_resident_memory_bytes") > 1e6);
    assert!(get("process_open_fds") >= 3.0);
    assert!(get("process_max_fds") >= get("process_open_fds"));
    assert!(get("process_threads") >= 2.0);
    assert!(get("process_cpu_seconds_total") > 0.0);
    let started = get("process_start_time_seconds");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs_f64();
    assert!(
        started <= now + 1.0 && started > now - 3600.0,
        "{started} vs {now}"
    );
    // Anything but GET is refused, and unknown paths are 404 (served by hyper).
    let mut c = std::net::TcpStream::connect(&addr).expect("connect");
    c.write_all(
        b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    )
    .expect("write");
    let mut reply = String::new();
    c.read_to_string(&mut reply).expect("read");
    assert!(reply.starts_with("HTTP/1.1 405"), "{reply}");
}

#[test]
fn audit_mode_lets_a_plugin_enforce_mode_breaks_run_and_records_each_would_be_denial() {
    needs_root!(NEEDS_ROOT);
    let pol = tempfile::tempdir().expect("tmp");
    let r = repo(&[("cm.yaml", CM)]);
    let dir = r.path().to_str().expect("utf8");
    let args = [
        "-dir",
        dir,
        "-env",
        "ARGOCD_ENV_MODE=unshare",
        "-app",
        "needs-unshare",
    ];
    // Enforce (the default): the plugin breaks.
    let enforce_file = pol.path().join("enforce/policy.yaml");
    write_policy(&enforce_file, &[]);
    let s = Server::start(
        &plugin(SPEC),
        &["--policy", enforce_file.to_str().expect("utf8")],
    );
    let (code, msg) = go(&s, "generate", &args).expect_err("enforce denies unshare");
    assert_eq!(code, UNKNOWN, "{msg}");
    drop(s);

    // Audit: the same request succeeds and its event names the call enforce mode denied.
    let audit_file = pol.path().join("audit/policy.yaml");
    write_policy(&audit_file, &[("mode: enforce}", "mode: audit}")]);
    let log = pol.path().join("audit.jsonl");
    let s = Server::start(
        &plugin(SPEC),
        &[
            "--policy",
            audit_file.to_str().expect("utf8"),
            "--audit-log",
            log.to_str().expect("utf8"),
        ],
    );
    let v = go(&s, "generate", &args).expect("audit mode lets it run");
    assert_eq!(
        v["manifests"][0],
        r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"cm"}}"#
    );
    // An ordinary request records nothing.
    go(&s, "generate", &["-dir", dir, "-app", "plain"]).expect("plain");
    let ev = events(&log, 2);
    let by_app: BTreeMap<&str, &Value> = ev
        .iter()
        .map(|e| (e["app"].as_str().expect("app"), e))
        .collect();
    let denials = by_app["needs-unshare"]["seccompAudit"]
        .as_array()
        .expect("seccompAudit");
    assert!(
        denials.iter().any(|d| d["syscall"] == "unshare"
            && d["action"] == "audited"
            && d["count"].as_u64() >= Some(1)
            && d["comm"] == "unshare"),
        "{denials:#?}"
    );
    assert_eq!(
        by_app["plain"]["seccompAudit"].as_array().map(Vec::len),
        Some(0)
    );
    assert!(
        s.logs()
            .contains("seccomp audit: would be denied in enforce mode"),
        "{}",
        s.logs()
    );
}

/// A world-readable file outside every `spec.filesystem` rule, which only Landlock refuses.
fn outside_the_rules(dir: &str) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::path::Path::new(dir);
    std::fs::create_dir_all(dir).expect("mkdir");
    let file = dir.join("notes.txt");
    std::fs::write(&file, "not for plugins\n").expect("write");
    for p in [dir.parent().expect("parent"), dir] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    file
}

/// As in a pod (no kernel audit reader: the server runs without `CAP_AUDIT_READ`, which a
/// sidecar never has), in an audit-mode run (docs/audit.md, "Writing a policy for a new
/// plugin"), a file Landlock refused is named from the command's own error with the field that
/// allows it. `policy suggest` does not grant it (a command's output is its own to write: the
/// fourth attack round had `/etc/shadow` proposed from a stderr line) but names it for the
/// reviewer; with that path added by hand, the same request renders under the suggested
/// (enforce-mode) policy.
#[test]
fn without_kernel_audit_a_refused_file_is_named_from_the_error_and_suggest_lists_it() {
    needs_root!(NEEDS_ROOT);
    let secret = outside_the_rules("/var/lib/cmp-warden-tests/pod-landlock");
    let pol = tempfile::tempdir().expect("tmp");
    let file = pol.path().join("policy.yaml");
    write_policy(&file, &[("mode: enforce}", "mode: audit}")]);
    let log = pol.path().join("audit.jsonl");
    let args = [
        "--policy",
        file.to_str().expect("utf8"),
        "--audit-log",
        log.to_str().expect("utf8"),
    ];
    let s = Server::start_under(
        &["setpriv", "--bounding-set", "-audit_read"],
        &plugin(SPEC),
        &args,
        &[],
    );
    let r = repo(&[("cm.yaml", CM)]);
    let d = r.path().to_str().expect("utf8");
    let reads = [
        "-dir",
        d,
        "-env",
        "ARGOCD_ENV_MODE=podread",
        "-app",
        "reads",
    ];
    let (code, msg) = go(&s, "generate", &reads).expect_err("Landlock refuses the read");
    assert!(
        s.logs().contains("the kernel audit log's read group"),
        "no audit reader, as in a pod: {}",
        s.logs()
    );
    assert_eq!(code, UNKNOWN, "{msg}");
    let path = secret.to_str().expect("utf8");
    assert!(msg.contains(&format!("{path}: Permission denied")), "{msg}");
    assert!(
        msg.contains(&format!(
            "(the sandbox refused: fs (named in the command's error) on {path} (Landlock; spec.filesystem.readOnly"
        )),
        "{msg}"
    );
    go(&s, "generate", &["-dir", d, "-app", "plain"]).expect("an honest request renders");
    let ev = events(&log, 2);
    let denials = &ev.iter().find(|e| e["app"] == "reads").expect("event")["landlockDenials"];
    assert_eq!(denials[0]["object"], path, "{denials}");
    drop(s);

    let out = pol.path().join("suggested");
    let st = policy_suggest(&log, &file, &out);
    assert!(
        st.status.success(),
        "{}",
        String::from_utf8_lossy(&st.stderr)
    );
    let notes = String::from_utf8_lossy(&st.stderr);
    assert!(
        notes.contains("filesystem: NOT added, as only a command's own error named them")
            && notes.contains(&format!("{path:?}")),
        "{notes}"
    );
    let suggested = out.join("policy.yaml");
    let text = std::fs::read_to_string(&suggested).expect("suggested");
    assert!(text.contains("mode: enforce}"), "{text}");
    let granted = |t: &str| {
        t.lines()
            .any(|l| l.contains("readOnly:") && l.contains(&format!("{path:?}")))
    };
    assert!(!granted(&text), "{text}");
    // The reviewer adds it by hand.
    let text = text.replacen("readOnly: [", &format!("readOnly: [{path:?}, "), 1);
    assert!(granted(&text), "{text}");
    std::fs::write(&suggested, text).expect("write");
    let again = Server::start(
        &plugin(SPEC),
        &["--policy", suggested.to_str().expect("utf8")],
    );
    let v = go(&again, "generate", &reads).expect("renders under the suggested policy");
    assert_eq!(v["manifests"].as_array().map(Vec::len), Some(1), "{v}");
}

/// The fifth attack round's fourth finding, attacked again: a failing request's Landlock
/// records name the work root (every request's tree), `/dev/shm` and the server's own
/// plugin.yaml. The kernel's records say so (the attack happened), the audit event marks them
/// as no policy field's to allow, and `policy suggest` over the log proposes none of them,
/// while an honest request at the same time renders (mutant: the supervisor's marking and
/// suggest's own filter both removed -> the work root in readWrite). The hostile command waits
/// half a second before it fails, so the kernel's audit thread has sent every record of the
/// attack when the server collects them (under load the last came after the first had been
/// taken): what is tested is what the event and suggest make of them.
#[test]
fn suggest_learns_no_grant_of_the_servers_paths_from_a_hostile_request() {
    needs_root!(NEEDS_ROOT);
    let _audit = match AuditOn::enable() {
        Ok(a) => a,
        Err(e) => {
            panic!("kernel audit cannot be enabled here ({e}): this test needs CAP_AUDIT_CONTROL")
        }
    };
    let pol = tempfile::tempdir().expect("tmp");
    let file = pol.path().join("policy.yaml");
    // No mount namespace: the work root and the server's config are the real directories, as
    // under a container runtime's default seccomp profile.
    write_policy(&file, &[NO_NAMESPACES]);
    let s = Server::start(&plugin(SPEC), &["--policy", file.to_str().expect("utf8")]);
    let work_root = s.work.join("_cmp_server");
    let cfg = s.dir.path().join("config/plugin.yaml");
    assert!(
        work_root.is_dir() && cfg.is_file(),
        "fixture: the server's paths"
    );
    let r = repo(&[("cm.yaml", CM)]);
    let d = r.path().to_str().expect("utf8");
    let (wr, cf) = (
        format!("ARGOCD_ENV_WORK_ROOT={}", work_root.display()),
        format!("ARGOCD_ENV_CFG={}", cfg.display()),
    );
    let attack = [
        "-dir",
        d,
        "-env",
        "ARGOCD_ENV_MODE=hostile",
        "-env",
        &wr,
        "-env",
        &cf,
        "-app",
        "hostile",
    ];
    let honest = ["-dir", d, "-app", "plain"];
    let (denied, ok) = std::thread::scope(|sc| {
        let a = sc.spawn(|| go(&s, "generate", &attack));
        let h = sc.spawn(|| go(&s, "generate", &honest));
        (a.join().expect("attack"), h.join().expect("honest"))
    });
    ok.expect("an honest request at the same time renders");
    denied.expect_err("the hostile request fails");
    let events = s.audited(2);
    let hostile = events
        .iter()
        .find(|e| e.app == "hostile")
        .expect("the hostile request's event");
    let on = |p: &std::path::Path| {
        hostile
            .landlock_denials
            .iter()
            .find(|d| std::path::Path::new(&d.object).starts_with(p))
            .cloned()
    };
    // The kernel's records of the attack, each marked as no policy field's to allow.
    for p in [
        work_root.as_path(),
        std::path::Path::new("/dev/shm"),
        cfg.as_path(),
    ] {
        let d = on(p).unwrap_or_else(|| {
            panic!(
                "the kernel recorded no refusal of {}: {hostile}",
                p.display()
            )
        });
        assert_eq!(d.allowed_by, None, "{}: {hostile}", p.display());
    }
    let suggested = pol.path().join("suggested");
    let run = policy_suggest(&s.log, &file, &suggested);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let written = std::fs::read_to_string(suggested.join("policy.yaml")).expect("policy.yaml");
    let fields: Vec<&str> = written
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect();
    let cfg_dir = cfg.parent().expect("config dir").display().to_string();
    for never in [work_root.display().to_string(), "/dev/shm".into(), cfg_dir] {
        assert!(
            !fields.iter().any(|l| l.contains(&never)),
            "{never} granted:\n{written}"
        );
    }
}

#[test]
fn a_file_landlock_refused_is_named_from_the_kernels_own_record() {
    needs_root!(NEEDS_ROOT);
    // World-readable (DAC allows it), outside every readOnly path: only Landlock refuses it.
    outside_the_rules("/var/lib/cmp-warden-tests/landlock");
    let _audit = match AuditOn::enable() {
        Ok(a) => a,
        Err(e) => {
            panic!("kernel audit cannot be enabled here ({e}): this test needs CAP_AUDIT_CONTROL")
        }
    };
    let pol = tempfile::tempdir().expect("tmp");
    let file = pol.path().join("policy.yaml");
    write_policy(&file, &[]);
    let log = pol.path().join("audit.jsonl");
    let s = Server::start(
        &plugin(SPEC),
        &[
            "--policy",
            file.to_str().expect("utf8"),
            "--audit-log",
            log.to_str().expect("utf8"),
        ],
    );
    let r = repo(&[("cm.yaml", CM)]);
    let d = r.path().to_str().expect("utf8");
    let attack = [
        "-dir",
        d,
        "-env",
        "ARGOCD_ENV_MODE=landlock",
        "-app",
        "reads",
    ];
    let honest = ["-dir", d, "-app", "plain"];
    let (denied, ok) = std::thread::scope(|sc| {
        let a = sc.spawn(|| go(&s, "generate", &attack));
        let h = sc.spawn(|| go(&s, "generate", &honest));
        (a.join().expect("attack"), h.join().expect("honest"))
    });
    ok.expect("an honest request at the same time renders");
    let (code, msg) = denied.expect_err("Landlock refuses the read");
    assert_eq!(code, UNKNOWN, "{msg}");
    // The tool's own message, then the kernel's record: what, where, and the field.
    assert!(msg.contains("notes.txt: Permission denied"), "{msg}");
    // First among the refusals, though tools probe other paths too.
    assert!(
        msg.contains(
            "(the sandbox refused: fs.read_file on /var/lib/cmp-warden-tests/landlock/notes.txt (Landlock; spec.filesystem.readOnly"
        ),
        "{msg}"
    );
    let ev = events(&log, 2);
    let reads = ev.iter().find(|e| e["app"] == "reads").expect("event");
    let denials = reads["landlockDenials"]
        .as_array()
        .expect("landlockDenials");
    assert!(
        denials.iter().any(|x| x["blockers"] == "fs.read_file"
            && x["object"] == "/var/lib/cmp-warden-tests/landlock/notes.txt"
            && x["allowedBy"]
                .as_str()
                .is_some_and(|f| f.contains("readOnly"))),
        "{denials:#?}"
    );
    // The honest request at the same time is told nothing of the other's denial (records are
    // attributed by the leased UID); it may carry its own tools' harmless probes.
    let plain = ev.iter().find(|e| e["app"] == "plain").expect("event");
    assert_eq!(plain["outcome"], "ok", "{plain}");
    assert!(
        !plain["landlockDenials"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|d| d["object"]
                .as_str()
                .is_some_and(|o| o.contains("notes.txt"))),
        "{plain}"
    );
    // Start-up said it reads them.
    assert!(
        s.logs().contains("reading Landlock's denial records"),
        "{}",
        s.logs()
    );
}

#[test]
fn policy_suggest_turns_an_audit_run_into_an_enforced_policy_that_works() {
    needs_root!(NEEDS_ROOT);
    let t = tempfile::tempdir().expect("tmp");
    let cfg = t.path().join("config");
    std::fs::create_dir_all(&cfg).expect("mkdir");
    std::fs::write(cfg.join("plugin.yaml"), plugin(SPEC)).expect("plugin.yaml");
    let audit_pol = t.path().join("audit/policy.yaml");
    write_policy(&audit_pol, &[("mode: enforce}", "mode: audit}")]);
    let r = repo(&[("cm.yaml", CM)]);
    let render = |policy: &std::path::Path, log: Option<&std::path::Path>| {
        let mut c = std::process::Command::new(bin());
        c.args(["render", "--config-dir-path"])
            .arg(&cfg)
            .arg("--policy")
            .arg(policy)
            .args(["--env", "ARGOCD_ENV_MODE=unshare"]);
        if let Some(l) = log {
            c.arg("--audit-log").arg(l);
        }
        c.arg(r.path()).output().expect("render")
    };
    // 1. The audit run works and is recorded.
    let log = t.path().join("run.jsonl");
    let out = render(&audit_pol, Some(&log));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // 2. Suggest.
    let dir = t.path().join("suggested");
    let s = policy_suggest(&log, &audit_pol, &dir);
    let notes = String::from_utf8_lossy(&s.stderr);
    assert!(s.status.success(), "{notes}");
    assert!(
        notes.contains("seccomp: unshare is ALLOWED: \"unshare\" called it"),
        "{notes}"
    );
    let yaml = std::fs::read_to_string(dir.join("policy.yaml")).expect("policy.yaml");
    assert!(yaml.contains("mode: enforce"), "{yaml}");
    assert!(
        yaml.contains("limits.memoryBytes"),
        "the notes explain the limits: {yaml}"
    );
    // The base policy's own comments stay on their fields.
    assert!(
        yaml.contains("  # Leased per request; must not overlap the image's passwd/group entries.\n  uidRange:"),
        "{yaml}"
    );
    assert!(
        yaml.contains("    cpuMillis: 2000   # CPU quota, in millicores"),
        "{yaml}"
    );
    let profile = std::fs::read_to_string(dir.join("seccomp/profile.json")).expect("profile");
    assert!(!profile.contains("\"unshare\""), "{profile}");
    for still in ["\"setns\"", "\"ptrace\"", "\"bpf\"", "\"io_uring_setup\""] {
        assert!(profile.contains(still), "{still} must stay denied");
    }
    let check = std::process::Command::new(bin())
        .args(["policy", "check"])
        .arg(dir.join("policy.yaml"))
        .output()
        .expect("check");
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
    // 3. The suggested, enforced policy runs the plugin; the original enforce policy did not.
    let out = render(&dir.join("policy.yaml"), None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("ConfigMap"));
    let enforce_pol = t.path().join("enforce/policy.yaml");
    write_policy(&enforce_pol, &[]);
    let out = render(&enforce_pol, None);
    assert!(!out.status.success(), "the default profile denies unshare");
    // An empty log is refused with a reason.
    let empty = t.path().join("empty.jsonl");
    std::fs::write(&empty, "{\"level\":\"INFO\"}\n").expect("write");
    let s = std::process::Command::new(bin())
        .args(["policy", "suggest", "--audit-log"])
        .arg(&empty)
        .arg("--out")
        .arg(t.path().join("x"))
        .output()
        .expect("suggest");
    assert_eq!(s.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&s.stderr).contains("holds no audit events"));
}

#[test]
fn a_command_looping_on_a_denied_call_is_counted_not_logged_each_time() {
    needs_root!(NEEDS_ROOT);
    let pol = tempfile::tempdir().expect("tmp");
    let pol_file = pol.path().join("policy.yaml");
    write_policy(&pol_file, &[]);
    let log = pol.path().join("audit.jsonl");
    let s = Server::start(
        &plugin(SPEC),
        &[
            "--policy",
            pol_file.to_str().expect("utf8"),
            "--audit-log",
            log.to_str().expect("utf8"),
        ],
    );
    let r = repo(&[("cm.yaml", CM)]);
    let dir = r.path().to_str().expect("utf8");
    // Every one of the 5,000 calls is denied, and the request itself still succeeds.
    let v = go(
        &s,
        "generate",
        &["-dir", dir, "-env", "ARGOCD_ENV_MODE=flood"],
    )
    .expect("the flood is denied call by call; the request succeeds");
    assert_eq!(v["manifests"].as_array().map(Vec::len), Some(1));
    let ev = events(&log, 1);
    let d = ev[0]["seccompAudit"]
        .as_array()
        .and_then(|a| a.iter().find(|d| d["syscall"] == "unshare"))
        .cloned()
        .expect("unshare recorded");
    assert_eq!(d["action"], "denied");
    assert_eq!(d["count"], 5000, "{d:#}");
    let logged = s
        .logs()
        .lines()
        .filter(|l| l.contains("seccomp: denied"))
        .count();
    assert_eq!(logged, 1, "one log line per syscall, not per call");
}

#[test]
fn spans_reach_a_real_collector_joined_to_the_callers_trace() {
    needs_root!(NEEDS_ROOT);
    let collector = otlp::Collector::start();
    let dir = tempfile::tempdir().expect("tmp");
    let audit = dir.path().join("audit.jsonl");
    let address = format!("127.0.0.1:{}", collector.port);
    let s = Server::start(
        &plugin(SPEC),
        &[
            "--audit-log",
            audit.to_str().expect("utf8"),
            "--otlp-address",
            &address,
            "--otlp-headers",
            "x-tenant=cd-team",
            "--otlp-attrs",
            "deployment.environment:test",
        ],
    );
    let r = repo(&[("cm.yaml", CM)]);
    let call = |mode: &str, traceparent: Option<&str>| {
        let mut a = vec!["-dir", r.path().to_str().expect("utf8"), "-env", mode];
        if let Some(tp) = traceparent {
            a.extend(["-traceparent", tp]);
        }
        go(&s, "generate", &a)
    };
    // The caller (Argo CD's repo-server) decided not to sample: nothing is exported for it.
    let unsampled = "0af7651916cd43dd8448eb211c80319c";
    call(
        "ARGOCD_ENV_MODE=ok",
        Some(&format!("00-{unsampled}-b7ad6b7169203331-00")),
    )
    .expect("unsampled request");
    let ok_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    call(
        "ARGOCD_ENV_MODE=ok",
        Some(&format!("00-{ok_trace}-00f067aa0ba902b7-01")),
    )
    .expect("honest request");
    let fail_trace = "5c0a2b3d4e5f60718293a4b5c6d7e8f9";
    call(
        "ARGOCD_ENV_MODE=fail",
        Some(&format!("00-{fail_trace}-1111222233334444-01")),
    )
    .expect_err("a failing command");

    let spans = collector.trace(ok_trace);
    let by_name = |n: &str| -> Vec<&Value> { spans.iter().filter(|s| s["name"] == n).collect() };
    let root = by_name("plugin.ConfigManagementPluginService/GenerateManifest");
    assert_eq!(root.len(), 1, "one server span: {spans:#?}");
    let root = root[0];
    // Joined to the caller's span, as a server span of the gRPC method.
    assert_eq!(root["parentSpanId"], "00f067aa0ba902b7");
    assert_eq!(root["kind"], 2);
    assert_eq!(root["attributes"]["rpc.method"], "GenerateManifest");
    assert_eq!(root["attributes"]["rpc.grpc.status_code"], 0);
    assert_eq!(root["status"]["code"], 0);
    assert_eq!(root["resource"]["service.name"], "argocd-cmp-server");
    assert_eq!(root["resource"]["deployment.environment"], "test");
    assert_eq!(root["metadata"]["x-tenant"], "cd-team");
    // Each stage a child of it, within its time.
    for name in ["cmp.ReceiveRepoStream", "cmp.Untgz", "cmp.reply"] {
        assert_eq!(by_name(name).len(), 1, "{name}: {spans:#?}");
    }
    let commands = by_name("plugin.runCommand");
    let phases: Vec<&str> = commands
        .iter()
        .map(|c| c["attributes"]["cmp.phase"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(phases, ["init", "generate"], "{spans:#?}");
    assert!(
        commands
            .iter()
            .all(|c| c["attributes"]["process.exit.code"] == 0)
    );
    let (start, end) = (root["start"].as_u64(), root["end"].as_u64());
    for child in spans.iter().filter(|s| s["spanId"] != root["spanId"]) {
        assert_eq!(child["parentSpanId"], root["spanId"], "{child}");
        assert_eq!(child["kind"], 1, "{child}");
        assert!(
            child["start"].as_u64() >= start && child["end"].as_u64() <= end,
            "{child} outside {root}"
        );
    }

    // A failure: the server span says how it ended, the command span which command failed.
    let failed = collector.trace(fail_trace);
    let root = failed
        .iter()
        .find(|s| s["kind"] == 2)
        .unwrap_or_else(|| panic!("no server span: {failed:#?}"));
    assert_eq!(root["status"]["code"], 2, "{root}");
    assert_eq!(root["attributes"]["rpc.grpc.status_code"], 2, "{root}");
    assert!(
        !root["status"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains(URL_PASSWORD),
        "{root}"
    );
    let generate = failed
        .iter()
        .find(|s| s["attributes"]["cmp.phase"] == "generate")
        .unwrap_or_else(|| panic!("no generate span: {failed:#?}"));
    assert_eq!(generate["attributes"]["process.exit.code"], 3);
    assert_eq!(generate["status"]["code"], 2);

    // Batches arrive in order: the later traces are in, so the unsampled one never will be.
    assert!(
        !collector
            .spans
            .lock()
            .expect("lock")
            .iter()
            .any(|s| s["traceId"] == unsampled)
    );
    // The audit event names the trace, for the way from an event to its spans; the unsampled
    // request's event names its caller's trace too (exported or not, the event is found from
    // the caller's trace).
    let ev = events(&audit, 3);
    let trace_ids: Vec<&str> = ev.iter().filter_map(|e| e["traceId"].as_str()).collect();
    assert_eq!(trace_ids.len(), 3, "{ev:#?}");
    for t in [ok_trace, fail_trace, unsampled] {
        assert!(trace_ids.contains(&t), "{t}: {ev:#?}");
    }
}

/// The SDKs' standard environment alone (as the OpenTelemetry Operator injects it, no
/// `--otlp-*` flag): spans reach the collector it names, with its service name, resource
/// attributes and headers.
#[test]
fn the_otel_environment_alone_exports_spans() {
    needs_root!(NEEDS_ROOT);
    let collector = otlp::Collector::start();
    let endpoint = format!("http://127.0.0.1:{}", collector.port);
    let s = Server::start_env(
        &plugin(SPEC),
        &[],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_SERVICE_NAME", "cmp-from-env"),
            (
                "OTEL_RESOURCE_ATTRIBUTES",
                "deployment.environment=staging,team=a%2Cb",
            ),
            ("OTEL_EXPORTER_OTLP_HEADERS", "x-tenant=env%20team"),
        ],
    );
    let r = repo(&[("cm.yaml", CM)]);
    let trace = "6e0c63257de34c92bf9efcd03927272e";
    go(
        &s,
        "generate",
        &[
            "-dir",
            r.path().to_str().expect("utf8"),
            "-env",
            "ARGOCD_ENV_MODE=ok",
            "-traceparent",
            &format!("00-{trace}-00f067aa0ba902b7-01"),
        ],
    )
    .expect("honest request");
    let spans = collector.trace(trace);
    let root = spans
        .iter()
        .find(|s| s["kind"] == 2)
        .unwrap_or_else(|| panic!("no server span: {spans:#?}"));
    assert_eq!(root["resource"]["service.name"], "cmp-from-env", "{root}");
    assert_eq!(root["resource"]["deployment.environment"], "staging");
    assert_eq!(root["resource"]["team"], "a,b");
    assert_eq!(root["metadata"]["x-tenant"], "env team");
    assert!(
        s.logs()
            .contains("\"from\":\"OTEL_EXPORTER_OTLP_ENDPOINT\""),
        "{}",
        s.logs()
    );
}

/// The monitoring kit (deploy/monitoring): promtool accepts the PrometheusRule's rules and its
/// unit tests (each alert fires on the series that should fire it), and every metric the rules
/// and the Grafana dashboard name is one a running server exports.
#[test]
fn the_monitoring_kit_names_only_exported_metrics_and_its_alerts_fire() {
    needs_root!(NEEDS_ROOT);
    let kit = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/monitoring");
    let rule = std::fs::read_to_string(kit.join("prometheusrule.yaml")).expect("rule");
    let dashboard = std::fs::read_to_string(kit.join("grafana-dashboard.json")).expect("dashboard");
    let _: Value = serde_json::from_str(&dashboard).expect("the dashboard is JSON");
    // The PrometheusRule's spec is a Prometheus rules file, indented by two.
    let (_, spec) = rule.split_once("\nspec:\n").expect("spec");
    let t = tempfile::tempdir().expect("tmp");
    let rules: String = spec
        .lines()
        .map(|l| format!("{}\n", l.strip_prefix("  ").unwrap_or(l)))
        .collect();
    std::fs::write(t.path().join("rules.yaml"), rules).expect("write");
    std::fs::copy(kit.join("tests.yaml"), t.path().join("tests.yaml")).expect("copy");
    for args in [
        &["check", "rules", "rules.yaml"][..],
        &["test", "rules", "tests.yaml"],
    ] {
        let out = std::process::Command::new("promtool")
            .args(args)
            .current_dir(t.path())
            .output()
            .expect("promtool (Debian's prometheus package; scripts/setup installs it)");
        assert!(
            out.status.success(),
            "promtool {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    // What a server with the default policy exports, after one request.
    let pol = tempfile::tempdir().expect("tmp");
    let pol_file = pol.path().join("policy.yaml");
    write_policy(&pol_file, &[]);
    let s = Server::start(
        &plugin(SPEC),
        &[
            "--policy",
            pol_file.to_str().expect("utf8"),
            "--metrics-address",
            "127.0.0.1:0",
        ],
    );
    let r = repo(&[("cm.yaml", CM)]);
    go(
        &s,
        "generate",
        &[
            "-dir",
            r.path().to_str().expect("utf8"),
            "-env",
            "ARGOCD_ENV_MODE=ok",
        ],
    )
    .expect("honest request");
    let body = s.metrics();
    let mut exported = std::collections::BTreeSet::new();
    for l in body.lines() {
        let Some(rest) = l.strip_prefix("# TYPE ") else {
            continue;
        };
        let (name, kind) = rest.split_once(' ').expect("TYPE line");
        exported.insert(name.to_owned());
        if kind == "histogram" {
            for suffix in ["_bucket", "_sum", "_count"] {
                exported.insert(format!("{name}{suffix}"));
            }
        }
    }
    let mut named = std::collections::BTreeSet::new();
    for text in [&rule, &dashboard] {
        for (i, _) in text.match_indices(['c', 'p']) {
            let rest = &text[i..];
            if !(rest.starts_with("cmp_warden_") || rest.starts_with("process_")) {
                continue;
            }
            if i > 0 && text[..i].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_') {
                continue;
            }
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            named.insert(rest[..end].to_owned());
        }
    }
    assert!(named.len() >= 15, "{named:?}");
    let missing: Vec<_> = named.difference(&exported).collect();
    assert!(missing.is_empty(), "not exported: {missing:?}\n{body}");
}

/// The end of an error is where a reader looks for its cause. A command that failed on its
/// own gets the server variables it did not get, only those its own words or argv name (here
/// `VAULT_TOKEN`, spelled so that only its message names it, among some fifty withheld test
/// variables: mutant, every withheld name listed
/// -> others follow it), and none when it named none (the full list is in the audit event);
/// a request a limit ended gets no such note (the limit is the cause: mutant, the note on
/// every failed command -> the wall clock's error ends with it); a tool out of heap gets the
/// per-process limit that refused the allocation, `spec.limits.dataBytes`, not the request's
/// memory (mutant: no such hint).
#[test]
fn an_errors_end_names_its_cause() {
    needs_root!(NEEDS_ROOT);
    const FAILS: &str = "  generate:\n    command: [sh, -c]\n    args:\n      - |\n        case \"$ARGOCD_ENV_MODE\" in\n          token) echo \"error: $(printf VAULT_%s TOKEN) is not set\" >&2; exit 1 ;;\n          quiet) echo \"render failed\" >&2; exit 3 ;;\n          hang) sleep 60 ;;\n          heap) exec /usr/bin/python3 -c 'b = bytearray(2 << 30)' ;;\n        esac\n        cat cm.yaml\n";
    let pol = tempfile::tempdir().expect("tmp");
    let pol_file = pol.path().join("policy.yaml");
    write_policy(&pol_file, &[("wallSeconds: 300", "wallSeconds: 2")]);
    let s = Server::start_env(
        &plugin(FAILS),
        &["--policy", pol_file.to_str().expect("utf8")],
        &[("VAULT_TOKEN", "s.not-for-commands")],
    );
    let r = repo(&[("cm.yaml", "kind: ConfigMap\n")]);
    let dir = r.path().to_str().expect("utf8");
    let run = |mode: &str| {
        go(
            &s,
            "generate",
            &["-dir", dir, "-env", &format!("ARGOCD_ENV_MODE={mode}")],
        )
        .expect_err(mode)
    };
    let (_, msg) = run("token");
    assert!(
        msg.contains(
            "(server variables not passed to commands: VAULT_TOKEN; spec.env.pass allows them)"
        ),
        "{msg}"
    );
    let (_, msg) = run("quiet");
    assert!(
        msg.contains("render failed") && !msg.contains("server variables"),
        "{msg}"
    );
    let (code, msg) = run("hang");
    assert_eq!(code, DEADLINE_EXCEEDED, "{msg}");
    assert!(
        msg.contains("spec.limits.wallSeconds") && !msg.contains("server variables"),
        "{msg}"
    );
    let (_, msg) = run("heap");
    assert!(
        msg.contains("MemoryError")
            && msg.ends_with(
                "(an allocation was refused: each process's heap is bounded by policy spec.limits.dataBytes: 1073741824; spec.limits.memoryBytes bounds the request as a whole)"
            ),
        "{msg}"
    );
    assert!(
        !s.logs().contains("s.not-for-commands"),
        "the value is logged"
    );
}

/// One line per request, however it ended (docs/audit.md): each RPC of the CMP service, and the
/// streams refused before any sandbox (not gzip, a checksum that does not match), each get
/// exactly one event naming its RPC, its code as the caller saw it and, for a refusal, the
/// archive as its cause; an honest request among them renders and is audited as well (mutant:
/// the accounting of a refused stream skipped -> 3 events of 5).
#[test]
fn every_rpc_and_every_stream_refused_before_a_sandbox_is_audited_once() {
    needs_root!(NEEDS_ROOT);
    let pol = tempfile::tempdir().expect("tmp");
    let file = pol.path().join("policy.yaml");
    write_policy(&file, &[]);
    let s = Server::start(&plugin(SPEC), &["--policy", file.to_str().expect("utf8")]);
    let r = repo(&[("cm.yaml", CM)]);
    let d = r.path().to_str().expect("utf8");
    go(&s, "match", &["-dir", d, "-app", "matched"]).expect("match");
    go(&s, "params", &["-dir", d, "-app", "announced"]).expect("params");
    let junk = pol.path().join("junk.tgz");
    std::fs::write(&junk, b"not a gzip stream at all\n").expect("write");
    let (junk_code, msg) = go(
        &s,
        "generate",
        &["-tgz", junk.to_str().expect("utf8"), "-app", "junk"],
    )
    .expect_err("not gzip");
    assert_eq!(junk_code, DATA_LOSS, "{msg}");
    assert!(msg.contains("not gzip data"), "{msg}");
    let zeros = "0".repeat(64);
    let (sum_code, msg) = go(
        &s,
        "generate",
        &["-dir", d, "-checksum", &zeros, "-app", "mismatch"],
    )
    .expect_err("checksum");
    assert_eq!(sum_code, DATA_LOSS, "{msg}");
    let v = go(&s, "generate", &["-dir", d, "-app", "honest"]).expect("an honest request renders");
    assert_eq!(v["manifests"].as_array().map(Vec::len), Some(1), "{v}");

    let ev = s.audited(5);
    let by_app: BTreeMap<&str, &audit_event::AuditEvent> =
        ev.iter().map(|e| (e.app.as_str(), e)).collect();
    assert_eq!(ev.len(), 5, "one event per request: {ev:#?}");
    assert_eq!(by_app.len(), 5, "{ev:#?}");
    let ids: std::collections::BTreeSet<&str> = ev.iter().map(|e| e.request_id.as_str()).collect();
    assert_eq!(ids.len(), 5, "{ev:#?}");
    let seen = |app: &str| {
        let e = by_app[app];
        (e.rpc.as_str(), e.code.as_str(), e.limit.map(|l| l.as_str()))
    };
    assert_eq!(seen("matched"), ("MatchRepository", "Ok", None));
    assert_eq!(seen("announced"), ("GetParametersAnnouncement", "Ok", None));
    assert_eq!(
        seen("junk"),
        ("GenerateManifest", "DataLoss", Some("archive"))
    );
    assert_eq!(
        seen("mismatch"),
        ("GenerateManifest", "DataLoss", Some("archive"))
    );
    assert_eq!(seen("honest"), ("GenerateManifest", "Ok", None));
    for app in ["junk", "mismatch"] {
        let e = by_app[app];
        assert!(e.commands.is_empty(), "{e:#?}");
        assert_eq!(e.outcome, "error", "{e:#?}");
        assert!(e.error.as_deref().is_some_and(|m| !m.is_empty()), "{e:#?}");
    }
}
