//! `cmp-warden render`: the README's main job, on the bundled example.

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
            r#"{"apiVersion":"v1","kind":"Service","metadata":{"labels":{"app":"demo","tier":"web"},"name":"demo"},"spec":{"ports":[{"port":80,"targetPort":8080}]}}"#,
            r#"{"replicas":2}"#,
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
