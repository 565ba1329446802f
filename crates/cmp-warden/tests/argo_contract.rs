//! Argo CD's own cmp-server tests (`cmpserver/plugin/plugin_test.go`, `config_test.go`,
//! `util/cmp/stream_test.go`, `util/io/files/tar_test.go`), run against the real binary over a real
//! socket with a grpc-go client that dials and packs exactly as the repo-server does.

mod common;

use common::*;
use serde_json::json;

/// Argo's `testdata/kustomize` fixture (kustomize itself replaced by `cat`, same output).
fn kustomize_repo() -> tempfile::TempDir {
    repo(&[
        ("kustomization.yaml", "resources:\n- cm.yaml\n"),
        (
            "cm.yaml",
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: my-map\ndata:\n  foo: bar\n",
        ),
        ("config/plugin.yaml", "placeholder: true\n"),
    ])
}

const CM_JSON: &str =
    r#"{"apiVersion":"v1","data":{"foo":"bar"},"kind":"ConfigMap","metadata":{"name":"my-map"}}"#;

fn match_with(discover: &str, env: &[&str]) -> CallResult {
    let s = Server::start(
        &plugin(&format!(
            "  generate:\n    command: [cat, cm.yaml]\n  discover:\n{discover}"
        )),
        &[],
    );
    let r = kustomize_repo();
    let mut args = vec!["-dir", r.path().to_str().expect("utf8")];
    for e in env {
        args.extend(["-env", e]);
    }
    let out = go(&s, "match", &args);
    s.assert_work_dir_empties();
    out
}

fn supported(r: CallResult) -> (bool, bool) {
    let v = r.unwrap_or_else(|e| panic!("match failed: {e:?}"));
    (
        v["isSupported"].as_bool().expect("bool"),
        v["isDiscoveryEnabled"].as_bool().expect("bool"),
    )
}

#[test]
fn match_repository_cases() {
    assert_eq!(
        supported(match_with("    fileName: kustomization.yaml\n", &[])),
        (true, true),
        "match by filename"
    );
    assert_eq!(
        supported(match_with(
            "    fileName: kustomization_missing.yaml\n",
            &[]
        )),
        (false, true)
    );
    let (code, msg) = match_with("    fileName: '['\n", &[]).expect_err("syntax error");
    assert_eq!(code, UNKNOWN);
    assert!(msg.contains("syntax error"), "{msg}");
    assert_eq!(
        supported(match_with(
            "    find:\n      glob: '**/*/plugin.yaml'\n",
            &[]
        )),
        (true, true),
        "match by glob"
    );
    assert_eq!(
        supported(match_with(
            "    find:\n      glob: '**/*/plugin_missing.yaml'\n",
            &[]
        )),
        (false, true)
    );
    let (_, msg) =
        match_with("    find:\n      glob: does-not-exist\n", &[]).expect_err("bad pattern");
    assert!(
        msg.contains("error finding glob match for pattern"),
        "{msg}"
    );
    assert_eq!(
        supported(match_with("    find:\n      command: [echo, test]\n", &[])),
        (true, true)
    );
    assert_eq!(
        supported(match_with("    find:\n      command: [echo]\n", &[])),
        (false, true)
    );
    let env_cmd = "    find:\n      command: [sh, -c, 'echo -n $ENV_VAR']\n";
    assert_eq!(
        supported(match_with(env_cmd, &["ENV_VAR=1"])),
        (true, true),
        "env var defined"
    );
    assert_eq!(
        supported(match_with(env_cmd, &[])),
        (false, true),
        "env var not defined"
    );
    let (code, msg) =
        match_with("    find:\n      command: [cat, nil]\n", &[]).expect_err("command fails");
    assert_eq!(code, UNKNOWN);
    assert!(
        msg.starts_with(
            "match repository error: error running find command: `cat nil` failed exit status 1"
        ),
        "{msg}"
    );
    // Precedence: glob wins over command (TestService_MatchRepository's config sets both).
    assert_eq!(
        supported(match_with(
            "    find:\n      command: [sh, -c, 'exit 1']\n      glob: '**/kustomization.yaml'\n",
            &[]
        )),
        (true, true)
    );
    let s = Server::start(&plugin("  generate:\n    command: [cat, cm.yaml]\n"), &[]);
    let r = kustomize_repo();
    assert_eq!(
        supported(go(&s, "match", &["-dir", r.path().to_str().expect("utf8")])),
        (false, false),
        "no discovery"
    );
}

