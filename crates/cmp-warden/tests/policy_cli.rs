//! `cmp-warden policy check` as an operator runs it.

mod common;

use std::process::Command;

fn bin() -> Command {
    Command::new(common::bin())
}

#[test]
fn checks_the_embedded_default_and_prints_the_effective_policy() {
    let out = bin().args(["policy", "check"]).output().expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["name"], "default");
    assert_eq!(v["limits"]["memoryBytes"], 1u64 << 30);
    assert_eq!(
        v["require"],
        serde_json::json!(["uniqueUid", "noNewPrivs", "landlock", "seccomp"])
    );
    assert_eq!(v["sha256"].as_str().map(str::len), Some(64));
}

#[test]
fn refuses_malformed_policies_with_the_field_named() {
    let d = tempfile::tempdir().expect("tmp");
    let f = d.path().join("p.yaml");
    let default = include_str!("../../../policies/default.yaml");
    for (from, to, msg) in [
        (
            "network: {mode: none}",
            "network: {mode: none, ports: all}",
            "unknown field `ports`",
        ),
        (
            "network: {mode: none}",
            "network: {mode: none, allow: [{host: a.example, ports: [443]}]}",
            "spec.network: allow, audit, hosts, maxConnections and searchDomains apply only to mode: allowList",
        ),
        (
            "wallSeconds: 300",
            "wallSeconds: 0",
            "spec.limits.wallSeconds: must be at least 1",
        ),
        ("first: 20000", "first: 10", "spec.uidRange.first"),
    ] {
        std::fs::write(&f, default.replacen(from, to, 1)).expect("write");
        let out = bin()
            .args(["policy", "check"])
            .arg(&f)
            .output()
            .expect("run");
        assert_eq!(out.status.code(), Some(1));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.starts_with("invalid: policy:") && err.contains(msg),
            "{err}"
        );
        assert!(out.stdout.is_empty());
    }
    let out = bin()
        .args(["policy", "check"])
        .arg(d.path().join("missing.yaml"))
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
}

/// `policy check` of the default policy with `network` for its network line (its seccomp
/// profile beside it), which must pass: its output, stderr and warning lines.
fn check_with_network(network: &str) -> (std::process::Output, String, Vec<String>) {
    let d = tempfile::tempdir().expect("tmp");
    let f = d.path().join("p.yaml");
    let default = include_str!("../../../policies/default.yaml");
    assert!(default.contains("network: {mode: none}"), "policy fixture");
    std::fs::write(&f, default.replacen("network: {mode: none}", network, 1)).expect("write");
    std::fs::create_dir_all(d.path().join("seccomp")).expect("mkdir");
    std::fs::write(
        d.path().join("seccomp/default.json"),
        include_str!("../../../policies/seccomp/default.json"),
    )
    .expect("profile");
    let out = bin()
        .args(["policy", "check"])
        .arg(&f)
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{err}");
    let warnings = err
        .lines()
        .filter(|l| l.starts_with("warning:"))
        .map(str::to_owned)
        .collect();
    (out, err, warnings)
}

/// A cidr entry that covers loopback and the metadata address without `internal: true` is
/// valid (those addresses stay refused) and the reviewer is told which, naming the entry.
#[test]
fn a_cidr_entry_covering_loopback_and_link_local_is_named_in_a_warning() {
    let (out, err, warnings) = check_with_network(
        "network: {mode: allowList, allow: [{host: vault.example, ports: [8200]}, {cidr: 0.0.0.0/0, ports: [443]}, {cidr: 10.0.0.0/8, ports: [443]}, {cidr: '::/0', ports: [443], internal: true}], searchDomains: true}",
    );
    assert_eq!(warnings.len(), 1, "{err}");
    assert!(
        warnings[0]
            .starts_with("warning: policy: spec.network.allow[1]: cidr 0.0.0.0/0 covers loopback")
            && warnings[0].contains("169.254.169.254")
            && warnings[0].contains("internal: true"),
        "{err}"
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["egress"]["searchDomains"], true, "{v}");
}

