//! The build's identity for `--version`, the start-up log and doctor: the commit and its date.
//! Both come from the source (never the clock), so two builds of one commit are identical.
//! Without git (a source tarball), `CMP_WARDEN_COMMIT` and `CMP_WARDEN_COMMIT_DATE` may say
//! them; otherwise they read `unknown`.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        .filter(|s| !s.is_empty())
}

fn main() {
    for var in ["CMP_WARDEN_COMMIT", "CMP_WARDEN_COMMIT_DATE"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    // Rebuilt when HEAD moves: HEAD itself, the refs (a directory: any change beneath it) and
    // the packed refs. Only paths that exist: a missing one would rerun this on every build.
    let dirs = [
        git(&["rev-parse", "--absolute-git-dir"]).map(|d| format!("{d}/HEAD")),
        git(&["rev-parse", "--path-format=absolute", "--git-common-dir"])
            .map(|d| format!("{d}/refs")),
        git(&["rev-parse", "--path-format=absolute", "--git-common-dir"])
            .map(|d| format!("{d}/packed-refs")),
    ];
    for path in dirs.into_iter().flatten() {
        if std::path::Path::new(&path).exists() {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    let commit = std::env::var("CMP_WARDEN_COMMIT")
        .ok()
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]))
        .unwrap_or_else(|| "unknown".into());
    let date = std::env::var("CMP_WARDEN_COMMIT_DATE")
        .ok()
        .or_else(|| git(&["show", "-s", "--format=%cs", "HEAD"]))
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=CMP_WARDEN_COMMIT={commit}");
    println!("cargo:rustc-env=CMP_WARDEN_COMMIT_DATE={date}");
}
