//! Archives shaped like the repo-server's writer (and GNU tar's) must extract exactly.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::Path;
use std::process::Command;

use archive::{Options, Resolver};
use testkit::{Node, Sentinel, argo_tgz, check_contained, describe_tree};

/// A small repository with everything the envelope allows.
fn sample_repo(dir: &Path) {
    let w = |p: &str, data: &[u8]| {
        let p = dir.join(p);
        fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        fs::write(p, data).expect("write");
    };
    w("README.md", b"# repo\n");
    w(".git/HEAD", b"ref: refs/heads/main\n");
    w(".git/objects/ab/cdef0123", &[0u8, 159, 146, 150, 255]);
    w(
        "apps/guestbook/kustomization.yaml",
        b"resources: [deploy.yaml]\n",
    );
    w(
        "apps/guestbook/deploy.yaml",
        b"apiVersion: v1\nkind: ConfigMap\n",
    );
    w("base/values.yaml", b"replicas: 2\n");
    w(
        "overlays/prod/kustomization.yaml",
        b"resources: [../../base]\n",
    );
    w("scripts/generate.sh", b"#!/bin/sh\ncat *.yaml\n");
    fs::set_permissions(
        dir.join("scripts/generate.sh"),
        fs::Permissions::from_mode(0o755),
    )
    .expect("chmod");
    w("empty", b"");
    // Larger than the writer's copy buffer at every size it grows through (16 KiB, 64 KiB,
    // 256 KiB), not a multiple of any, and files of every size after it: each byte must land.
    let big: Vec<u8> = (0..(1u32 << 20) + 7)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    w("charts/big.tgz", &big);
    w("charts/after-big.yaml", b"e: 5\n");
    w("charts/mid.bin", &big[..70_000]);
    fs::create_dir_all(dir.join("empty-dir")).expect("mkdir");
    w("with space/and 'quotes'.yaml", b"a: 1\n");
    w("ünïcödé/файл.yaml", b"b: 2\n");
    // Needs the ustar prefix field (name > 100, splits at a '/').
    let prefixed = format!("{}/{}.yaml", "p".repeat(120), "n".repeat(90));
    w(&prefixed, b"c: 3\n");
    // Needs a PAX path (no split possible).
    let pax = format!("{}/{}.yaml", "q".repeat(200), "r".repeat(180));
    w(&pax, b"d: 4\n");
    symlink(
        "../../base/values.yaml",
        dir.join("overlays/prod/values.yaml"),
    )
    .expect("symlink");
    symlink("../README.md", dir.join("apps/README.md")).expect("symlink");
    symlink("./README.md", dir.join("readme-link")).expect("symlink");
    symlink("..", dir.join("apps/guestbook-root")).expect("symlink");
    symlink(
        format!("../{}", "t".repeat(150)),
        dir.join("apps/long-target"),
    )
    .expect("symlink");
}

/// What the tree should look like after extraction: modes sanitised.
/// A link target as Argo CD writes it: `Rel(Dir(link), Clean(Join(Dir(link), target)))`
/// (`./README.md` → `README.md`), computed on components here.
fn as_argo_writes(link: &str, target: &str) -> String {
    let dir: Vec<&str> = link
        .rsplit_once('/')
        .map_or(Vec::new(), |(d, _)| d.split('/').collect());
    let mut resolved = dir.clone();
    for c in target.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                resolved.pop();
            }
            c => resolved.push(c),
        }
    }
    let common = dir
        .iter()
        .zip(&resolved)
        .take_while(|(a, b)| a == b)
        .count();
    let mut parts: Vec<&str> = vec![".."; dir.len() - common];
    parts.extend_from_slice(&resolved[common..]);
    if parts.is_empty() {
        ".".to_owned()
    } else {
        parts.join("/")
    }
}

/// `tree` with its link targets as Argo CD writes them.
fn argo_targets(tree: BTreeMap<String, Node>) -> BTreeMap<String, Node> {
    tree.into_iter()
        .map(|(k, n)| {
            let n = match n {
                Node::Symlink(t) => Node::Symlink(as_argo_writes(&k, &t)),
                other => other,
            };
            (k, n)
        })
        .collect()
}

fn expected(src: &Path, preserve: bool) -> BTreeMap<String, Node> {
    argo_targets(describe_tree(src))
        .into_iter()
        .map(|(k, n)| {
            let n = match n {
                Node::Dir(_) => Node::Dir(0o755),
                Node::File(m, h) => Node::File(
                    if preserve && m & 0o100 != 0 {
                        0o755
                    } else {
                        0o644
                    },
                    h,
                ),
                other => other,
            };
            (k, n)
        })
        .collect()
}

