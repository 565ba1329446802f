//! A raw tar writer with full control over every header byte.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

/// Header magic/version layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Magic {
    /// `ustar\0` `00` (POSIX, Go).
    Ustar,
    /// `ustar ` ` \0` (GNU tar).
    Gnu,
    /// Nothing (v7).
    V7,
    /// Any 8 bytes.
    Raw([u8; 8]),
}

/// One header, described field by field.
#[derive(Debug, Clone)]
pub struct Hdr {
    /// Name field (written verbatim, truncated to 100 bytes).
    pub name: Vec<u8>,
    /// Ustar prefix field.
    pub prefix: Vec<u8>,
    /// Typeflag.
    pub typeflag: u8,
    /// Mode (octal).
    pub mode: u32,
    /// Size (octal).
    pub size: u64,
    /// Link name.
    pub linkname: Vec<u8>,
    /// Layout.
    pub magic: Magic,
    /// uid/gid.
    pub uid: u64,
    /// gid.
    pub gid: u64,
    /// mtime.
    pub mtime: u64,
    /// Raw overrides `(offset, bytes)` applied before the checksum is computed.
    pub overrides: Vec<(usize, Vec<u8>)>,
    /// Write a wrong checksum.
    pub bad_checksum: bool,
}

impl Hdr {
    /// A header of any type.
    pub fn new(name: impl AsRef<[u8]>, typeflag: u8) -> Self {
        Self {
            name: name.as_ref().to_vec(),
            prefix: Vec::new(),
            typeflag,
            mode: if typeflag == b'5' { 0o755 } else { 0o644 },
            size: 0,
            linkname: Vec::new(),
            magic: Magic::Ustar,
            uid: 1000,
            gid: 1000,
            mtime: 1_700_000_000,
            overrides: Vec::new(),
            bad_checksum: false,
        }
    }

    /// Set a raw field override.
    pub fn set(mut self, offset: usize, bytes: &[u8]) -> Self {
        self.overrides.push((offset, bytes.to_vec()));
        self
    }

    /// Render to a 512-byte block.
    pub fn render(&self) -> [u8; 512] {
        let mut b = [0u8; 512];
        put(&mut b[0..100], &self.name);
        octal(&mut b[100..108], u64::from(self.mode));
        octal(&mut b[108..116], self.uid);
        octal(&mut b[116..124], self.gid);
        octal(&mut b[124..136], self.size);
        octal(&mut b[136..148], self.mtime);
        b[156] = self.typeflag;
        put(&mut b[157..257], &self.linkname);
        match self.magic {
            Magic::Ustar => b[257..265].copy_from_slice(b"ustar\x0000"),
            Magic::Gnu => b[257..265].copy_from_slice(b"ustar  \x00"),
            Magic::V7 => {}
            Magic::Raw(m) => b[257..265].copy_from_slice(&m),
        }
        if self.magic != Magic::V7 {
            put(&mut b[265..297], b"user");
            put(&mut b[297..329], b"group");
            octal(&mut b[329..337], 0);
            octal(&mut b[337..345], 0);
            put(&mut b[345..500], &self.prefix);
        }
        for (off, bytes) in &self.overrides {
            b[*off..*off + bytes.len()].copy_from_slice(bytes);
        }
        b[148..156].copy_from_slice(b"        ");
        let sum: u32 = b.iter().map(|&x| u32::from(x)).sum::<u32>() + u32::from(self.bad_checksum);
        let s = format!("{sum:06o}\0 ");
        b[148..156].copy_from_slice(s.as_bytes());
        // An override of the checksum field itself wins over the computed value.
        for (off, bytes) in &self.overrides {
            if *off == 148 {
                b[148..148 + bytes.len()].copy_from_slice(bytes);
            }
        }
        b
    }
}

fn put(field: &mut [u8], v: &[u8]) {
    let n = v.len().min(field.len());
    field[..n].copy_from_slice(&v[..n]);
}

fn octal(field: &mut [u8], v: u64) {
    let w = field.len() - 1;
    let s = format!("{v:0w$o}");
    let s = &s.as_bytes()[s.len().saturating_sub(w)..];
    field[..w].copy_from_slice(s);
    field[w] = 0;
}

