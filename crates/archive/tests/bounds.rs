//! Each bound at its edge, and what a refusal reports.
//!
//! A value exactly at a limit is accepted and one past it refused with that limit's
//! [`LimitKind`] (an off-by-one either way is a mutant these kill); the framing rules of gzip
//! (optional header fields, the header CRC, the magic on a short or trickling input) and of tar
//! (the end marker, what may follow it, v7 and ustar layouts, PAX values) each at the byte that
//! decides; and a refusal names its class, its entry's index and escaped name, and a summary
//! counts what was accepted.

use std::io::{self, Read, Write};
use std::time::Duration;

use archive::{
    ErrorClass, ExtractError, LimitKind, Limits, NullSink, Options, Reason, Sink, Summary,
};
use sha2::Digest;
use testkit::{Hdr, Magic, TarBuilder, gzip, pax_record};

fn with(f: impl FnOnce(&mut Limits)) -> Options {
    let mut o = Options::default();
    f(&mut o.limits);
    o
}

fn check(tgz: &[u8], opts: &Options) -> Result<Summary, ExtractError> {
    archive::check(tgz, opts)
}

/// Refused because of `kind`.
#[track_caller]
fn over(tgz: &[u8], opts: &Options, kind: LimitKind) -> ExtractError {
    let err = check(tgz, opts).expect_err("one past the limit must be refused");
    assert_limit(&err, kind);
    err
}

/// Refused because of `kind`, in its class.
#[track_caller]
fn assert_limit(err: &ExtractError, kind: LimitKind) {
    assert!(
        matches!(err.reason(), Reason::Limit { kind: k, .. } if *k == kind),
        "{kind:?}: {err}"
    );
    assert_eq!(err.class(), ErrorClass::LimitExceeded, "{err}");
}

#[track_caller]
fn at(tgz: &[u8], opts: &Options) -> Summary {
    check(tgz, opts).unwrap_or_else(|e| panic!("exactly at the limit is accepted: {e}"))
}

fn files(n: usize, size: usize) -> TarBuilder {
    let mut t = TarBuilder::new();
    for i in 0..n {
        t.file(&format!("f{i}"), &vec![b'x'; size]);
    }
    t
}

#[test]
fn entries_files_and_symlinks_at_their_limits() {
    let opts = with(|l| l.entries = 3);
    at(&files(3, 1).tgz(), &opts);
    let err = over(&files(4, 1).tgz(), &opts, LimitKind::Entries);
    // The fourth header, by its 0-based index, and its name.
    assert_eq!(err.entry_index(), Some(3), "{err}");
    assert_eq!(err.entry_name(), Some("f3"), "{err}");
    assert!(
        err.to_string().ends_with(" (entry 3, name \"f3\")"),
        "{err}"
    );

    let opts = with(|l| l.file_bytes = 10);
    at(&files(1, 10).tgz(), &opts);
    over(&files(1, 11).tgz(), &opts, LimitKind::FileBytes);

    let links = |n: usize| {
        let mut t = TarBuilder::new();
        t.file("target", b"x");
        for i in 0..n {
            t.symlink(&format!("l{i}"), "target");
        }
        t.tgz()
    };
    let opts = with(|l| l.symlinks = 2);
    assert_eq!(at(&links(2), &opts).symlinks, 2);
    over(&links(3), &opts, LimitKind::Symlinks);
}

#[test]
fn a_pax_header_at_its_limit() {
    let body = pax_record("path", b"named-by-pax");
    let mut t = TarBuilder::new();
    t.pax_raw(&body).file("f", b"x");
    let tgz = t.tgz();
    let opts = with(|l| l.pax_header_bytes = body.len() as u64);
    at(&tgz, &opts);
    let opts = with(|l| l.pax_header_bytes = body.len() as u64 - 1);
    over(&tgz, &opts, LimitKind::PaxHeaderBytes);
}

#[test]
fn compressed_and_extracted_bytes_at_their_limits() {
    let t = files(2, 700);
    let (tar, tgz) = (t.finish(), t.tgz());
    let s = at(&tgz, &with(|l| l.compressed_bytes = tgz.len() as u64));
    assert_eq!(s.compressed_bytes, tgz.len() as u64);
    over(
        &tgz,
        &with(|l| l.compressed_bytes = tgz.len() as u64 - 1),
        LimitKind::CompressedBytes,
    );
    let s = at(&tgz, &with(|l| l.extracted_bytes = tar.len() as u64));
    assert_eq!(s.tar_bytes, tar.len() as u64);
    over(
        &tgz,
        &with(|l| l.extracted_bytes = tar.len() as u64 - 1),
        LimitKind::ExtractedBytes,
    );
}