#[test]
fn generate_manifest_cases() {
    let r = kustomize_repo();
    let dir = r.path().to_str().expect("utf8");
    let s = Server::start(
        &plugin(
            "  init:\n    command: [sh, -c, 'test -f kustomization.yaml']\n  generate:\n    command: [cat, cm.yaml]\n",
        ),
        &[],
    );
    // The socket path itself, as grpc-go before 1.58 derived it from the dial target (Argo CD
    // v2's clients); what grpc-go derives now ("" here: Argo CD v3.5.7's grpc-go 1.84); and the
    // percent-encoded forms of the releases between.
    let raw = s.sock.display().to_string();
    for auth in [
        raw.as_str(),
        "",
        "%2Fhome%2Fargocd%2Fcmp-server%2Fplugins%2Ftest.sock",
        "home%2Fargocd%2Fcmp-server%2Fplugins%2Ftest.sock",
    ] {
        let v = go(&s, "generate", &["-dir", dir, "-authority", auth]).expect("generate");
        assert_eq!(
            v,
            json!({"manifests": [CM_JSON], "sourceType": ""}),
            "authority {auth:?}"
        );
    }
    // The same archive four times: with the tree cache on (the default) the first request
    // filled the tree and the others ran on it; with it off (CMP_WARDEN_TEST_TREE_CACHE=off,
    // scripts/test's second run) each extracted its own. Either way the answers above are
    // Argo's.
    let trees = s.tree_cache_uses(4);
    let want = if tree_cache_under_test() {
        vec![json!("filled"), json!("hit"), json!("hit"), json!("hit")]
    } else {
        vec![serde_json::Value::Null; 4]
    };
    assert_eq!(trees, want, "treeCache of the four requests");
    // The raw socket path really was the authority, and was rewritten.
    assert!(
        s.logs()
            .contains(&format!("\"original\":\"{}\"", s.sock.display())),
        "raw path authority not seen"
    );
    assert!(
        s.logs().contains("%2Fhome%2Fargocd"),
        "encoded authority not seen"
    );
    s.assert_work_dir_empties();

    let s = Server::start(&plugin("  generate:\n    command: [bad-command]\n"), &[]);
    let (code, msg) = go(&s, "generate", &["-dir", dir]).expect_err("bad command");
    assert_eq!(code, UNKNOWN);
    assert!(msg.contains("executable file not found"), "{msg}");

    let s = Server::start(
        &plugin("  generate:\n    command: [sh, -c, 'echo \"invalid yaml: }\"']\n"),
        &[],
    );
    let (code, msg) = go(&s, "generate", &["-dir", dir]).expect_err("bad yaml");
    assert_eq!(code, UNKNOWN);
    assert!(msg.contains("failed to unmarshal manifest"), "{msg}");
    s.assert_work_dir_empties();

    // go-yaml's words, as Argo CD's own server returns them.
    let s = Server::start(
        &plugin("  generate:\n    command: [sh, -c, 'printf \"kind: A\\nb: c: d\\n\"']\n"),
        &[],
    );
    let (code, msg) = go(&s, "generate", &["-dir", dir]).expect_err("bad yaml");
    assert_eq!(code, UNKNOWN);
    assert_eq!(
        msg,
        "error generating manifests: failed to unmarshal manifest: error converting YAML to JSON: yaml: line 2: mapping values are not allowed in this context"
    );
}

