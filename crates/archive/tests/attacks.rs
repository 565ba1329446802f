//! One test per attack vector (classes A–G: traversal, links, special files, header abuse,
//! bombs, …).
//!
//! Every vector is extracted into a root inside a sentinel directory, with both parent
//! resolvers (openat2 and the component-wise fallback) and with `check` (no writes). Each must be
//! refused with the expected reason, leave the root empty, create nothing in the sentinel, and
//! change nothing in the scratch directory around it. Vectors whose safe outcome is acceptance
//! with sanitising (modes, owners, times, loops) assert that outcome and the containment oracle.

use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::time::Duration;

use archive::{DirWriter, ErrorClass, LimitKind, Limits, Options, Reason, Resolver};
use testkit::{Hdr, Magic, Sentinel, TarBuilder, check_contained, gzip, pax_record};

fn run(
    tgz: &[u8],
    opts: &Options,
    resolver: Resolver,
    s: &Sentinel,
) -> Result<archive::Summary, archive::ExtractError> {
    let fd = DirWriter::open_root(&s.root).expect("open root");
    let mut w = DirWriter::new(fd, resolver)
        .expect("read root")
        .expect("empty root");
    archive::extract(tgz, &mut w, opts)
}

/// Refused everywhere with a reason matching `expect`; nothing left, nothing touched.
fn refuse_with(
    build: impl Fn(&Sentinel) -> Vec<u8>,
    opts: Options,
    expect: impl Fn(&Reason) -> bool,
) {
    for resolver in [Resolver::Auto, Resolver::ComponentWise] {
        let s = Sentinel::new();
        let tgz = build(&s);
        let err = run(&tgz, &opts, resolver, &s).expect_err("hostile archive must be refused");
        assert!(
            expect(err.reason()),
            "unexpected reason: {err} ({:?})",
            err.reason()
        );
        s.assert_root_empty();
        s.assert_outside_untouched();
        let err2 = archive::check(&tgz[..], &opts).expect_err("check must refuse too");
        assert_eq!(
            err2.class(),
            err.class(),
            "check and extract disagree: {err2} vs {err}"
        );
    }
}

fn refuse(build: impl Fn(&Sentinel) -> Vec<u8>, expect: impl Fn(&Reason) -> bool) {
    refuse_with(build, Options::default(), expect)
}

/// Accepted; the tree passes the containment oracle and nothing outside changed.
fn accept_with(build: impl Fn(&Sentinel) -> Vec<u8>, opts: Options, inspect: impl Fn(&Sentinel)) {
    for resolver in [Resolver::Auto, Resolver::ComponentWise] {
        let s = Sentinel::new();
        let tgz = build(&s);
        run(&tgz, &opts, resolver, &s).unwrap_or_else(|e| panic!("should be accepted: {e}"));
        check_contained(&s.root).expect("containment oracle");
        s.assert_outside_untouched();
        inspect(&s);
    }
}

/// The archive policy's strict mode (`archive.strictNames`).
fn strict() -> Options {
    let mut o = Options::default();
    o.limits.strict_names = true;
    o
}

fn tgz(f: impl FnOnce(&mut TarBuilder)) -> Vec<u8> {
    let mut t = TarBuilder::new();
    f(&mut t);
    t.tgz()
}

fn decoy(s: &Sentinel, rest: &str) -> String {
    format!("{}/{rest}", s.decoy.display())
}

fn limit(kind: LimitKind) -> impl Fn(&Reason) -> bool {
    move |r| matches!(r, Reason::Limit { kind: k, .. } if *k == kind)
}

macro_rules! is {
    ($p:pat) => {
        |r: &Reason| matches!(r, $p)
    };
}

// ---------------------------------------------------------------- A. entry names

#[test]
fn a01_absolute_path() {
    refuse(
        |s| {
            tgz(|t| {
                t.file(&decoy(s, "pwned"), b"x");
            })
        },
        is!(Reason::AbsolutePath),
    );
    refuse(
        |s| {
            tgz(|t| {
                t.file(&format!("/{}", decoy(s, "pwned")), b"x");
            })
        },
        is!(Reason::AbsolutePath),
    );
}

#[test]
fn a02_leading_dotdot() {
    refuse(
        |_| {
            tgz(|t| {
                t.file("../pwned", b"x");
            })
        },
        is!(Reason::DotDot),
    );
    refuse(
        |_| {
            tgz(|t| {
                t.file("../../decoy/victim.txt", b"x");
            })
        },
        is!(Reason::DotDot),
    );
}

#[test]
fn a03_embedded_dotdot_even_inside() {
    refuse(
        |_| {
            tgz(|t| {
                t.dir("a").file("a/../b", b"x");
            })
        },
        is!(Reason::DotDot),
    );
    refuse(
        |_| {
            tgz(|t| {
                t.file("tmp/../../moo", b"x");
            })
        },
        is!(Reason::DotDot),
    );
}

#[test]
fn a04_root_empty_dot_names() {
    refuse(
        |_| {
            tgz(|t| {
                t.file("", b"x");
            })
        },
        is!(Reason::EmptyName),
    );
    refuse(
        |_| {
            tgz(|t| {
                t.file(".", b"x");
            })
        },
        is!(Reason::RootNotDirectory),
    );
    refuse(
        |_| {
            tgz(|t| {
                t.dir("a").file("a/.", b"x");
            })
        },
        is!(Reason::DotComponent),
    );
}