#[test]
fn the_ratio_rule_starts_exactly_at_its_grace() {
    // Zeros compress far better than 1:1: past the grace every read breaks a ratio of 1.
    let t = files(4, 4096);
    let (tar, tgz) = (t.finish(), t.tgz());
    let opts = |grace: usize| {
        with(|l| {
            l.max_ratio = 1;
            l.ratio_grace_bytes = grace as u64;
        })
    };
    at(&tgz, &opts(tar.len() + 1));
    over(&tgz, &opts(tar.len()), LimitKind::CompressionRatio);
}

/// The end marker, and `trailing_bytes` of zeros after it.
fn ended(trailing: usize) -> Vec<u8> {
    let mut tar = files(1, 3).finish();
    tar.extend(std::iter::repeat_n(0u8, trailing));
    gzip(&tar)
}

#[test]
fn zeros_after_the_end_marker_at_their_limit() {
    let opts = with(|l| l.trailing_bytes = 1000);
    at(&ended(1000), &opts);
    over(&ended(1001), &opts, LimitKind::TrailingBytes);
    let opts = with(|l| l.trailing_bytes = 0);
    at(&ended(0), &opts);
    over(&ended(1), &opts, LimitKind::TrailingBytes);
    // A record's worth (GNU tar pads to 10 KiB) under the default.
    at(&ended(10240 - 1024 - 1024), &Options::default());
}

#[test]
fn an_end_marker_short_of_two_blocks_is_refused() {
    for zeros in [0usize, 512, 700, 1023] {
        let mut tar = files(1, 3).buf;
        tar.extend(std::iter::repeat_n(0u8, zeros));
        let err = check(&gzip(&tar), &Options::default()).expect_err("no full end marker");
        assert!(
            matches!(err.reason(), Reason::MissingEndMarker),
            "{zeros}: {err}"
        );
        assert_eq!(err.class(), ErrorClass::Integrity);
    }
}

#[test]
fn a_dangling_pax_header_is_reported_after_the_last_header() {
    let mut t = TarBuilder::new();
    t.file("a", b"x").pax(&[("path", b"b")]);
    let err = check(&t.tgz(), &Options::default()).expect_err("dangling");
    assert!(matches!(err.reason(), Reason::PaxDangling), "{err}");
    // Two headers were read: the refusal is at the (missing) third.
    assert_eq!(err.entry_index(), Some(2), "{err}");
    assert_eq!(err.entry_name(), None);
}

#[test]
fn a_summary_counts_what_was_accepted() {
    let mut t = TarBuilder::new();
    t.dir("d")
        .file("d/a", b"abc")
        .dir("e")
        .file("e/b", b"hello")
        .file("c", b"")
        .symlink("l", "c");
    let (tar, tgz) = (t.finish(), t.tgz());
    let digest: [u8; 32] = sha2::Sha256::digest(&tgz).into();
    let s = check(&tgz, &Options::default()).expect("accepted");
    assert_eq!(
        s,
        Summary {
            entries: 6,
            files: 3,
            dirs: 2,
            symlinks: 1,
            file_bytes: 8,
            compressed_bytes: tgz.len() as u64,
            tar_bytes: tar.len() as u64,
            sha256: Some(digest),
        }
    );
    assert_eq!(s.sha256_hex(), hex::encode(digest));
    let skipped = check(
        &tgz,
        &Options {
            skip_digest: true,
            ..Options::default()
        },
    )
    .expect("accepted");
    assert_eq!(
        (skipped.sha256, skipped.sha256_hex()),
        (None, String::new())
    );
}

#[test]
fn a_tar_stream_cut_inside_a_pax_body_is_truncated() {
    // The gzip member is whole; the tar stream inside it ends 10 bytes into a PAX body.
    let mut t = TarBuilder::new();
    t.pax(&[("path", b"named-by-pax")]);
    let err = check(&gzip(&t.buf[..522]), &Options::default()).expect_err("cut");
    assert!(matches!(err.reason(), Reason::Truncated), "{err}");
    assert_eq!(err.entry_index(), Some(0));
}

// ------------------------------------------------------------------ reasons and their classes