/// The deadline kills the command's whole group — the foreground command and what it started
/// in the background — whichever deadline it is: the client's (`grpc-timeout`, as Argo CD's own
/// test) or the policy's wall clock. Each run's processes carry a marker of their own, so the
/// check is exact; the request's audit event says the command was ended by the timeout.
#[test]
fn generate_deadline_kills_the_group() {
    let r = kustomize_repo();
    for (case, timeout, wall) in [("client", "1s", None), ("policy", "60s", Some("1"))] {
        let marker = format!("3{}.{}", std::process::id() % 1000, case.len());
        let spec =
            format!("  generate:\n    command: [sh, -c, 'sleep {marker} & sleep {marker}']\n");
        let d = tempfile::tempdir().expect("tmp");
        let pol = d.path().join("policy/policy.yaml");
        let edit = wall.map(|w| ("wallSeconds: 300", format!("wallSeconds: {w}")));
        let edits: Vec<(&str, &str)> = edit.iter().map(|(a, b)| (*a, b.as_str())).collect();
        write_policy(&pol, &edits);
        let s = Server::start(&plugin(&spec), &["--policy", pol.to_str().expect("utf8")]);
        go_client(); // built once per test binary: not part of the measured time
        let t = std::time::Instant::now();
        let (code, msg) = go(
            &s,
            "generate",
            &[
                "-dir",
                r.path().to_str().expect("utf8"),
                "-timeout",
                timeout,
            ],
        )
        .expect_err("deadline");
        assert_eq!(code, DEADLINE_EXCEEDED, "{case}: {msg}");
        // A liveness bound: the commands sleep for an hour.
        assert!(t.elapsed() < LIVENESS, "{case}: took {:?}", t.elapsed());
        s.assert_work_dir_empties();
        // Neither `sleep` survives the request.
        let left = std::process::Command::new("pgrep")
            .args(["-f", &format!("sleep {marker}")])
            .output()
            .expect("pgrep");
        assert!(
            left.stdout.is_empty(),
            "{case}: the group survived: {}",
            String::from_utf8_lossy(&left.stdout)
        );
        let audit = s
            .logs()
            .lines()
            .find(|l| l.contains("\"log\":\"audit\""))
            .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("json"))
            .expect("audit event");
        // Audited once the jail is done, so the event says what ran and who ran it (at the
        // client's deadline the server answers at once and cancels; at its own wall clock the
        // jail ends the command and says so).
        // Which deadline: the client's (Argo CD's own timeout) or the policy's wall clock
        // (mutant: the client's named as ours -> "timeout").
        let ended = &audit["commands"][0]["endedBy"];
        let (want, limit): (&[&str], &str) = if case == "client" {
            (&["clientDeadline", "cancelled"], "clientDeadline")
        } else {
            (&["timeout"], "timeout")
        };
        assert!(want.iter().any(|w| ended == *w), "{case}: {audit}");
        assert!(audit["uid"].is_u64(), "{case}: {audit}");
        assert_eq!(audit["limit"], limit, "{case}: {audit}");
        // Start-up, the request, its cancellation and reclaim, as Argo's pipelines read logs.
        s.assert_logs_are_logrus_json();
    }
}

#[test]
fn out_of_bounds_app_path() {
    let r = kustomize_repo();
    let s = Server::start(&plugin("  generate:\n    command: [cat, cm.yaml]\n"), &[]);
    for rpc in ["generate", "params", "match"] {
        let (code, msg) = go(
            &s,
            rpc,
            &[
                "-dir",
                r.path().to_str().expect("utf8"),
                "-app-rel-path",
                "../out-of-bounds",
            ],
        )
        .expect_err("oob");
        assert_eq!(code, INVALID_ARGUMENT, "{rpc}");
        assert_eq!(msg, "illegal appPath: out of workDir bound");
    }
    s.assert_work_dir_empties();
}

const STATIC_PARAMS: &str =
    "  parameters:\n    static:\n      - name: static-a\n      - name: static-b\n";

fn params_with(dynamic: &str, env: &[&str]) -> CallResult {
    let spec =
        format!("  generate:\n    command: [cat, cm.yaml]\n{STATIC_PARAMS}    dynamic:\n{dynamic}");
    let s = Server::start(&plugin(&spec), &[]);
    let r = kustomize_repo();
    let mut args = vec!["-dir", r.path().to_str().expect("utf8")];
    for e in env {
        args.extend(["-env", e]);
    }
    go(&s, "params", &args)
}

fn names(v: &serde_json::Value) -> Vec<String> {
    v["parameterAnnouncements"]
        .as_array()
        .expect("list")
        .iter()
        .map(|p| p["name"].as_str().expect("name").to_owned())
        .collect()
}