/// `audit: true` lets everything through: `policy check` says so, and that it is for learning
/// (mutant: no warning for audit mode -> none printed).
#[test]
fn audit_mode_is_named_in_a_warning() {
    let (_, err, warnings) = check_with_network("network: {mode: allowList, audit: true}");
    assert_eq!(
        warnings,
        [format!("warning: policy: {}", vocab::egress::AUDIT_WARNING)],
        "{err}"
    );
}

#[test]
fn the_seccomp_profile_is_checked_with_the_policy() {
    let d = tempfile::tempdir().expect("tmp");
    let f = d.path().join("p.yaml");
    std::fs::write(&f, include_str!("../../../policies/default.yaml")).expect("write");
    // No profile beside the policy.
    let out = bin()
        .args(["policy", "check"])
        .arg(&f)
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("spec.seccomp.profile: cannot read"), "{err}");
    // A profile naming a syscall this architecture does not have.
    std::fs::create_dir_all(d.path().join("seccomp")).expect("mkdir");
    let profile = include_str!("../../../policies/seccomp/default.json");
    std::fs::write(
        d.path().join("seccomp/default.json"),
        profile.replacen("\"bpf\"", "\"bpf_everything\"", 1),
    )
    .expect("write");
    let out = bin()
        .args(["policy", "check"])
        .arg(&f)
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bpf_everything"), "{err}");
    // A rule without a reason.
    std::fs::write(
        d.path().join("seccomp/default.json"),
        profile.replacen(
            "\"reason\": \"No new namespaces",
            "\"reason\": \" \", \"x\": \"",
            1,
        ),
    )
    .expect("write");
    let out = bin()
        .args(["policy", "check"])
        .arg(&f)
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    // The real profile: accepted, and printed with the policy.
    std::fs::write(d.path().join("seccomp/default.json"), profile).expect("write");
    let out = bin()
        .args(["policy", "check"])
        .arg(&f)
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["seccomp"]["name"], "default");
    assert!(
        v["seccomp"]["rules"]
            .as_array()
            .is_some_and(|r| r.len() > 10)
    );
}

/// `policy check | head`: a reader that goes away ends the output quietly (it once panicked on
/// the closed pipe). The reading end is closed before the command writes.
#[test]
fn a_closed_stdout_ends_the_output_without_a_panic() {
    for args in [&["policy", "check"][..], &["doctor", "--json"][..]] {
        let (reader, writer) = std::io::pipe().expect("pipe");
        drop(reader);
        let out = bin()
            .args(args)
            .stdout(writer)
            .stderr(std::process::Stdio::piped())
            .output()
            .expect("run");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(!err.contains("Broken pipe"), "{args:?}: {err}");
    }
}

/// Errors point at the YAML the operator wrote (its line and the field path), not at a
/// position in the JSON it is converted to.
#[test]
fn errors_name_the_yaml_line_and_field_path() {
    let d = tempfile::tempdir().expect("tmp");
    let f = d.path().join("p.yaml");
    let default = include_str!("../../../policies/default.yaml");
    let line_of = |text: &str, needle: &str| {
        text.lines()
            .position(|l| l.contains(needle))
            .expect("needle")
            + 1
    };
    let block_allow = "network:\n    mode: allowList\n    allow:\n      - host: a.example\n        ports: [443]\n      - host: b.example\n        port: 443\n";
    for (from, to, needle, want) in [
        (
            "memoryBytes: 1Gi",
            "memoryByte: 1Gi",
            "memoryByte:",
            "spec.limits.memoryByte: unknown field `memoryByte`",
        ),
        ("pids: 512", "pids: [512]", "pids:", "spec.limits.pids: "),
        (
            "network: {mode: none}",
            block_allow,
            "port: 443",
            "spec.network.allow[1].port: unknown field `port`",
        ),
        (
            "count: 40000",
            "count: 0",
            "count: 0",
            "spec.uidRange.count: must be at least 1",
        ),
    ] {
        let text = default.replacen(from, to, 1);
        assert_ne!(text, default, "{from}");
        std::fs::write(&f, &text).expect("write");
        let out = bin()
            .args(["policy", "check"])
            .arg(&f)
            .output()
            .expect("run");
        assert_eq!(out.status.code(), Some(1));
        let err = String::from_utf8_lossy(&out.stderr);
        let line = line_of(&text, needle);
        assert!(
            err.contains(&format!("line {line}, {want}")) && !err.contains("column"),
            "{to}: want line {line}, {want}; got {err}"
        );
    }
}