#[test]
fn a05_non_canonical_spellings() {
    refuse(
        |_| {
            tgz(|t| {
                t.file("a//b", b"x");
            })
        },
        is!(Reason::EmptyComponent),
    );
    refuse(
        |_| {
            tgz(|t| {
                t.file("./a/./b", b"x");
            })
        },
        is!(Reason::DotComponent),
    );
    refuse(
        |_| {
            tgz(|t| {
                t.file("a/b/", b"x");
            })
        },
        is!(Reason::EmptyComponent),
    );
}

#[test]
fn a06_control_bytes() {
    // Ordinary bytes on Linux: Argo CD accepts them, so does the default (the name is written
    // as it is, fd-relative); the strict mode refuses them.
    for (name, byte) in [("a\nb", b'\n'), ("esc\x1b[2J", 0x1b), ("del\x7f", 0x7f)] {
        accept_with(
            |_| {
                tgz(|t| {
                    t.file(name, b"x");
                })
            },
            Options::default(),
            |s| assert_eq!(std::fs::read(s.root.join(name)).expect("read"), b"x"),
        );
        refuse_with(
            |_| {
                tgz(|t| {
                    t.file(name, b"x");
                })
            },
            strict(),
            move |r| matches!(r, Reason::ControlByte(b) if *b == byte),
        );
    }
    // Bytes hidden after the NUL terminator of the name field.
    refuse(
        |_| {
            tgz(|t| {
                t.header(&Hdr::new(b"a\0../../pwned", b'0'));
            })
        },
        is!(Reason::GarbageAfterNul("name")),
    );
    // A NUL inside a PAX path.
    refuse(
        |_| {
            tgz(|t| {
                t.pax(&[("path", b"a\0b")]).file("a", b"x");
            })
        },
        is!(Reason::PaxMalformed(_)),
    );
}

#[test]
fn a07_over_long_names() {
    let long = "d/".repeat(2100) + "f"; // 4201 bytes
    refuse(
        |_| {
            tgz(|t| {
                t.pax(&[("path", long.as_bytes())])
                    .file("placeholder", b"x");
            })
        },
        limit(LimitKind::PathBytes),
    );
    let comp = "c".repeat(256);
    refuse(
        |_| {
            tgz(|t| {
                t.pax(&[("path", comp.as_bytes())])
                    .file("placeholder", b"x");
            })
        },
        limit(LimitKind::ComponentBytes),
    );
}

#[test]
fn a08_very_deep_tree() {
    let deep = vec!["d"; 65].join("/");
    refuse(
        |_| {
            tgz(|t| {
                t.file(&deep, b"x");
            })
        },
        limit(LimitKind::PathDepth),
    );
    // 64 levels are fine.
    let ok = vec!["d"; 64].join("/");
    accept_with(
        |_| {
            tgz(|t| {
                t.file(&ok, b"x");
            })
        },
        Options::default(),
        |s| assert!(s.root.join(&ok).is_file()),
    );
}

#[test]
fn a09_windows_spellings() {
    // One file whose name holds backslashes (as Argo CD writes it): never a path on Linux.
    for name in ["..\\..\\decoy\\pwned", "C:\\Windows\\x"] {
        accept_with(
            |_| {
                tgz(|t| {
                    t.file(name, b"x");
                })
            },
            Options::default(),
            |s| {
                let entries: Vec<_> = std::fs::read_dir(&s.root)
                    .expect("root")
                    .map(|e| e.expect("entry").file_name())
                    .collect();
                assert_eq!(entries, vec![std::ffi::OsString::from(name)]);
            },
        );
        refuse_with(
            |_| {
                tgz(|t| {
                    t.file(name, b"x");
                })
            },
            strict(),
            is!(Reason::Backslash),
        );
    }
}

#[test]
fn a10_aliases_of_one_directory() {
    refuse(
        |_| {
            tgz(|t| {
                t.dir("a").dir("./a/");
            })
        },
        is!(Reason::Duplicate),
    );
    refuse(
        |_| {
            tgz(|t| {
                t.file("x", b"1").file("./x", b"2");
            })
        },
        is!(Reason::Duplicate),
    );
    // An implicit parent turned into a file.
    refuse(
        |_| {
            tgz(|t| {
                t.file("a/b", b"1").file("a", b"2");
            })
        },
        is!(Reason::Duplicate),
    );
}

// ---------------------------------------------------------------- B. symlinks

