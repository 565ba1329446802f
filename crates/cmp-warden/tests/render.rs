//! `cmp-warden render`: the README's main job, on the bundled example.

#[macro_use]
mod common;

#[test]
fn renders_the_demo_app_with_the_demo_plugin() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = std::process::Command::new(common::bin())
        .arg("render")
        .arg(root.join("examples/demo-app"))
        .args(["--app-rel-path", "app", "--config-dir-path"])
        .arg(root.join("examples/plugin"))
        .output()
        .expect("run render");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<String> = String::from_utf8(out.stdout)
        .expect("utf8")
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(
        lines,
        [
            r#"{"apiVersion":"v1","data":{"greeting":"hello from cmp-warden"},"kind":"ConfigMap","metadata":{"name":"demo"}}"#,
            r#"{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"demo"},"spec":{"replicas":2,"selector":{"matchLabels":{"app":"demo"}},"template":{"metadata":{"labels":{"app":"demo"}},"spec":{"containers":[{"image":"registry.example.com/demo:1.0","name":"web","ports":[{"containerPort":8080}]}]}}}}"#,
            r#"{"apiVersion":"v1","kind":"Service","metadata":{"labels":{"app":"demo","tier":"web"},"name":"demo"},"spec":{"ports":[{"port":80,"targetPort":8080}]}}"#,
        ]
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("discovery: matches"));
}

#[test]
fn render_reports_plugin_failures() {
    let d = tempfile::tempdir().expect("tmp");
    std::fs::write(
        d.path().join("plugin.yaml"),
        "kind: ConfigManagementPlugin\nmetadata: {name: x}\nspec: {generate: {command: [sh, -c, 'echo boom >&2; exit 4']}}\n",
    )
    .expect("write");
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/demo-app");
    let out = std::process::Command::new(common::bin())
        .arg("render")
        .arg(&root)
        .arg("--config-dir-path")
        .arg(d.path())
        .output()
        .expect("run render");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("`sh -c \"echo boom >&2; exit 4\"` failed exit status 4: boom"),
        "{err}"
    );
}

/// A program outside the policy's read-only paths: Go's message, then what the sandbox adds
/// and which field allows it (upstream would have run it). Needs root (a unique UID).
#[test]
fn a_program_outside_the_readable_paths_is_refused_with_the_field_named() {
    needs_root!("render with a leased UID needs root");
    use std::os::unix::fs::PermissionsExt;
    // Under /var/tmp: visible in the jail (its /tmp is its own) but in no policy path.
    let tool_dir = tempfile::Builder::new()
        .prefix("cmpw-tool")
        .tempdir_in("/var/tmp")
        .expect("tmp");
    let tool = tool_dir.path().join("tool");
    std::fs::write(&tool, "#!/bin/sh\necho '{}'\n").expect("tool");
    for (p, m) in [(tool_dir.path(), 0o755), (tool.as_path(), 0o755)] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).expect("chmod");
    }
    let d = tempfile::tempdir().expect("tmp");
    std::fs::write(
        d.path().join("plugin.yaml"),
        format!(
            "kind: ConfigManagementPlugin\nmetadata: {{name: x}}\nspec: {{generate: {{command: [{}]}}}}\n",
            tool.display()
        ),
    )
    .expect("write");
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/demo-app");
    let out = std::process::Command::new(common::bin())
        .arg("render")
        .arg(&root)
        .arg("--config-dir-path")
        .arg(d.path())
        .output()
        .expect("run render");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("fork/exec {}: permission denied", tool.display()))
            && err.contains("list its directory there")
            && err.contains("spec.filesystem.readOnly"),
        "{err}"
    );
}

/// `render` honours `ARGOCD_EXEC_TIMEOUT` as `serve` does: a command past it is stopped and
/// the error names the variable; an honest command under the same setting renders.
#[test]
fn render_honours_argocd_exec_timeout() {
    let d = tempfile::tempdir().expect("tmp");
    std::fs::write(
        d.path().join("plugin.yaml"),
        "kind: ConfigManagementPlugin\nmetadata: {name: x}\nspec: {generate: {command: [sh, -c, 'if [ -n \"$ARGOCD_ENV_SLOW\" ]; then sleep 30; fi; echo \"kind: Fast\"']}}\n",
    )
    .expect("write");
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/demo-app");
    let render = |env: &[&str]| {
        let mut c = std::process::Command::new(common::bin());
        c.arg("render")
            .arg(&root)
            .arg("--config-dir-path")
            .arg(d.path());
        for e in env {
            c.args(["--env", e]);
        }
        c.env("ARGOCD_EXEC_TIMEOUT", "1s")
            .output()
            .expect("run render")
    };
    let t = std::time::Instant::now();
    let out = render(&["ARGOCD_ENV_SLOW=1"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("command timeout exceeded (ARGOCD_EXEC_TIMEOUT=1s)"),
        "{err}"
    );
    // A liveness bound, not a measurement: the 30 s command did not run to its end.
    assert!(t.elapsed() < std::time::Duration::from_secs(25));
    let out = render(&[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "{\"kind\":\"Fast\"}\n"
    );
}

/// `render | head`: a reader that goes away ends the output quietly (exit 0, no panic, no
/// "Broken pipe" error), as any Unix tool.
#[test]
fn render_into_a_closed_pipe_ends_quietly() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let scratch = tempfile::tempdir().expect("tmp");
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "'{}' render '{}' --app-rel-path app --config-dir-path '{}' 2>err | head -c 10 >/dev/null; cat err",
            common::bin(),
            root.join("examples/demo-app").display(),
            root.join("examples/plugin").display()
        ))
        .current_dir(scratch.path())
        .output()
        .expect("sh");
    let err = String::from_utf8_lossy(&out.stdout);
    assert!(!err.contains("panicked"), "{err}");
    assert!(!err.contains("Broken pipe"), "{err}");
}

/// `--logformat text` writes logrus' text lines (`time=… level=… msg=…`) and no colour into a
/// pipe or file; `FORCE_LOG_COLORS=1` asks for colour anyway, as Argo CD's logger does.
#[test]
fn text_logs_have_no_colour_unless_forced() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let run = |force: Option<&str>| {
        let mut c = std::process::Command::new(common::bin());
        c.arg("render")
            .arg(root.join("examples/demo-app"))
            .args(["--app-rel-path", "app", "--config-dir-path"])
            .arg(root.join("examples/plugin"))
            .args(["--logformat", "TEXT", "--loglevel", "debug"]);
        if let Some(v) = force {
            c.env("FORCE_LOG_COLORS", v);
        }
        let out = c.output().expect("render");
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let plain = run(None);
    assert!(!plain.contains('\u{1b}'), "{plain}");
    assert!(
        plain
            .lines()
            .any(|l| l.starts_with("time=") && l.contains(" level=debug msg=")),
        "{plain}"
    );
    let colour = run(Some("1"));
    assert!(colour.contains("\u{1b}[37mDEBU\u{1b}[0m["), "{colour}");
}