#[test]
fn each_reason_has_its_class() {
    assert_eq!(
        Reason::Limit {
            kind: LimitKind::Entries,
            limit: 1
        }
        .class(),
        ErrorClass::LimitExceeded
    );
    assert_eq!(Reason::Truncated.class(), ErrorClass::Integrity);
    assert_eq!(Reason::Duplicate.class(), ErrorClass::PolicyViolation);
    let failing = Failing(b"\x1f\x8b".as_slice());
    let err = check_reader(failing, &Options::default()).expect_err("the input failed");
    assert!(
        matches!(
            err.reason(),
            Reason::Io {
                op: "read input",
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(err.class(), ErrorClass::Io, "{err}");
}

#[test]
fn names_in_errors_are_escaped_and_cut() {
    assert_eq!(
        archive::escape(b"a\\b\"c\nd\x7f\xffe ~"),
        r#"a\\b\"c\x0ad\x7f\xffe ~"#
    );
    let name = vec![b'n'; 256];
    assert_eq!(archive::escape(&name), "n".repeat(256));
    let name = vec![b'n'; 257];
    assert_eq!(
        archive::escape(&name),
        format!("{}...(257 bytes)", "n".repeat(256))
    );
    // What a refusal reports is escaped: a newline cannot start a new log line.
    let mut t = TarBuilder::new();
    t.file("x\ny", b"").file("x\ny", b"");
    let err = check(&t.tgz(), &Options::default()).expect_err("duplicate");
    assert_eq!(err.entry_name(), Some("x\\x0ay"));
    assert_eq!(err.entry_index(), Some(1));
}

// ------------------------------------------------------------------------------ the input side

/// Yields its bytes, then fails.
struct Failing<'a>(&'a [u8]);
impl Read for Failing<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.0.is_empty() {
            return Err(io::Error::from(io::ErrorKind::ConnectionReset));
        }
        let n = self.0.len().min(buf.len());
        buf[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        Ok(n)
    }
}

/// One byte per read, every other read interrupted first (EINTR).
struct Trickle<'a> {
    data: &'a [u8],
    interrupt: bool,
    served: usize,
    delay: Duration,
}
impl<'a> Trickle<'a> {
    fn new(data: &'a [u8]) -> Self {
        Self {
            data,
            interrupt: true,
            served: 0,
            delay: Duration::ZERO,
        }
    }
}
impl Read for Trickle<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.interrupt = !self.interrupt;
        if !self.interrupt {
            return Err(io::Error::from(io::ErrorKind::Interrupted));
        }
        std::thread::sleep(self.delay);
        let Some((&b, rest)) = self.data.split_first() else {
            return Ok(0);
        };
        buf[0] = b;
        self.data = rest;
        self.served += 1;
        Ok(1)
    }
}

fn check_reader(r: impl Read, opts: &Options) -> Result<Summary, ExtractError> {
    archive::extract(r, &mut NullSink, opts)
}

#[test]
fn an_interrupted_trickling_input_is_read_whole() {
    let tgz = files(2, 100).tgz();
    let s = check_reader(Trickle::new(&tgz), &Options::default()).expect("EINTR is retried");
    assert_eq!((s.files, s.compressed_bytes), (2, tgz.len() as u64));
}

/// A gzip member with this header (flags, optional fields), then `tar` deflated.
fn member(flags: u8, fields: &[u8], tar: &[u8]) -> Vec<u8> {
    let mut g = vec![0x1f, 0x8b, 8, flags, 0, 0, 0, 0, 0, 255];
    g.extend_from_slice(fields);
    let mut d = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::default());
    d.write_all(tar).expect("deflate");
    g.extend(d.finish().expect("deflate"));
    g.extend(crc32fast::hash(tar).to_le_bytes());
    g.extend((tar.len() as u32).to_le_bytes());
    g
}

const FHCRC: u8 = 0x02;
const FEXTRA: u8 = 0x04;
const FNAME: u8 = 0x08;
const FCOMMENT: u8 = 0x10;

fn gzip_error(tgz: &[u8], opts: &Options) -> String {
    match check(tgz, opts).expect_err("refused").reason() {
        Reason::Gzip(m) => m.clone(),
        other => panic!("not a gzip framing error: {other:?}"),
    }
}