#[test]
fn b11_absolute_symlink_target() {
    // Read beneath the link's own directory and written relative, as Argo CD does: the decoy's
    // absolute path becomes a (dangling) path inside the tree, never the decoy.
    accept_with(
        |s| {
            tgz(|t| {
                t.dir("a").symlink("a/link", &decoy(s, "victim.txt"));
            })
        },
        Options::default(),
        |s| {
            let t = std::fs::read_link(s.root.join("a/link")).expect("link");
            assert!(t.is_relative(), "{}", t.display());
            assert_eq!(
                t,
                std::path::Path::new(&decoy(s, "victim.txt")[1..]),
                "Join(Dir(link), target), relative"
            );
            assert!(
                std::fs::read(s.root.join("a/link")).is_err(),
                "dangling in the tree"
            );
        },
    );
    accept_with(
        |_| {
            tgz(|t| {
                t.dir("conf").symlink("conf/null", "/dev/null");
            })
        },
        Options::default(),
        |s| {
            assert_eq!(
                std::fs::read_link(s.root.join("conf/null")).expect("link"),
                std::path::Path::new("dev/null")
            );
        },
    );
    // An absolute target that climbs above the tree once joined: refused, as Argo CD does.
    refuse(
        |_| {
            tgz(|t| {
                t.dir("a").symlink("a/up", "/../../etc/passwd");
            })
        },
        is!(Reason::SymlinkEscapes),
    );
    // The strict mode refuses every absolute target.
    refuse_with(
        |_| {
            tgz(|t| {
                t.symlink("etc", "/etc");
            })
        },
        strict(),
        is!(Reason::SymlinkAbsolute),
    );
}

#[test]
fn b12_relative_target_escaping() {
    refuse(
        |_| {
            tgz(|t| {
                t.symlink("link", "../decoy");
            })
        },
        is!(Reason::SymlinkEscapes),
    );
    refuse(
        |_| {
            tgz(|t| {
                t.dir("a").symlink("a/link", "../../x");
            })
        },
        is!(Reason::SymlinkEscapes),
    );
    refuse(
        |_| {
            tgz(|t| {
                t.symlink("link", "a/../../x");
            })
        },
        is!(Reason::SymlinkEscapes),
    );
    // archive.strictNames refuses any inner `..`, whatever it resolves to.
    refuse_with(
        |_| {
            tgz(|t| {
                t.symlink("link", "a/../x");
            })
        },
        strict(),
        is!(Reason::SymlinkInnerDotDot),
    );
    // ... and one that climbs above the tree, by its own count of the link's directories.
    refuse_with(
        |_| {
            tgz(|t| {
                t.dir("dir")
                    .dir("dir/sub")
                    .symlink("dir/sub/up", "../../../x");
            })
        },
        strict(),
        is!(Reason::SymlinkEscapes),
    );
}

#[test]
fn b13_write_through_symlinked_directory() {
    refuse(
        |_| {
            tgz(|t| {
                t.dir("sub").symlink("d", "sub").file("d/x", b"x");
            })
        },
        is!(Reason::BeneathSymlink),
    );
    refuse(
        |_| {
            tgz(|t| {
                t.dir("sub").symlink("d", "sub").dir("d/e");
            })
        },
        is!(Reason::BeneathSymlink),
    );
}

#[test]
fn b14_symlink_then_same_name_file() {
    refuse(
        |_| {
            tgz(|t| {
                t.file("x", b"1").symlink("moo", "x").file("moo", b"2");
            })
        },
        is!(Reason::Duplicate),
    );
}

#[test]
fn b15_symlink_then_same_name_directory() {
    refuse(
        |_| {
            tgz(|t| {
                t.dir("sub").symlink("moo", "sub").dir("moo");
            })
        },
        is!(Reason::Duplicate),
    );
}

#[test]
fn b16_directory_later_replaced_by_symlink() {
    refuse(
        |_| {
            tgz(|t| {
                t.dir("a").symlink("a", "b");
            })
        },
        is!(Reason::Duplicate),
    );
    refuse(
        |_| {
            tgz(|t| {
                t.file("a/x", b"1").symlink("a", ".");
            })
        },
        is!(Reason::Duplicate),
    );
}

#[test]
fn b17_chained_symlinks_lexical_collapse() {
    // jwilk dirsymlink2a: cur -> ., par -> cur/.., par/moo. `cur/..` is written cleaned (`.`,
    // the root: physically `cur/..` would be above it), and nothing is created beneath a link.
    refuse(
        |_| {
            tgz(|t| {
                t.symlink("cur", ".")
                    .symlink("par", "cur/..")
                    .file("par/moo", b"x");
            })
        },
        is!(Reason::BeneathSymlink),
    );
    accept_with(
        |_| {
            tgz(|t| {
                t.symlink("cur", ".").symlink("par", "cur/..");
            })
        },
        Options::default(),
        |s| {
            assert_eq!(
                std::fs::read_link(s.root.join("par")).expect("link"),
                std::path::Path::new(".")
            );
        },
    );
}

#[test]
fn b18_link_placed_through_a_link() {
    // jwilk dirsymlink2b: cur -> ., cur/par -> .., par/moo
    refuse(
        |_| {
            tgz(|t| {
                t.symlink("cur", ".")
                    .symlink("cur/par", "..")
                    .file("par/moo", b"x");
            })
        },
        is!(Reason::BeneathSymlink),
    );
}

#[test]
fn b19_lexical_vs_physical_escape() {
    // Lexically "lnk/up/../.." stays in; physically lnk is deep/er, so ../../.. from it escapes.
    refuse(
        |_| {
            tgz(|t| {
                t.dir("deep")
                    .dir("deep/er")
                    .symlink("lnk", "deep/er")
                    .symlink("lnk/up", "../../..");
            })
        },
        is!(Reason::BeneathSymlink),
    );
    refuse(
        |_| {
            tgz(|t| {
                t.dir("a").dir("a/b").symlink("a/b/c", "../../..");
            })
        },
        is!(Reason::SymlinkEscapes),
    );
}

