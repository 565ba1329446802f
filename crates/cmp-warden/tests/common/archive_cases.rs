//! One repository per archive limit of the policy, each over exactly that limit, and the
//! policy edits that set the limits: shared by the tests that prove `serve`, `render` and
//! `appset serve` all enforce every archive limit of a custom policy.

use std::path::Path;

/// A custom policy's archive limits (edits of the default policy), far below the defaults.
pub const SMALL_LIMITS: &[(&str, &str)] = &[
    ("compressedBytes: 100Mi", "compressedBytes: 256Ki"),
    ("extractedBytes: 1Gi", "extractedBytes: 1Mi"),
    ("fileBytes: 256Mi", "fileBytes: 512Ki"),
    ("entries: 100000", "entries: 20"),
    ("symlinks: 10000", "symlinks: 1"),
    ("pathDepth: 64", "pathDepth: 4"),
];

/// The ratio rule applies past 16 MiB, so its case needs room for that.
pub const RATIO_LIMITS: &[(&str, &str)] = &[
    ("extractedBytes: 1Gi", "extractedBytes: 64Mi"),
    ("fileBytes: 256Mi", "fileBytes: 64Mi"),
    ("maxRatio: 250", "maxRatio: 100"),
];

/// The extraction wall clock (only a slow client can make extraction take long enough).
pub const WALL_LIMITS: &[(&str, &str)] = &[("wallSeconds: 120", "wallSeconds: 1")];

/// One case: its name, the policy edits it runs under, how to fill the repository, and the
/// text the refusal must contain (the limit's name and its policy value).
pub struct Case {
    pub name: &'static str,
    pub policy: &'static [(&'static str, &'static str)],
    pub fill: fn(&Path),
    pub expect: &'static str,
}

fn write(dir: &Path, rel: &str, data: &[u8]) {
    let p = dir.join(rel);
    std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
    std::fs::write(p, data).expect("write");
}

/// Bytes deflate cannot shrink.
pub fn incompressible(n: usize) -> Vec<u8> {
    testkit::incompressible(n, 1)
}

/// Every size and count limit; the wall clock is [`WALL_LIMITS`], driven by a slow client.
pub fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "compressedBytes",
            policy: SMALL_LIMITS,
            fill: |d| write(d, "big.bin", &incompressible(300 << 10)),
            expect: "262144",
        },
        Case {
            name: "extractedBytes",
            policy: SMALL_LIMITS,
            fill: |d| {
                for f in ["a.bin", "b.bin", "c.bin"] {
                    write(d, f, &vec![0u8; 400 << 10]);
                }
            },
            expect: "extracted bytes limit of 1048576 exceeded",
        },
        Case {
            name: "fileBytes",
            policy: SMALL_LIMITS,
            fill: |d| write(d, "big.bin", &vec![0u8; 600 << 10]),
            expect: "file size limit of 524288 exceeded",
        },
        Case {
            name: "entries",
            policy: SMALL_LIMITS,
            fill: |d| {
                for i in 0..25 {
                    write(d, &format!("f{i:02}"), b"x");
                }
            },
            expect: "entry count limit of 20 exceeded",
        },
        Case {
            name: "symlinks",
            policy: SMALL_LIMITS,
            fill: |d| {
                write(d, "f", b"x");
                for l in ["l1", "l2"] {
                    std::os::unix::fs::symlink("f", d.join(l)).expect("symlink");
                }
            },
            expect: "symlink count limit of 1 exceeded",
        },
        Case {
            name: "pathDepth",
            policy: SMALL_LIMITS,
            fill: |d| write(d, "a/b/c/d/e/f.txt", b"deep"),
            expect: "path depth limit of 4 exceeded",
        },
        Case {
            name: "maxRatio",
            policy: RATIO_LIMITS,
            fill: |d| write(d, "zeros.bin", &vec![0u8; 17 << 20]),
            expect: "compression ratio limit of 100 exceeded",
        },
    ]
}