#[test]
fn optional_gzip_fields_at_their_limit() {
    let tar = files(1, 3).finish();
    let opts = with(|l| l.gzip_header_field_bytes = 10);
    let extra = |n: usize| {
        let mut f = (n as u16).to_le_bytes().to_vec();
        f.extend(std::iter::repeat_n(b'e', n));
        member(FEXTRA, &f, &tar)
    };
    at(&extra(10), &opts);
    over(&extra(11), &opts, LimitKind::GzipHeaderBytes);
    for flag in [FNAME, FCOMMENT] {
        let cstring = |n: usize| {
            let mut f = vec![b'n'; n];
            f.push(0);
            member(flag, &f, &tar)
        };
        at(&cstring(10), &opts);
        over(&cstring(11), &opts, LimitKind::GzipHeaderBytes);
    }
}

#[test]
fn the_gzip_header_crc_is_checked() {
    let tar = files(1, 3).finish();
    let name = b"archive.tar\0";
    let mut head = vec![0x1f, 0x8b, 8, FNAME | FHCRC, 0, 0, 0, 0, 0, 255];
    head.extend_from_slice(name);
    let crc = (crc32fast::hash(&head) & 0xffff) as u16;
    let mut fields = name.to_vec();
    fields.extend(crc.to_le_bytes());
    check(&member(FNAME | FHCRC, &fields, &tar), &Options::default())
        .expect("a header with its CRC");
    let mut wrong = name.to_vec();
    wrong.extend((crc ^ 1).to_le_bytes());
    assert_eq!(
        gzip_error(&member(FNAME | FHCRC, &wrong, &tar), &Options::default()),
        "header crc mismatch"
    );
}

#[test]
fn bad_magic_is_named_on_a_short_or_trickling_input() {
    for input in [&b"\x1f\x00"[..], b"\x00\x8b"] {
        assert_eq!(
            gzip_error(input, &Options::default()),
            "not gzip data (bad magic)",
            "{input:?}"
        );
    }
    // A byte at a time, the first look sees one byte only: the whole fixed header is checked.
    let input = b"\x1f\x00\x08\x00\x00\x00\x00\x00\x00\xff";
    let err = check_reader(Trickle::new(input), &Options::default()).expect_err("refused");
    assert!(
        matches!(err.reason(), Reason::Gzip(m) if m == "not gzip data (bad magic)"),
        "trickled: {err}"
    );
    // A header that ends early is truncated, not corrupt.
    let err = check(b"\x1f\x8b\x08\x00", &Options::default()).expect_err("short");
    assert!(matches!(err.reason(), Reason::Truncated), "{err}");
}

// --------------------------------------------------------------------------------- the clocks

#[test]
fn the_wall_clock_stops_a_header_that_trickles() {
    // A gzip file name sent a byte every millisecond: the header alone would take 5 s; the
    // clock (100 ms) stops it while it is read, long before the reader's end (a liveness bound
    // 50 times the clock, not a timing of the extractor).
    let mut g = vec![0x1f, 0x8b, 8, FNAME, 0, 0, 0, 0, 0, 255];
    g.extend(std::iter::repeat_n(b'n', 5000));
    let mut input = Trickle::new(&g);
    input.delay = Duration::from_millis(1);
    let opts = with(|l| {
        l.wall_clock = Duration::from_millis(100);
        l.gzip_header_field_bytes = usize::MAX;
    });
    let err = archive::extract(&mut input, &mut NullSink, &opts).expect_err("too slow");
    assert_limit(&err, LimitKind::WallClock);
    assert!(input.served < g.len(), "the header was read to its end");
}