#[test]
fn b20_order_games_and_dangling_targets() {
    // Dangling at creation, filled later: allowed, still contained.
    accept_with(
        |_| {
            tgz(|t| {
                t.symlink("link", "later/x").file("later/x", b"data");
            })
        },
        Options::default(),
        |s| {
            assert_eq!(
                std::fs::read(s.root.join("link")).expect("read via link"),
                b"data"
            );
        },
    );
    // A link that would escape once its target directory is later made a link, were it written
    // as given: it is written cleaned (`..`, the root), so what `b` becomes does not matter.
    accept_with(
        |_| {
            tgz(|t| {
                t.dir("a").symlink("a/l", "../b/..").dir("b");
            })
        },
        Options::default(),
        |s| {
            assert_eq!(
                std::fs::read_link(s.root.join("a/l")).expect("link"),
                std::path::Path::new("..")
            );
        },
    );
}

#[test]
fn b21_path_max_resolution_overflow() {
    // CVE-2025-4517 shape: deep long components, then a link climbing past the root.
    let comp = "a".repeat(240);
    let dirs: Vec<String> = (1..=16).map(|i| vec![comp.as_str(); i].join("/")).collect();
    let link = format!("{}/l", dirs[15]);
    let target = "../".repeat(17) + "decoy/victim.txt";
    refuse(
        |_| {
            tgz(|t| {
                for d in &dirs {
                    t.pax(&[("path", d.as_bytes())]).dir("placeholder");
                }
                t.pax(&[("path", link.as_bytes()), ("linkpath", target.as_bytes())])
                    .symlink("placeholder", "x");
            })
        },
        |r| matches!(r, Reason::SymlinkEscapes | Reason::Limit { .. }),
    );
}

#[test]
fn b22_loops_and_long_chains_stay_contained() {
    accept_with(
        |_| {
            tgz(|t| {
                t.symlink("a", "b").symlink("b", "a");
                t.symlink("l0", ".");
                for i in 1..60 {
                    t.symlink(&format!("l{i}"), &format!("l{}", i - 1));
                }
            })
        },
        Options::default(),
        |s| {
            assert_eq!(
                std::fs::metadata(s.root.join("a"))
                    .expect_err("loop")
                    .raw_os_error(),
                Some(libc_eloop())
            );
        },
    );
}

fn libc_eloop() -> i32 {
    rustix::io::Errno::LOOP.raw_os_error()
}

#[test]
fn b23_oversized_target() {
    let target = "x/".repeat(2100);
    refuse(
        |_| {
            tgz(|t| {
                t.pax(&[("linkpath", target.as_bytes())])
                    .symlink("l", "placeholder");
            })
        },
        limit(LimitKind::LinkTargetBytes),
    );
}

#[test]
fn b24_symlink_count_amplification() {
    let opts = Options {
        limits: Limits {
            symlinks: 10,
            ..Limits::default()
        },
        ..Options::default()
    };
    refuse_with(
        |_| {
            tgz(|t| {
                t.file("big", b"x");
                for i in 0..11 {
                    t.symlink(&format!("l{i}"), "big");
                }
            })
        },
        opts,
        limit(LimitKind::Symlinks),
    );
}

// ---------------------------------------------------------------- C. hard links

#[test]
fn c25_absolute_hardlink_target() {
    refuse(
        |s| {
            tgz(|t| {
                t.hardlink("h", &decoy(s, "victim.txt"));
            })
        },
        is!(Reason::HardLink),
    );
}

#[test]
fn c26_hardlink_with_dotdot() {
    refuse(
        |_| {
            tgz(|t| {
                t.hardlink("h", "../decoy/victim.txt");
            })
        },
        is!(Reason::HardLink),
    );
}

#[test]
fn c27_hardlink_via_symlinked_parent() {
    refuse(
        |_| {
            tgz(|t| {
                t.dir("sub").symlink("s", "sub").hardlink("h", "s/x");
            })
        },
        is!(Reason::HardLink),
    );
}

#[test]
fn c28_hardlink_to_symlink_relocation() {
    refuse(
        |_| {
            tgz(|t| {
                t.file("x", b"1")
                    .dir("d1")
                    .dir("d1/d2")
                    .dir("d1/d2/d3")
                    .symlink("d1/d2/d3/s", "../../../x")
                    .hardlink("h", "d1/d2/d3/s");
            })
        },
        is!(Reason::HardLink),
    );
}

#[test]
fn c29_hardlink_then_write() {
    refuse(
        |s| {
            tgz(|t| {
                t.hardlink("h", &decoy(s, "victim.txt")).file("h", b"owned");
            })
        },
        is!(Reason::HardLink),
    );
}

#[test]
fn c30_hardlink_carrying_data() {
    refuse(
        |_| {
            tgz(|t| {
                let mut h = Hdr::new("h", b'1');
                h.linkname = b"x".to_vec();
                h.size = 5;
                t.file("x", b"1").header(&h).data(b"extra");
            })
        },
        is!(Reason::HardLink),
    );
}

// ---------------------------------------------------------------- D. types and metadata