#[test]
fn parameters_announcement_cases() {
    assert_eq!(
        names(&params_with("      command: [echo, '[]']\n", &[]).expect("ok")),
        ["static-a", "static-b"]
    );
    let dynamic = r#"      command: [sh, -c, 'echo "[{\"name\": \"dynamic-a\"}, {\"name\": \"dynamic-b\"}]"']"#.to_owned() + "\n";
    assert_eq!(
        names(&params_with(&dynamic, &[]).expect("ok")),
        ["dynamic-a", "dynamic-b", "static-a", "static-b"]
    );
    let (code, msg) = params_with("      command: [echo, '[']\n", &[]).expect_err("invalid json");
    assert_eq!(code, UNKNOWN);
    assert!(msg.contains("unexpected end of JSON input"), "{msg}");
    let (_, msg) =
        params_with("      command: [sh, -c, 'exit 1']\n", &[]).expect_err("bad command");
    assert!(
        msg.contains("error executing dynamic parameter output command"),
        "{msg}"
    );
    // The request env reaches the dynamic command (Argo fix #11812).
    let must = "      command: [sh, -c, 'test -n \"$MUST_BE_SET\" && echo \"[{\\\"name\\\":\\\"dynamic-test-param\\\",\\\"string\\\":\\\"$MUST_BE_SET\\\"}]\"']\n";
    let v = params_with(must, &["MUST_BE_SET=yep"]).expect("env passed");
    assert_eq!(v["parameterAnnouncements"][0]["string"], "yep");
    assert!(params_with(must, &[]).is_err());
    // No dynamic command: static only, full shape.
    let s = Server::start(
        &plugin(
            "  generate:\n    command: [cat, cm.yaml]\n  parameters:\n    static:\n      - name: test-param\n        string: test-value\n        collectionType: map\n        map: {a: b}\n",
        ),
        &[],
    );
    let r = kustomize_repo();
    let v = go(&s, "params", &["-dir", r.path().to_str().expect("utf8")]).expect("static");
    assert_eq!(
        v["parameterAnnouncements"][0],
        json!({"name":"test-param","title":"","tooltip":"","required":false,"itemType":"","collectionType":"map","string":"test-value","array":[],"map":{"a":"b"}})
    );
}

#[test]
fn check_plugin_configuration() {
    let s = Server::start(
        &plugin(
            "  generate:\n    command: [cat]\n  discover:\n    fileName: x\n  provideGitCreds: true\n",
        ),
        &[],
    );
    assert_eq!(
        go(&s, "check", &[]).expect("check"),
        json!({"isDiscoveryConfigured": true, "provideGitCreds": true})
    );
    let s = Server::start(
        &plugin("  generate:\n    command: [cat]\n  discover:\n    find:\n      args: [x]\n"),
        &[],
    );
    assert_eq!(
        go(&s, "check", &[]).expect("check"),
        json!({"isDiscoveryConfigured": false, "provideGitCreds": false})
    );
}