/// A policy directory loads `*.yml` as it loads `*.yaml` (the fourth attack round: a tenant's
/// `team-b.yml` was dropped and its project ran under the default while `policy check` said
/// nothing), and `policy check DIR` names every file it skips.
#[test]
fn a_policy_directory_loads_yml_and_policy_check_names_what_it_skips() {
    let d = tempfile::tempdir().expect("tmp");
    std::fs::create_dir_all(d.path().join("seccomp")).expect("mkdir");
    std::fs::write(
        d.path().join("seccomp/default.json"),
        include_str!("../../../policies/seccomp/default.json"),
    )
    .expect("profile");
    let default = include_str!("../../../policies/default.yaml");
    std::fs::write(d.path().join("default.yaml"), default).expect("write");
    let team = common::selected_policy(default, "team-b", "team-b");
    std::fs::write(d.path().join("team-b.yml"), team).expect("write");
    std::fs::write(d.path().join("notes.txt"), "not a policy\n").expect("write");
    let out = bin()
        .args(["policy", "check"])
        .arg(d.path())
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let names: Vec<&str> = v
        .as_array()
        .expect("policies")
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect();
    assert_eq!(names, ["default", "team-b"], "{err}");
    assert!(
        err.contains("skipped: notes.txt: not *.yaml or *.yml"),
        "{err}"
    );
    assert!(err.contains("policy \"team-b\" runs requests of"), "{err}");
}

/// `policy suggest` lowers a limit to what the runs needed only when every run finished: a
/// request that failed after 135 ms says nothing of how long a finished one takes (once, it
/// proposed wallSeconds 30, which then killed a 35 s init). Mutant: the failed run's figures
/// used as a finished one's -> wallSeconds 30.
#[test]
fn suggest_never_lowers_a_limit_from_runs_that_did_not_finish() {
    let d = tempfile::tempdir().expect("tmp");
    let event = |outcome: &str| {
        format!(
            r#"{{"log":"audit","schema":"cmp-warden.audit/v1","rpc":"GenerateManifest","app":"a","outcome":"{outcome}","durationMs":135,"peakMemoryBytes":1048576,"commands":[{{"phase":"generate","argv":["sh"],"exitCode":{},"durationMs":120,"peakRssBytes":1048576,"stdoutBytes":10,"stderrBytes":10}}]}}"#,
            if outcome == "ok" { 0 } else { 1 }
        )
    };
    let suggest = |name: &str, events: &[String]| -> String {
        let log = d.path().join(format!("{name}.jsonl"));
        std::fs::write(&log, events.join("\n") + "\n").expect("log");
        let out = d.path().join(name);
        let run = bin()
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
        std::fs::read_to_string(out.join("policy.yaml")).expect("policy.yaml")
    };
    // The request wall clock (spec.limits', the first wallSeconds; the archive's follows).
    let wall = |text: &str| -> Option<String> {
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .find_map(|l| l.trim_start().strip_prefix("wallSeconds: "))
            .and_then(|v| v.split_whitespace().next())
            .map(str::to_owned)
    };
    // Finished runs: room above what they needed (x3, at least 30 s).
    let finished = suggest("finished", &[event("ok")]);
    assert_eq!(wall(&finished).as_deref(), Some("30"), "{finished}");
    // One of them failed: the input's 300 s stays, and the note says why.
    let failed = suggest("failed", &[event("ok"), event("error")]);
    assert_eq!(wall(&failed).as_deref(), Some("300"), "{failed}");
    assert!(
        failed.contains("limits.wallSeconds: 300 kept")
            && failed.contains("1 request(s) did not finish"),
        "{failed}"
    );
}