#[test]
fn d31_device_nodes() {
    refuse(
        |_| {
            tgz(|t| {
                t.header(&Hdr::new("null", b'3'));
            })
        },
        is!(Reason::Device),
    );
    refuse(
        |_| {
            tgz(|t| {
                t.header(&Hdr::new("sda", b'4'));
            })
        },
        is!(Reason::Device),
    );
}

#[test]
fn d32_fifos_and_sockets() {
    refuse(
        |_| {
            tgz(|t| {
                t.header(&Hdr::new("fifo", b'6'));
            })
        },
        is!(Reason::Fifo),
    );
}

#[test]
fn d33_unknown_and_exotic_typeflags() {
    for tf in [b'7', b'D', b'M', b'N', b'V', b'X', b'A', b'\0'] {
        refuse(
            |_| {
                tgz(|t| {
                    t.header(&Hdr::new("weird", tf));
                })
            },
            |r| matches!(r, Reason::UnknownType(_) | Reason::Contiguous),
        );
    }
}

#[test]
fn d34_privileged_modes_are_sanitised() {
    let build = |_: &Sentinel| {
        tgz(|t| {
            t.file_mode("suid", b"x", 0o4755)
                .file_mode("world", b"x", 0o777)
                .file_mode("plain", b"x", 0o600);
            let mut d = Hdr::new("sticky", b'5');
            d.mode = 0o1777;
            t.header(&d);
        })
    };
    accept_with(build, Options::default(), |s| {
        for f in ["suid", "world", "plain"] {
            assert_eq!(mode(s, f), 0o644, "{f}");
        }
        assert_eq!(mode(s, "sticky"), 0o755);
    });
    accept_with(
        build,
        Options {
            preserve_file_mode: true,
            ..Options::default()
        },
        |s| {
            assert_eq!(mode(s, "suid"), 0o755);
            assert_eq!(mode(s, "world"), 0o755);
            assert_eq!(mode(s, "plain"), 0o644);
        },
    );
}

fn mode(s: &Sentinel, p: &str) -> u32 {
    std::fs::symlink_metadata(s.root.join(p))
        .expect("stat")
        .permissions()
        .mode()
        & 0o7777
}

#[test]
fn d35_modes_that_break_cleanup() {
    // A 0000 directory with content, then a violation: cleanup must still empty the root.
    refuse(
        |_| {
            tgz(|t| {
                let mut d = Hdr::new("locked", b'5');
                d.mode = 0;
                t.header(&d)
                    .file_mode("locked/f", b"x", 0)
                    .file("../bad", b"x");
            })
        },
        is!(Reason::DotDot),
    );
}

#[test]
fn d36_ownership_is_ignored() {
    accept_with(
        |_| {
            tgz(|t| {
                let mut h = Hdr::new("rootfile", b'0');
                h.uid = 0;
                h.gid = 0;
                t.header(&h);
                t.pax(&[("uid", b"4242"), ("gid", b"4242"), ("uname", b"root")])
                    .file("paxowned", b"x");
            })
        },
        Options::default(),
        |s| {
            let me = rustix::process::geteuid().as_raw();
            for f in ["rootfile", "paxowned"] {
                assert_eq!(std::fs::metadata(s.root.join(f)).expect("stat").uid(), me);
            }
        },
    );
}

#[test]
fn d37_xattrs_acls_labels() {
    for key in [
        "SCHILY.xattr.security.capability",
        "LIBARCHIVE.xattr.user.x",
        "SCHILY.acl.access",
        "RHT.security.selinux",
    ] {
        refuse(
            |_| {
                tgz(|t| {
                    t.pax(&[(key, b"v")]).file("f", b"x");
                })
            },
            is!(Reason::PaxKeyNotAllowed(_)),
        );
    }
}

#[test]
fn d38_timestamps_are_ignored() {
    accept_with(
        |_| {
            tgz(|t| {
                let mut h = Hdr::new("future", b'0');
                h.mtime = 0o77777777777;
                t.header(&h);
                t.pax(&[("mtime", b"-99999999.5")]).file("past", b"x");
            })
        },
        Options::default(),
        |s| {
            let now = std::time::SystemTime::now();
            for f in ["future", "past"] {
                let m = std::fs::metadata(s.root.join(f))
                    .expect("stat")
                    .modified()
                    .expect("mtime");
                let age = now.duration_since(m).unwrap_or_default();
                assert!(age < Duration::from_secs(3600), "{f}: header time applied");
            }
        },
    );
}

#[test]
fn d39_sparse_entries() {
    refuse(
        |_| {
            tgz(|t| {
                let mut h = Hdr::new("sparse", b'S');
                h.magic = Magic::Gnu;
                t.header(&h);
            })
        },
        is!(Reason::Sparse),
    );
    refuse(
        |_| {
            tgz(|t| {
                t.pax(&[("GNU.sparse.major", b"1"), ("GNU.sparse.minor", b"0")])
                    .file("s", b"x");
            })
        },
        is!(Reason::PaxKeyNotAllowed(_)),
    );
}

// ---------------------------------------------------------------- E. smuggling and differentials