#[test]
fn extracted_modes_are_the_archives_and_commands_keep_a_private_umask() {
    // The extraction writes with a clear umask (no fchmod per entry) and gives the jail's 077
    // back before any command runs: both show in the modes a command sees and makes.
    let r = repo(&[
        ("a.txt", "a\n"),
        ("d/e/b.txt", "b\n"),
        ("run.sh", "#!/bin/sh\n"),
    ]);
    std::fs::set_permissions(
        r.path().join("run.sh"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    let spec = "  preserveFileMode: true\n  generate:\n    command: [sh, -c]\n    args: ['mkdir made; touch made/f; echo \"modes: $(stat -c %n=%a d d/e a.txt d/e/b.txt run.sh made made/f | tr \"\\\\n\" \" \")\"']\n";
    // Both writers: the tree cache's filler (the default policy) and the request's jail.
    const CACHE_OFF: &str = "cache: {enabled: false, bytes: 512Mi}";
    for cache in [true, false] {
        let edits = match (cache, tree_cache_under_test()) {
            (true, false) => vec![(CACHE_OFF, TREE_CACHE_ON)],
            (false, true) => vec![(TREE_CACHE_ON, CACHE_OFF)],
            _ => vec![],
        };
        let pol = tempfile::tempdir().expect("tmp");
        let pol_file = pol.path().join("policy.yaml");
        write_policy(&pol_file, &edits);
        let s = Server::start(
            &plugin(spec),
            &["--policy", pol_file.to_str().expect("utf8")],
        );
        let v = go(&s, "generate", &["-dir", r.path().to_str().expect("utf8")]).expect("generate");
        assert_eq!(
            v["manifests"],
            json!([
                r#"{"modes":"d=755 d/e=755 a.txt=644 d/e/b.txt=644 run.sh=755 made=700 made/f=600"}"#
            ]),
            "cache enabled: {cache}"
        );
    }
}

#[test]
fn environment_and_files_reach_commands() {
    // Argo's e2e: ARGOCD_ENV_EMPTY must be set though empty; request env overrides the sidecar's;
    // symlinks to sibling dirs work; preserveFileMode keeps scripts executable.
    let r = repo(&[
        ("shared/base.yaml", "kind: Base\n"),
        ("apps/app1/link.yaml", "->../../shared/base.yaml"),
        ("apps/app1/run.sh", "#!/bin/sh\necho \"kind: FromScript\"\n"),
    ]);
    std::fs::set_permissions(
        r.path().join("apps/app1/run.sh"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    let spec = "  preserveFileMode: true\n  generate:\n    command: [sh, -c]\n    args: ['./run.sh; echo ---; cat link.yaml; echo ---; echo \"e: v-${ARGOCD_ENV_EMPTY-unset}-$SIDECAR-$ARGOCD_APP_NAME-${SECRET_TOKEN-notpassed}\"']\n";
    // The sidecar's environment reaches commands only through the policy's env.pass list.
    let pol = tempfile::tempdir().expect("tmp");
    let pol_file = pol.path().join("policy.yaml");
    write_policy(&pol_file, &[("pass: [PATH,", "pass: [SIDECAR, PATH,")]);
    let s = Server::start_env(
        &plugin(spec),
        &["--policy", pol_file.to_str().expect("utf8")],
        &[("SIDECAR", "from-sidecar"), ("SECRET_TOKEN", "s3cr3t")],
    );
    let v = go(
        &s,
        "generate",
        &[
            "-dir",
            r.path().to_str().expect("utf8"),
            "-app-rel-path",
            "apps/app1",
            "-env",
            "ARGOCD_ENV_EMPTY=",
            "-env",
            "ARGOCD_APP_NAME=guestbook",
        ],
    )
    .expect("generate");
    assert_eq!(
        v["manifests"],
        json!([
            r#"{"kind":"FromScript"}"#,
            r#"{"kind":"Base"}"#,
            r#"{"e":"v--from-sidecar-guestbook-notpassed"}"#
        ])
    );
    let v = go(
        &s,
        "generate",
        &[
            "-dir",
            r.path().to_str().expect("utf8"),
            "-app-rel-path",
            "apps/app1",
            "-env",
            "SIDECAR=overridden",
        ],
    )
    .expect("generate");
    assert_eq!(
        v["manifests"][2],
        r#"{"e":"v-unset-overridden--notpassed"}"#
    );
}

#[test]
fn output_formats_match_argo() {
    let r = repo(&[
        (
            "y.yaml",
            "# comment only\n---\na: yes\nb: 0777\nc: \"<x>&\"\nd: 1.50\n---\n\n---\nnull\n---\nlist: [1, 2]\n",
        ),
        ("j.json", "{\"z\": 1,   \"a\": [true]}\n{\"b\":null}\n"),
    ]);
    let dir = r.path().to_str().expect("utf8");
    let s = Server::start(&plugin("  generate:\n    command: [cat, y.yaml]\n"), &[]);
    let v = go(&s, "generate", &["-dir", dir]).expect("yaml");
    assert_eq!(
        v["manifests"],
        json!([
            r#"{"a":true,"b":511,"c":"\u003cx\u003e\u0026","d":1.5}"#,
            r#"{"list":[1,2]}"#
        ])
    );
    let s = Server::start(&plugin("  generate:\n    command: [cat, j.json]\n"), &[]);
    let v = go(&s, "generate", &["-dir", dir]).expect("json");
    assert_eq!(
        v["manifests"],
        json!([r#"{"z": 1,   "a": [true]}"#, r#"{"b":null}"#])
    );
}

#[test]
fn tar_stream_exclusions_as_repo_server() {
    // util/cmp/stream_test.go: excluded paths never arrive.
    let r = repo(&[
        ("README.md", "r"),
        ("DUMMY.md", "d"),
        ("dummy/x", "x"),
        ("applicationset/a.yaml", "a"),
    ]);
    let s = Server::start(
        &plugin(
            "  generate:\n    command: [sh, -c, 'find . -mindepth 1 | sort | sed \"s/^/- /\"']\n",
        ),
        &[],
    );
    let v = go(
        &s,
        "generate",
        &[
            "-dir",
            r.path().to_str().expect("utf8"),
            "-exclude",
            "DUMMY.md",
            "-exclude",
            "dum*",
        ],
    )
    .expect("ok");
    assert_eq!(
        v["manifests"],
        json!([r#"["./README.md","./applicationset","./applicationset/a.yaml"]"#])
    );
}