/// Takes its time before reading each file's data.
struct Dawdling(Duration);
impl Sink for Dawdling {
    fn dir(&mut self, _: &archive::path::EntryPath, _: usize) -> io::Result<()> {
        Ok(())
    }
    fn file(
        &mut self,
        _: &archive::path::EntryPath,
        _: usize,
        _: u32,
        data: &mut dyn Read,
    ) -> io::Result<u64> {
        std::thread::sleep(self.0);
        io::copy(data, &mut io::sink())
    }
    fn symlink(&mut self, _: &archive::path::EntryPath, _: usize, _: &[u8]) -> io::Result<()> {
        Ok(())
    }
    fn abort(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[test]
fn the_wall_clock_is_checked_on_the_tar_side_too() {
    // The whole input is read at once, before the clock runs out; the file's data is read
    // after it: the decompressed side's check refuses it, at that entry.
    let tgz = files(1, 100).tgz();
    let opts = with(|l| l.wall_clock = Duration::from_millis(20));
    let err = archive::extract(&tgz[..], &mut Dawdling(Duration::from_millis(200)), &opts)
        .expect_err("too slow");
    assert_limit(&err, LimitKind::WallClock);
    assert_eq!(err.entry_index(), Some(0), "{err}");
    let err = check(&tgz, &with(|l| l.wall_clock = Duration::ZERO)).expect_err("no time");
    assert_limit(&err, LimitKind::WallClock);
}

// ---------------------------------------------------------------------------- tar layouts

fn one(h: Hdr) -> Vec<u8> {
    let mut t = TarBuilder::new();
    t.header(&h);
    t.tgz()
}

#[test]
fn v7_and_ustar_layouts_decide_on_their_fields() {
    let mut v7 = Hdr::new("old", b'0');
    v7.magic = Magic::V7;
    check(&one(v7.clone()), &Options::default()).expect("a v7 header");
    // Anything past a v7 header's link name makes its layout ambiguous.
    let err = check(&one(v7.set(300, b"x")), &Options::default()).expect_err("ambiguous");
    assert!(matches!(err.reason(), Reason::BadMagic), "{err}");
    let err = check(
        &one(Hdr::new("f", b'0').set(257, b"ustar\x0001")),
        &Options::default(),
    )
    .expect_err("unknown magic");
    assert!(matches!(err.reason(), Reason::BadMagic), "{err}");
    // A ustar header's device numbers and owner names are read, a v7 header has none.
    let err = check(
        &one(Hdr::new("f", b'0').set(329, b"9")),
        &Options::default(),
    )
    .expect_err("devmajor");
    assert!(
        matches!(err.reason(), Reason::BadNumber("devmajor")),
        "{err}"
    );
    let err = check(
        &one(Hdr::new("f", b'0').set(265, b"u\0x")),
        &Options::default(),
    )
    .expect_err("uname");
    assert!(
        matches!(err.reason(), Reason::GarbageAfterNul("uname")),
        "{err}"
    );
}

#[test]
fn octal_fields_of_spaces_and_nuls_read_zero() {
    use archive::header::number;
    for (field, value) in [
        (&b"        "[..], 0),
        (b"\0 \0 \0 \0", 0),
        (b"  0017 \0", 0o17),
        (b"00000017", 0o17),
    ] {
        assert!(
            matches!(number(field, "f"), Ok(v) if v == value),
            "{field:?}"
        );
    }
    for field in [&b" 17 x\0\0\0"[..], b" 8\0\0\0\0\0\0", b"x       "] {
        assert!(
            matches!(number(field, "f"), Err(Reason::BadNumber("f"))),
            "{field:?}"
        );
    }
}

#[test]
fn pax_lengths_numbers_and_times_at_their_edges() {
    let pax = archive::pax::parse;
    assert!(
        matches!(pax(b"2 "), Err(Reason::PaxMalformed("length out of range"))),
        "a record no longer than its length field"
    );
    // Sizes: 19 digits at most.
    let size = |v: &[u8]| pax(&pax_record("size", v));
    assert_eq!(
        size(b"0000000000000000005").expect("19 digits").size,
        Some(5)
    );
    assert!(matches!(
        size(b"00000000000000000005"),
        Err(Reason::PaxMalformed("non-decimal number"))
    ));
    // uid and gid are numbers too, though never used.
    for key in ["uid", "gid"] {
        assert!(pax(&pax_record(key, b"1000")).is_ok());
        assert!(
            matches!(
                pax(&pax_record(key, b"root")),
                Err(Reason::PaxMalformed("non-decimal number"))
            ),
            "{key}"
        );
    }
    // A time's fraction, when there is a dot, has digits.
    assert!(pax(&pax_record("mtime", b"1.5")).is_ok());
    for bad in [&b"1."[..], b"1.5x", b".5"] {
        assert!(
            matches!(
                pax(&pax_record("mtime", bad)),
                Err(Reason::PaxMalformed("bad time value"))
            ),
            "{bad:?}"
        );
    }
}

#[test]
fn an_explicit_directory_may_follow_its_implied_one() {
    let mut t = TarBuilder::new();
    t.file("a/b", b"x").dir("a");
    let s = check(&t.tgz(), &Options::default()).expect("a/ after a/b");
    assert_eq!((s.files, s.dirs), (1, 1));
    let mut t = TarBuilder::new();
    t.file("a", b"x").dir("a");
    let err = check(&t.tgz(), &Options::default()).expect_err("a file then a directory");
    assert!(matches!(err.reason(), Reason::Duplicate), "{err}");
}