/// One PAX record, `"<len> key=value\n"` with the self-referential length.
pub fn pax_record(key: &str, value: &[u8]) -> Vec<u8> {
    let body_len = 1 + key.len() + 1 + value.len() + 1;
    let mut len = body_len + 1;
    while len.to_string().len() + body_len != len {
        len = len.to_string().len() + body_len;
    }
    let mut r = format!("{len} {key}=").into_bytes();
    r.extend_from_slice(value);
    r.push(b'\n');
    r
}

/// Appends headers and data to an in-memory tar stream.
#[derive(Debug, Default, Clone)]
pub struct TarBuilder {
    /// The bytes so far.
    pub buf: Vec<u8>,
}

impl TarBuilder {
    /// Empty stream.
    pub fn new() -> Self {
        Self::default()
    }

    /// Append a header block.
    pub fn header(&mut self, h: &Hdr) -> &mut Self {
        self.buf.extend_from_slice(&h.render());
        self
    }

    /// Append data padded to a block.
    pub fn data(&mut self, d: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(d);
        let pad = (512 - d.len() % 512) % 512;
        self.buf.extend(std::iter::repeat_n(0u8, pad));
        self
    }

    /// Append raw bytes (no padding).
    pub fn raw(&mut self, d: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(d);
        self
    }

    /// A regular file (0644). Names and targets that do not fit the header are written as Go
    /// does (ustar prefix split, else a PAX record).
    pub fn file(&mut self, name: &str, data: &[u8]) -> &mut Self {
        self.file_mode(name, data, 0o644)
    }

    /// A regular file with a mode.
    pub fn file_mode(&mut self, name: &str, data: &[u8], mode: u32) -> &mut Self {
        go_entry(self, name, b'0', mode, b"", data);
        self
    }

    /// A directory.
    pub fn dir(&mut self, name: &str) -> &mut Self {
        go_entry(self, name, b'5', 0o755, b"", b"");
        self
    }

    /// A symlink.
    pub fn symlink(&mut self, name: &str, target: &str) -> &mut Self {
        go_entry(self, name, b'2', 0o777, target.as_bytes(), b"");
        self
    }

    /// A hard link.
    pub fn hardlink(&mut self, name: &str, target: &str) -> &mut Self {
        let mut h = Hdr::new(name, b'1');
        h.linkname = target.as_bytes().to_vec();
        self.header(&h)
    }

    /// A PAX `x` header with these records.
    pub fn pax(&mut self, records: &[(&str, &[u8])]) -> &mut Self {
        let body: Vec<u8> = records.iter().flat_map(|(k, v)| pax_record(k, v)).collect();
        self.pax_raw(&body)
    }

    /// A PAX `x` header with a raw body.
    pub fn pax_raw(&mut self, body: &[u8]) -> &mut Self {
        let mut h = Hdr::new("PaxHeaders.0/x", b'x');
        h.size = body.len() as u64;
        self.header(&h).data(body)
    }

    /// A GNU long-name `L` header.
    pub fn gnu_long_name(&mut self, name: &[u8]) -> &mut Self {
        let mut h = Hdr::new("././@LongLink", b'L');
        h.magic = Magic::Gnu;
        let mut body = name.to_vec();
        body.push(0);
        h.size = body.len() as u64;
        self.header(&h).data(&body)
    }

    /// The stream with the two-block end marker.
    pub fn finish(&self) -> Vec<u8> {
        let mut v = self.buf.clone();
        v.extend_from_slice(&[0u8; 1024]);
        v
    }

    /// The gzip'd stream with the end marker.
    pub fn tgz(&self) -> Vec<u8> {
        gzip(&self.finish())
    }
}

/// One gzip member with default compression.
pub fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(data).expect("write to Vec");
    e.finish().expect("finish gzip")
}

/// Pack `dir` as Argo CD's `files.Tgz` does, with no exclusions.
pub fn argo_tgz(dir: &Path) -> Vec<u8> {
    argo_tgz_with(dir, &[])
}