fn extract(tgz: &[u8], opts: &Options, resolver: Resolver) -> (Sentinel, archive::Summary) {
    let s = Sentinel::new();
    let fd = archive::DirWriter::open_root(&s.root).expect("open");
    let mut w = archive::DirWriter::new(fd, resolver)
        .expect("read")
        .expect("empty");
    let sum = archive::extract(tgz, &mut w, opts)
        .unwrap_or_else(|e| panic!("legitimate archive refused: {e}"));
    check_contained(&s.root).expect("contained");
    s.assert_outside_untouched();
    (s, sum)
}

#[test]
fn argo_shaped_archive_extracts_identically() {
    let src = tempfile::tempdir().expect("tmp");
    sample_repo(src.path());
    let tgz = argo_tgz(src.path());
    for preserve in [false, true] {
        for resolver in [Resolver::Auto, Resolver::ComponentWise] {
            let opts = Options {
                preserve_file_mode: preserve,
                ..Options::default()
            };
            let (s, sum) = extract(&tgz, &opts, resolver);
            assert_eq!(describe_tree(&s.root), expected(src.path(), preserve));
            assert_eq!(sum.entries as usize, describe_tree(src.path()).len());
            assert_eq!(sum.symlinks, 5);
        }
    }
}

#[test]
fn argo_shaped_archive_matches_gnu_tar_reference() {
    let src = tempfile::tempdir().expect("tmp");
    sample_repo(src.path());
    let tgz = argo_tgz(src.path());
    let (ours, _) = extract(
        &tgz,
        &Options {
            preserve_file_mode: true,
            ..Options::default()
        },
        Resolver::Auto,
    );
    let reference = tempfile::tempdir().expect("tmp");
    let archive_file = reference.path().join("a.tgz");
    fs::write(&archive_file, &tgz).expect("write");
    let out = reference.path().join("out");
    fs::create_dir(&out).expect("mkdir");
    let st = Command::new("tar")
        .arg("-xzf")
        .arg(&archive_file)
        .arg("-C")
        .arg(&out)
        .status()
        .expect("run GNU tar");
    assert!(st.success());
    // GNU tar keeps header modes and writes link targets as given; compare shape, contents
    // and targets (as Argo CD writes them: `./README.md` is `README.md`).
    let strip = |m: BTreeMap<String, Node>| -> BTreeMap<String, Node> {
        m.into_iter()
            .map(|(k, n)| {
                (
                    k,
                    match n {
                        Node::Dir(_) => Node::Dir(0),
                        Node::File(_, h) => Node::File(0, h),
                        o => o,
                    },
                )
            })
            .collect()
    };
    assert_eq!(
        strip(describe_tree(&ours.root)),
        strip(argo_targets(describe_tree(&out)))
    );
}

#[test]
fn gnu_tar_archives_are_accepted() {
    let src = tempfile::tempdir().expect("tmp");
    // GNU format would need 'L' headers for long names, which we refuse: keep names short.
    for (p, d) in [
        ("a.yaml", "a"),
        ("d/b.yaml", "b"),
        ("d/e/c.yaml", "c"),
        ("ü/x", "x"),
    ] {
        let p = src.path().join(p);
        fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        fs::write(p, d).expect("write");
    }
    symlink("../a.yaml", src.path().join("d/link")).expect("symlink");
    for format in ["ustar", "pax", "gnu"] {
        let work = tempfile::tempdir().expect("tmp");
        let file = work.path().join("x.tgz");
        let st = Command::new("tar")
            .args(["--format", format, "-czf"])
            .arg(&file)
            .arg("-C")
            .arg(src.path())
            .arg(".")
            .status()
            .expect("tar");
        assert!(st.success());
        let (s, _) = extract(
            &fs::read(&file).expect("read"),
            &Options::default(),
            Resolver::Auto,
        );
        assert_eq!(
            describe_tree(&s.root),
            expected(src.path(), false),
            "format {format}"
        );
    }
}

#[test]
fn repository_sized_archive() {
    let src = tempfile::tempdir().expect("tmp");
    for d in 0..60 {
        for f in 0..50 {
            let p = src
                .path()
                .join(format!("team-{d:02}/app-{}/manifests/f{f:03}.yaml", f % 5));
            fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            fs::write(
                &p,
                format!("apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: cm-{d}-{f}}}\n"),
            )
            .expect("write");
        }
        symlink(
            "../shared.yaml",
            src.path().join(format!("team-{d:02}/shared-link")),
        )
        .expect("symlink");
    }
    fs::write(src.path().join("shared.yaml"), b"x: 1\n").expect("write");
    let tgz = argo_tgz(src.path());
    let (s, sum) = extract(&tgz, &Options::default(), Resolver::Auto);
    assert_eq!(sum.files, 3001);
    assert_eq!(describe_tree(&s.root), expected(src.path(), false));
}