#[test]
fn e40_pax_size_vs_ustar_size() {
    // TARmageddon: header size 0, PAX size covers an embedded tar with a traversal entry.
    let mut inner = TarBuilder::new();
    inner.file("../smuggled", b"x");
    let inner = inner.buf;
    refuse(
        |_| {
            tgz(|t| {
                t.pax(&[("size", inner.len().to_string().as_bytes())]);
                t.header(&Hdr::new("innocent", b'0')).raw(&inner);
            })
        },
        is!(Reason::PaxSizeMismatch { .. }),
    );
}

#[test]
fn e41_stale_or_dangling_extension_state() {
    refuse(
        |_| {
            tgz(|t| {
                t.file("a", b"x").pax(&[("path", b"b")]);
            })
        },
        is!(Reason::PaxDangling),
    );
    refuse(
        |_| {
            tgz(|t| {
                t.pax(&[("path", b"b")])
                    .pax(&[("path", b"c")])
                    .file("a", b"x");
            })
        },
        is!(Reason::PaxDangling),
    );
    refuse(
        |_| {
            tgz(|t| {
                t.pax(&[("path", b"b")]).header(&Hdr::new("g", b'g'));
            })
        },
        is!(Reason::PaxGlobal),
    );
}

#[test]
fn e42_gnu_long_names() {
    refuse(
        |_| {
            tgz(|t| {
                t.gnu_long_name(b"../../pwned").file("short", b"x");
            })
        },
        is!(Reason::GnuLongName),
    );
    refuse(
        |_| {
            tgz(|t| {
                let mut k = Hdr::new("././@LongLink", b'K');
                k.magic = Magic::Gnu;
                k.size = 4;
                t.header(&k).data(b"/x\0\0").symlink("l", "y");
            })
        },
        is!(Reason::GnuLongName),
    );
    refuse(
        |_| {
            tgz(|t| {
                t.pax(&[("path", b"p")]).gnu_long_name(b"q").file("r", b"x");
            })
        },
        |r| matches!(r, Reason::GnuLongName | Reason::PaxDangling),
    );
}

#[test]
fn e43_duplicate_pax_keys() {
    refuse(
        |_| {
            tgz(|t| {
                t.pax(&[("path", b"safe"), ("path", b"../evil")])
                    .file("x", b"x");
            })
        },
        is!(Reason::PaxDuplicateKey(_)),
    );
}

#[test]
fn e44_malformed_pax_records() {
    refuse(
        |_| {
            tgz(|t| {
                t.pax_raw(b"99 path=short\n").file("x", b"x");
            })
        },
        is!(Reason::PaxMalformed(_)),
    );
    refuse(
        |_| {
            tgz(|t| {
                t.pax_raw(b"12 path=abc ").file("x", b"x");
            })
        },
        is!(Reason::PaxMalformed(_)),
    );
    refuse(
        |_| {
            tgz(|t| {
                t.pax_raw(b"9 pathab\n").file("x", b"x");
            })
        },
        is!(Reason::PaxMalformed(_)),
    );
    // A newline inside the value: tar-rs would skip the record, Go would honour it.
    refuse(
        |_| {
            tgz(|t| {
                t.pax_raw(&pax_record("path", b"a\n../../evil"))
                    .file("x", b"x");
            })
        },
        is!(Reason::DotDot),
    );
}

#[test]
fn e45_pax_keys_outside_allowlist() {
    for key in ["comment", "hdrcharset", "charset", "GOLANG.pkg"] {
        refuse(
            |_| {
                tgz(|t| {
                    t.pax(&[(key, b"v")]).file("x", b"x");
                })
            },
            is!(Reason::PaxKeyNotAllowed(_)),
        );
    }
}

#[test]
fn e46_global_headers() {
    refuse(
        |_| {
            tgz(|t| {
                let body = pax_record("path", b"../evil");
                let mut g = Hdr::new("pax_global_header", b'g');
                g.size = body.len() as u64;
                t.header(&g).data(&body).file("x", b"x");
            })
        },
        is!(Reason::PaxGlobal),
    );
}

#[test]
fn e47_base256_and_odd_numerics() {
    refuse(
        |_| {
            tgz(|t| {
                t.header(&Hdr::new("f", b'0').set(124, &[0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]))
                    .data(b"ab");
            })
        },
        is!(Reason::Base256("size")),
    );
    refuse(
        |_| {
            tgz(|t| {
                t.header(&Hdr::new("f", b'0').set(108, &[0xff; 8]));
            })
        },
        is!(Reason::Base256("uid")),
    );
    refuse(
        |_| {
            tgz(|t| {
                t.header(&Hdr::new("f", b'0').set(100, b"0x00644\0"));
            })
        },
        is!(Reason::BadNumber("mode")),
    );
    refuse(
        |_| {
            tgz(|t| {
                t.header(&Hdr::new("f", b'0').set(136, b"-0000000001\0"));
            })
        },
        is!(Reason::BadNumber("mtime")),
    );
}

#[test]
fn e48_checksum_variants() {
    refuse(
        |_| {
            tgz(|t| {
                let mut h = Hdr::new("f", b'0');
                h.bad_checksum = true;
                t.header(&h);
            })
        },
        |r| r.class() == ErrorClass::Integrity,
    );
    refuse(
        |_| {
            tgz(|t| {
                t.header(&Hdr::new("f", b'0').set(148, b"zzzzzz\0 "));
            })
        },
        |r| r.class() == ErrorClass::Integrity,
    );
}