/// Pack `dir` as Argo CD's `files.Tgz` does: `filepath.Walk` order (lexical), root `.` first,
/// names relative without `./` or trailing `/`, Go's `FileInfoHeader` modes (type bits
/// included), USTAR when the name fits (with Go's prefix split), else a PAX header. Paths whose
/// relative name is in `exclude` are skipped (with their subtrees).
pub fn argo_tgz_with(dir: &Path, exclude: &[&str]) -> Vec<u8> {
    let mut t = TarBuilder::new();
    let mut h = Hdr::new(".", b'5');
    h.mode = 0o40755;
    t.header(&h);
    walk(dir, dir, exclude, &mut t);
    t.tgz()
}

fn walk(root: &Path, dir: &Path, exclude: &[&str], t: &mut TarBuilder) {
    let mut names: Vec<_> = fs::read_dir(dir)
        .expect("read_dir")
        .map(|e| e.expect("entry").path())
        .collect();
    names.sort();
    for p in names {
        let rel = p
            .strip_prefix(root)
            .expect("under root")
            .to_str()
            .expect("utf-8 test names")
            .to_owned();
        if exclude.contains(&rel.as_str()) {
            continue;
        }
        let md = fs::symlink_metadata(&p).expect("lstat");
        let perm = md.permissions().mode() & 0o777;
        let ft = md.file_type();
        if ft.is_symlink() {
            let target = fs::read_link(&p).expect("readlink");
            go_entry(
                t,
                &rel,
                b'2',
                0o120000 | perm,
                target.to_str().expect("utf-8").as_bytes(),
                &[],
            );
        } else if ft.is_dir() {
            go_entry(t, &rel, b'5', 0o40000 | perm, b"", &[]);
            walk(root, &p, exclude, t);
        } else {
            let data = fs::read(&p).expect("read");
            assert_eq!(data.len() as u64, md.size());
            go_entry(t, &rel, b'0', 0o100000 | perm, b"", &data);
        }
    }
}

/// Go's `splitUSTARPath`.
fn split_ustar(name: &str) -> Option<(&str, &str)> {
    let b = name.as_bytes();
    let mut length = b.len();
    if length <= 100 || !name.is_ascii() {
        return None;
    }
    if length > 100 + 155 + 1 {
        length = 100 + 155 + 1;
    } else if b[length - 1] == b'/' {
        length -= 1;
    }
    let i = name[..length].rfind('/')?;
    let (nlen, plen) = (b.len() - i - 1, i);
    if i == 0 || nlen > 100 || nlen == 0 || plen > 155 {
        return None;
    }
    Some((&name[..i], &name[i + 1..]))
}

fn go_entry(t: &mut TarBuilder, name: &str, typeflag: u8, mode: u32, link: &[u8], data: &[u8]) {
    let mut h = Hdr::new(name, typeflag);
    h.mode = mode;
    h.size = data.len() as u64;
    h.linkname = link.to_vec();
    let fits = |s: &[u8], n: usize| s.len() <= n && s.is_ascii();
    let mut pax: Vec<(&str, &[u8])> = Vec::new();
    if !fits(name.as_bytes(), 100) {
        match split_ustar(name) {
            Some((prefix, base)) => {
                h.prefix = prefix.as_bytes().to_vec();
                h.name = base.as_bytes().to_vec();
            }
            None => {
                pax.push(("path", name.as_bytes()));
                h.name = name.bytes().filter(u8::is_ascii).take(100).collect();
            }
        }
    }
    if !fits(link, 100) {
        pax.push(("linkpath", link));
        h.linkname = link
            .iter()
            .copied()
            .filter(u8::is_ascii)
            .take(100)
            .collect();
    }
    if !pax.is_empty() {
        pax.sort();
        let body: Vec<u8> = pax.iter().flat_map(|(k, v)| pax_record(k, v)).collect();
        let (dir, base) = name.rsplit_once('/').unwrap_or((".", name));
        let mut x = Hdr::new(
            format!("{dir}/PaxHeaders.0/{base}")
                .bytes()
                .filter(u8::is_ascii)
                .take(100)
                .collect::<Vec<u8>>(),
            b'x',
        );
        x.size = body.len() as u64;
        t.header(&x).data(&body);
    }
    t.header(&h).data(data);
}
