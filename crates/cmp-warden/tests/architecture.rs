//! The rooms' walls (ARCHITECTURE.md, "Invariants"), checked on the workspace as it is: which
//! crate may depend on which (read from `cargo metadata`), where `unsafe` may be, and who reads
//! a `Policy`. A change that moves a wall fails here and says which invariant it breaks.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Each workspace crate's normal (not dev, not build) dependencies among the workspace's own
/// and a few external ones that mark a room (gRPC, HTTP).
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let m = metadata();
    let packages = m["packages"].as_array().expect("packages");
    let ours: BTreeSet<String> = packages
        .iter()
        .map(|p| p["name"].as_str().unwrap_or_default().to_owned())
        .collect();
    let marks = ["tonic", "prost", "hyper", "axum", "tokio"];
    packages
        .iter()
        .map(|p| {
            let deps = normal_dependencies(p)
                .into_iter()
                .filter(|n| ours.contains(n) || marks.contains(&n.as_str()))
                .map(|n| n.trim_start_matches("cmp-warden-").to_owned())
                .collect();
            let name = p["name"].as_str().unwrap_or_default();
            (name.trim_start_matches("cmp-warden-").to_owned(), deps)
        })
        .collect()
}

/// A package's normal (not dev, not build) dependencies, by name.
fn normal_dependencies(package: &serde_json::Value) -> BTreeSet<String> {
    package["dependencies"]
        .as_array()
        .expect("dependencies")
        .iter()
        .filter(|d| d["kind"].is_null())
        .filter_map(|d| d["name"].as_str().map(str::to_owned))
        .collect()
}

/// `cargo metadata` of the workspace, its own packages only.
fn metadata() -> serde_json::Value {
    let out = std::process::Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(root())
        .output()
        .expect("cargo metadata");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("metadata JSON")
}

/// Everything `name` depends on, directly or not.
fn reach(g: &BTreeMap<String, BTreeSet<String>>, name: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut todo = vec![name.to_owned()];
    while let Some(n) = todo.pop() {
        for d in g.get(&n).into_iter().flatten() {
            if seen.insert(d.clone()) {
                todo.push(d.clone());
            }
        }
    }
    seen
}