#[test]
fn e49_bytes_after_end_and_extra_members() {
    let mut tb = TarBuilder::new();
    tb.file("a", b"x");
    let mut tail = tb.finish();
    tail.extend_from_slice(b"hidden data after the end marker");
    tail.resize(tail.len().div_ceil(512) * 512, 0);
    refuse(|_| gzip(&tail), is!(Reason::DataAfterEnd));
    refuse(
        |_| {
            let mut g = tb.tgz();
            g.extend(gzip(b"second member"));
            g
        },
        is!(Reason::TrailingGzipData),
    );
    refuse(
        |_| {
            let mut g = tb.tgz();
            g.extend_from_slice(b"garbage");
            g
        },
        is!(Reason::TrailingGzipData),
    );
    refuse(
        |_| {
            let mut z = tb.finish();
            z.resize(z.len() + 2 * 1024 * 1024, 0);
            gzip(&z)
        },
        limit(LimitKind::TrailingBytes),
    );
}

#[test]
fn e50_ustar_prefix_abuse() {
    refuse(
        |_| {
            tgz(|t| {
                let mut h = Hdr::new("x", b'0');
                h.prefix = b"../..".to_vec();
                t.header(&h);
            })
        },
        is!(Reason::DotDot),
    );
    refuse(
        |_| {
            tgz(|t| {
                let mut h = Hdr::new("x", b'0');
                h.prefix = b"/etc".to_vec();
                t.header(&h);
            })
        },
        is!(Reason::AbsolutePath),
    );
    // Prefix bytes on a v7 header (ignored by some parsers, joined by others).
    refuse(
        |_| {
            tgz(|t| {
                let mut h = Hdr::new("x", b'0');
                h.magic = Magic::V7;
                t.header(&h.set(345, b"evil"));
            })
        },
        is!(Reason::BadMagic),
    );
    // Ambiguous NUL-version ustar.
    refuse(
        |_| {
            tgz(|t| {
                let mut h = Hdr::new("x", b'0');
                h.magic = Magic::Raw(*b"ustar\0\0\0");
                t.header(&h);
            })
        },
        is!(Reason::BadMagic),
    );
}

#[test]
fn e51_truncation() {
    let mut tb = TarBuilder::new();
    tb.file("a", &[7u8; 5000]);
    let full = tb.finish();
    refuse(|_| gzip(&full[..512 + 1000]), is!(Reason::Truncated));
    refuse(
        |_| {
            let g = tb.tgz();
            g[..g.len() - 20].to_vec()
        },
        |r| r.class() == ErrorClass::Integrity,
    );
    refuse(|_| gzip(&tb.buf), is!(Reason::MissingEndMarker));
    refuse(
        |_| {
            let mut one = tb.buf.clone();
            one.extend_from_slice(&[0u8; 512]);
            gzip(&one)
        },
        is!(Reason::MissingEndMarker),
    );
    refuse(|_| Vec::new(), is!(Reason::Truncated));
}

// ---------------------------------------------------------------- F. resource exhaustion

#[test]
fn f52_decompression_bomb() {
    refuse(
        |_| {
            let mut h = Hdr::new("bomb", b'0');
            h.size = 64 * 1024 * 1024;
            let mut t = TarBuilder::new();
            t.header(&h).data(&vec![0u8; 64 * 1024 * 1024]);
            t.tgz()
        },
        limit(LimitKind::CompressionRatio),
    );
}

#[test]
fn f53_declared_size_lies() {
    refuse(
        |_| {
            tgz(|t| {
                let mut h = Hdr::new("f", b'0');
                h.size = 100_000;
                t.header(&h).data(&[1u8; 1000]);
            })
        },
        |r| matches!(r, Reason::Truncated | Reason::MissingEndMarker),
    );
    refuse(
        |_| {
            tgz(|t| {
                let mut h = Hdr::new("f", b'0');
                h.size = 300 * 1024 * 1024;
                t.header(&h);
            })
        },
        limit(LimitKind::FileBytes),
    );
}

#[test]
fn f54_metadata_header_memory() {
    refuse(
        |_| {
            tgz(|t| {
                let mut h = Hdr::new("x", b'x');
                h.size = 100 * 1024 * 1024;
                t.header(&h);
            })
        },
        limit(LimitKind::PaxHeaderBytes),
    );
    refuse(
        |_| {
            tgz(|t| {
                let mut h = Hdr::new("L", b'L');
                h.magic = Magic::Gnu;
                h.size = 100 * 1024 * 1024;
                t.header(&h);
            })
        },
        is!(Reason::GnuLongName),
    );
    // A gzip FNAME field that never ends.
    refuse(
        |_| {
            let mut g = vec![0x1f, 0x8b, 8, 0x08, 0, 0, 0, 0, 0, 255];
            g.extend(std::iter::repeat_n(b'a', 100_000));
            g
        },
        limit(LimitKind::GzipHeaderBytes),
    );
}