#[test]
fn dependencies_point_one_way() {
    let g = graph();
    assert!(g.len() >= 15, "the workspace's crates: {:?}", g.keys());
    let broken = std::cell::RefCell::new(Vec::new());
    // `what` reached from `krate` at any depth; the server only directly (it reaches the jail's
    // crates through the supervisor, by design).
    let check = |krate: &str, what: &[&str], why: &str, deep: bool| {
        let reached = if deep {
            reach(&g, krate)
        } else {
            g[krate].clone()
        };
        for w in what {
            if reached.contains(*w) {
                broken
                    .borrow_mut()
                    .push(format!("{krate} depends on {w}: {why}"));
            }
        }
    };
    let forbid = |krate: &str, what: &[&str], why: &str| check(krate, what, why, true);
    let all_ours: Vec<&str> = g.keys().map(String::as_str).collect();
    forbid(
        "jail-sys",
        &all_ours,
        "the kernel primitives depend on nothing of ours",
    );
    // Invariant 2: the rooms.
    for leaf in ["archive", "cgroups", "egress", "plugin", "otlp"] {
        forbid(
            leaf,
            &[
                "supervisor",
                "jail",
                "server",
                "proto",
                "policy",
                "cmp-warden",
            ],
            "a leaf concern knows no other room",
        );
    }
    forbid(
        "policy",
        &[
            "supervisor",
            "jail",
            "server",
            "proto",
            "archive",
            "egress",
            "tonic",
            "tokio",
        ],
        "the policy is data: it never runs, spawns or serves (its egress rules are the vocabulary's)",
    );
    forbid(
        "audit-event",
        &[
            "egress",
            "jail-wire",
            "seccomp",
            "supervisor",
            "jail",
            "server",
            "tokio",
        ],
        "the audit event is data: its connection records are the vocabulary's",
    );
    forbid(
        "jail",
        &["supervisor", "server", "proto", "cgroups", "tonic", "hyper"],
        "the confined side cannot name the supervisor, and knows no gRPC",
    );
    forbid(
        "supervisor",
        &["server", "proto", "tonic", "hyper", "axum"],
        "the supervisor knows nothing of gRPC or HTTP",
    );
    check(
        "server",
        &["jail", "jail-sys", "jail-wire", "seccomp", "cgroups"],
        "the server does not know how requests are confined (it calls supervisor::Runner)",
        false,
    );
    for lib in g.keys().filter(|k| *k != "cmp-warden") {
        forbid(lib, &["cmp-warden"], "no library depends on the binary");
    }
    let broken = broken.into_inner();
    assert!(broken.is_empty(), "{}", broken.join("\n"));
}

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("read_dir").flatten() {
        let p = e.path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The vocabulary is at the bottom (ARCHITECTURE.md, `vocab`): nothing of ours below it, and
/// nothing else but serde (no I/O, no runtime, no error-derive macro).
#[test]
fn the_vocabulary_depends_on_serde_alone() {
    let m = metadata();
    let vocab = m["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .find(|p| p["name"] == "cmp-warden-vocab")
        .expect("the vocabulary crate");
    assert_eq!(
        normal_dependencies(vocab),
        BTreeSet::from(["serde".to_owned()]),
        "crates/vocab depends on serde alone"
    );
}

#[test]
fn unsafe_is_forbidden_in_every_crate_but_the_kernel_primitives() {
    let mut missing = Vec::new();
    for krate in std::fs::read_dir(root().join("crates"))
        .expect("crates")
        .flatten()
    {
        let src = krate.path().join("src");
        let name = krate.file_name().to_string_lossy().into_owned();
        for top in ["lib.rs", "main.rs"] {
            let Ok(text) = std::fs::read_to_string(src.join(top)) else {
                continue;
            };
            let ok = if name == "jail-sys" {
                text.contains("#![deny(unsafe_code)]")
            } else {
                text.contains("#![forbid(unsafe_code)]")
            };
            if !ok {
                missing.push(format!("crates/{name}/src/{top}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "without #![forbid(unsafe_code)] (jail-sys: deny, allowed in `sys` only): {missing:?}"
    );
    // And in jail-sys, `unsafe` blocks only in `sys`.
    let mut files = Vec::new();
    sources(&root().join("crates/jail-sys/src"), &mut files);
    // Spelt apart so that this test's source holds no unsafe block's text itself (the
    // workspace-wide search for one finds only jail-sys).
    let block = ["unsafe", "{"].join(" ");
    let outside: Vec<_> = files
        .iter()
        .filter(|f| !f.ends_with("sys.rs") && !f.to_string_lossy().contains("/sys/"))
        .filter(|f| {
            std::fs::read_to_string(f)
                .unwrap_or_default()
                .lines()
                .any(|l| !l.trim_start().starts_with("//") && l.contains(&block))
        })
        .collect();
    assert!(
        outside.is_empty(),
        "unsafe blocks outside jail_sys::sys: {outside:?}"
    );
}

/// Invariant 9: outside the policy crate a `Policy` is read by its one translation
/// (`supervisor::plan`; start-up receives one), by the `policy` commands (`policy check` shows
/// it, `policy suggest` writes one) and by the flags that load it. Everything else, doctor and
/// serve's start-up report included, reads a `Plan`.
#[test]
fn a_policy_is_read_only_by_its_translation_and_the_policy_commands() {
    let allowed = [
        "crates/supervisor/src/plan.rs",
        "crates/supervisor/src/start.rs",
        "crates/suggest/src/",
        "crates/cmp-warden/src/cmd/flags.rs",
        "crates/cmp-warden/src/cmd/policy.rs",
        // The `policy` subcommand's name.
        "crates/cmp-warden/src/main.rs",
    ];
    let word = |line: &str| {
        line.match_indices("Policy").any(|(i, _)| {
            let before = line[..i].chars().next_back();
            let after = line[i + "Policy".len()..].chars().next();
            !before.is_some_and(|c| c.is_alphanumeric() || c == '_')
                && !after.is_some_and(|c| c.is_alphanumeric() || c == '_')
        })
    };
    let mut files = Vec::new();
    sources(&root().join("crates"), &mut files);
    let mut readers = Vec::new();
    for f in files {
        let rel = f
            .strip_prefix(root())
            .unwrap_or(&f)
            .to_string_lossy()
            .replace("/../..", "");
        let rel = rel.trim_start_matches("../../").to_owned();
        if rel.starts_with("crates/policy/") || rel.contains("/tests/") || rel.contains("/benches/")
        {
            continue;
        }
        let text = std::fs::read_to_string(&f).unwrap_or_default();
        let code = text
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .any(word);
        if code && !allowed.iter().any(|a| rel.starts_with(a)) {
            readers.push(rel);
        }
    }
    assert!(
        readers.is_empty(),
        "these name the Policy type; read the request's Plan instead (ARCHITECTURE.md invariant 9): {readers:?}"
    );
}

/// Every library and binary source file (`crates/*/src/**.rs`): its repository-relative path
/// and its text.
fn library_sources() -> Vec<(String, String)> {
    let mut files = Vec::new();
    sources(&root().join("crates"), &mut files);
    files
        .into_iter()
        .filter_map(|f| {
            let rel = f
                .strip_prefix(root())
                .unwrap_or(&f)
                .to_string_lossy()
                .into_owned();
            rel.contains("/src/")
                .then(|| (rel, std::fs::read_to_string(&f).unwrap_or_default()))
        })
        .collect()
}

/// The `use` lines of `text` outside `#[cfg(test)]` modules, with their line numbers: a line
/// opening a module right after `#[cfg(test)]` starts a test module, which ends at the first
/// line closing a brace at the module line's own indentation.
fn non_test_uses(text: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let mut test_indent: Option<usize> = None;
    let mut after_cfg_test = false;
    for (i, line) in text.lines().enumerate() {
        let indent = line.len() - line.trim_start().len();
        let t = line.trim();
        if let Some(at) = test_indent {
            if indent == at && t.starts_with('}') {
                test_indent = None;
            }
            continue;
        }
        if after_cfg_test && t.starts_with("mod ") && t.ends_with('{') {
            test_indent = Some(indent);
            after_cfg_test = false;
            continue;
        }
        if t.starts_with("#[") {
            after_cfg_test |= t == "#[cfg(test)]";
            continue;
        }
        after_cfg_test = false;
        if t.starts_with("use ") || t.starts_with("pub use ") || t.starts_with("pub(crate) use ") {
            out.push((i + 1, t));
        }
    }
    out
}

/// A module names what it uses from where it lives: no glob import (`use super::*`,
/// `pub use start::*`) in any library or binary source outside its test modules, so a file's
/// imports say which rooms it enters. (Integration tests keep their `use common::*` prelude.)
#[test]
fn no_glob_imports_outside_test_modules() {
    let mut globs = Vec::new();
    for (rel, text) in library_sources() {
        for (n, line) in non_test_uses(&text) {
            if line.contains("::*") || line.contains("{*") || line.contains(", *") {
                globs.push(format!("{rel}:{n}: {line}"));
            }
        }
    }
    assert!(
        globs.is_empty(),
        "glob imports outside test modules (name each item from where it lives):\n{}",
        globs.join("\n")
    );
}

#[test]
fn non_test_uses_skips_test_modules_only() {
    let text = "use a::b;\n#[cfg(test)]\nmod tests {\n    use super::*;\n}\nuse super::*;\n";
    assert_eq!(
        non_test_uses(text),
        vec![(1, "use a::b;"), (6, "use super::*;")]
    );
}

/// Each crate's top-level modules and the ones each names (`crate::m`, or `super::m` from a
/// top-level file), comments and test modules left out.
fn module_edges(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    sources(src, &mut files);
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in files {
        let rel = f
            .strip_prefix(src)
            .expect("under src")
            .to_string_lossy()
            .into_owned();
        if rel == "lib.rs" || rel == "main.rs" {
            continue;
        }
        let top = rel
            .split('/')
            .next()
            .unwrap_or_default()
            .trim_end_matches(".rs")
            .to_owned();
        let text = std::fs::read_to_string(&f).unwrap_or_default();
        let text = text
            .split("#[cfg(test)]\nmod tests")
            .next()
            .unwrap_or_default();
        for line in text.lines().filter(|l| !l.trim_start().starts_with("//")) {
            let mut prefixes = vec!["crate::"];
            if !rel.contains('/') {
                prefixes.push("super::");
            }
            for prefix in prefixes {
                for (i, _) in line.match_indices(prefix) {
                    if line[..i].ends_with(|c: char| c.is_alphanumeric() || c == '_') {
                        continue;
                    }
                    let name: String = line[i + prefix.len()..]
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    if !name.is_empty() && name != top {
                        edges.entry(top.clone()).or_default().insert(name);
                    }
                }
            }
        }
    }
    edges
}

/// A circle in `edges`, if there is one (each module's path from itself back to itself).
fn circle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn walk(
        edges: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        let here = path.last().expect("non-empty").clone();
        for next in edges.get(&here).into_iter().flatten() {
            if let Some(at) = path.iter().position(|p| p == next) {
                let mut c = path[at..].to_vec();
                c.push(next.clone());
                return Some(c);
            }
            if done.insert(next.clone()) {
                path.push(next.clone());
                if let Some(c) = walk(edges, path, done) {
                    return Some(c);
                }
                path.pop();
            }
        }
        None
    }
    let mut done = BTreeSet::new();
    for start in edges.keys() {
        if done.insert(start.clone())
            && let Some(c) = walk(edges, &mut vec![start.clone()], &mut done)
        {
            return Some(c);
        }
    }
    None
}

/// Within each crate, the files' imports point one way: no two top-level modules name each
/// other, directly or around a circle (a circle makes two files one room).
#[test]
fn no_import_circle_between_a_crates_files() {
    let mut circles = Vec::new();
    for krate in std::fs::read_dir(root().join("crates"))
        .expect("crates")
        .flatten()
    {
        let src = krate.path().join("src");
        if !src.is_dir() {
            continue;
        }
        if let Some(c) = circle(&module_edges(&src)) {
            circles.push(format!(
                "{}: {}",
                krate.file_name().to_string_lossy(),
                c.join(" -> ")
            ));
        }
    }
    assert!(
        circles.is_empty(),
        "import circles:\n{}",
        circles.join("\n")
    );
}

#[test]
fn a_circle_is_found_and_a_line_is_not() {
    let edges = |pairs: &[(&str, &str)]| {
        let mut e: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (a, b) in pairs {
            e.entry(a.to_string()).or_default().insert(b.to_string());
        }
        e
    };
    assert_eq!(circle(&edges(&[("a", "b"), ("b", "c")])), None);
    assert_eq!(
        circle(&edges(&[("a", "b"), ("b", "c"), ("c", "a")])),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
}

/// The library names of the workspace's crates (`[lib] name`).
fn lib_names() -> BTreeSet<String> {
    let m = metadata();
    m["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .flat_map(|p| p["targets"].as_array().into_iter().flatten())
        .filter(|t| {
            t["kind"]
                .as_array()
                .is_some_and(|k| k.iter().any(|k| k == "lib"))
        })
        .filter_map(|t| t["name"].as_str().map(|n| n.replace('-', "_")))
        .collect()
}

/// A type is named from the crate that defines it: no crate re-exports another crate's items
/// (an alias hides which room a name lives in), but for the supervisor's last few, which the
/// server reaches the jail's rooms through until their vocabulary moves, and the benchmark
/// build's harness.
#[test]
fn no_crate_re_exports_another_crates_items() {
    let allowed = [
        (
            "crates/supervisor/src/lib.rs",
            "pub use jail_wire::{record, redact, spec};",
        ),
        (
            "crates/supervisor/src/lib.rs",
            "pub use jail_sys::cancel::{CancelReason, CancelToken};",
        ),
        (
            "crates/supervisor/src/lib.rs",
            "pub use jail_wire::protocol::KILL_GRACE;",
        ),
        (
            "crates/supervisor/src/lib.rs",
            "pub use jail_wire::spec::{Task, parse_generated};",
        ),
        (
            "crates/supervisor/src/bench.rs",
            "pub use jail::{CmdSpec, run};",
        ),
        (
            "crates/supervisor/src/bench.rs",
            "pub use jail_sys::reaper::{reap_orphans, spawn_tracked, untrack};",
        ),
    ];
    let libs = lib_names();
    let mut aliases = Vec::new();
    for (rel, text) in library_sources() {
        let krate = rel.split('/').nth(1).unwrap_or_default().replace('-', "_");
        // A module of the crate's own may share a crate's name (`policy::policy`).
        let own_mods: BTreeSet<String> = text
            .lines()
            .filter_map(|l| {
                l.trim()
                    .strip_prefix("pub mod ")
                    .or(l.trim().strip_prefix("mod "))
            })
            .map(|m| m.trim_end_matches(';').to_owned())
            .collect();
        for (n, line) in non_test_uses(&text) {
            let Some(path) = line.strip_prefix("pub use ") else {
                continue;
            };
            let first: String = path
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if libs.contains(&first)
                && !own_mods.contains(&first)
                && !krate.ends_with(&first)
                && !allowed.contains(&(rel.as_str(), line))
            {
                aliases.push(format!("{rel}:{n}: {line}"));
            }
        }
    }
    assert!(
        aliases.is_empty(),
        "re-exports of another crate's items (name them from where they live):\n{}",
        aliases.join("\n")
    );
}