#[test]
fn f55_entry_count_flood() {
    let opts = Options {
        limits: Limits {
            entries: 100,
            ..Limits::default()
        },
        ..Options::default()
    };
    refuse_with(
        |_| {
            tgz(|t| {
                for i in 0..101 {
                    t.file(&format!("f{i}"), b"");
                }
            })
        },
        opts,
        limit(LimitKind::Entries),
    );
    // The default limit, checked without writing.
    let mut t = TarBuilder::new();
    for i in 0..100_001 {
        t.dir(&format!("d{i}"));
    }
    let err = archive::check(&t.tgz()[..], &Options::default()).expect_err("flood");
    assert!(limit(LimitKind::Entries)(err.reason()), "{err}");
}

/// Yields its bytes slowly.
struct Slow<'a>(&'a [u8]);
impl Read for Slow<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        std::thread::sleep(Duration::from_millis(20));
        let n = self.0.len().min(buf.len()).min(64);
        buf[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        Ok(n)
    }
}

#[test]
fn f56_slow_stream() {
    let s = Sentinel::new();
    let data = tgz(|t| {
        t.file("a", &testkit::incompressible(20_000, 5));
    });
    let opts = Options {
        limits: Limits {
            wall_clock: Duration::from_millis(300),
            ..Limits::default()
        },
        ..Options::default()
    };
    let err = archive::extract_to_dir(Slow(&data), &s.root, &opts).expect_err("too slow");
    assert!(limit(LimitKind::WallClock)(err.reason()), "{err}");
    s.assert_root_empty();
    s.assert_outside_untouched();
}

#[test]
fn f57_disk_fill() {
    let opts = Options {
        limits: Limits {
            extracted_bytes: 1024 * 1024,
            ..Limits::default()
        },
        ..Options::default()
    };
    refuse_with(
        |_| {
            tgz(|t| {
                for i in 0..5 {
                    t.file(&format!("f{i}"), &testkit::incompressible(300_000, i));
                }
            })
        },
        opts,
        limit(LimitKind::ExtractedBytes),
    );
    let opts = Options {
        limits: Limits {
            compressed_bytes: 10_000,
            ..Limits::default()
        },
        ..Options::default()
    };
    refuse_with(
        |_| {
            tgz(|t| {
                t.file("f", &testkit::incompressible(50_000, 9));
            })
        },
        opts,
        limit(LimitKind::CompressedBytes),
    );
}

// ---------------------------------------------------------------- G. protocol and process

#[test]
fn g58_pre_existing_directory() {
    let s = Sentinel::new();
    std::fs::write(s.root.join("previous-request"), b"secret").expect("write");
    let data = tgz(|t| {
        t.file("a", b"x");
    });
    let err =
        archive::extract_to_dir(&data[..], &s.root, &Options::default()).expect_err("not empty");
    assert!(matches!(err.reason(), Reason::DestinationNotEmpty));
    assert_eq!(
        std::fs::read(s.root.join("previous-request")).expect("kept"),
        b"secret"
    );
}

#[test]
fn g59_no_spool_or_temp_files_in_tree() {
    accept_with(
        |_| {
            tgz(|t| {
                t.dir(".").file("a", b"1").file("b/c", b"2");
            })
        },
        Options::default(),
        |s| {
            let names: Vec<String> = testkit::describe_tree(&s.root).into_keys().collect();
            assert_eq!(names, ["a", "b", "b/c"]);
        },
    );
}

#[test]
fn g61_integrity_metadata() {
    let data = tgz(|t| {
        t.file("a", b"x");
    });
    let opts = Options {
        expected_sha256: Some([0u8; 32]),
        ..Options::default()
    };
    refuse_with(|_| data.clone(), opts, is!(Reason::ChecksumMismatch { .. }));
    let good: [u8; 32] = archive::check(&data[..], &Options::default())
        .expect("ok")
        .sha256
        .expect("computed by default");
    accept_with(
        |_| data.clone(),
        Options {
            expected_sha256: Some(good),
            ..Options::default()
        },
        |_| {},
    );
    // skip_digest (the server hashes what it forwards) skips the hash, never a verification
    // asked for.
    let skipped = Options {
        skip_digest: true,
        ..Options::default()
    };
    assert_eq!(
        archive::check(&data[..], &skipped).expect("ok").sha256,
        None
    );
    refuse_with(
        |_| data.clone(),
        Options {
            expected_sha256: Some([0u8; 32]),
            skip_digest: true,
            ..Options::default()
        },
        is!(Reason::ChecksumMismatch { .. }),
    );
}

#[test]
fn g62_partial_failure_removes_everything() {
    refuse(
        |_| {
            tgz(|t| {
                for i in 0..200 {
                    t.file(&format!("dir{}/f{i}", i % 7), b"content");
                }
                t.symlink("dir0/up", "..");
                t.file("dir3/../../escape", b"x");
            })
        },
        is!(Reason::DotDot),
    );
}

#[test]
fn non_utf8_names_are_accepted_and_contained() {
    // Linux names are bytes; Go's writer passes them through. Found by the `entries` fuzz target
    // (the oracle, not the extractor, mishandled them).
    accept_with(
        |_| {
            tgz(|t| {
                t.header(&Hdr::new(b"caf\xe9.yaml", b'0'))
                    .symlink("l", "caf\u{e9}");
            })
        },
        Options::default(),
        |s| {
            let names = testkit::describe_paths(&s.root);
            assert!(
                names.contains_key(std::path::Path::new(std::ffi::OsStr::from_bytes(
                    b"caf\xe9.yaml"
                )))
            );
        },
    );
}
