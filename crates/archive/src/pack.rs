//! Packing a directory as Argo CD's repo-server does (`util/io/files/tar.go` with Go's
//! `archive/tar`): one gzip member, root entry `.` first, `filepath.Walk` (lexical) order, names
//! relative with no `./` or trailing `/`, ustar headers (Go's prefix split) or a PAX header when a
//! name, link target or number does not fit, only files, directories and symlinks. Used by the
//! `client` and `render` commands.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use flate2::Compression;
use flate2::write::GzEncoder;
use sha2::{Digest, Sha256};

/// What was packed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PackSummary {
    /// Entries written (including the root).
    pub entries: u64,
    /// Regular files written.
    pub files: u64,
    /// Compressed bytes.
    pub compressed_bytes: u64,
    /// SHA-256 of the compressed bytes.
    pub sha256: [u8; 32],
}

struct Hashing<W> {
    inner: W,
    hasher: Sha256,
    count: u64,
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.count += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Pack `root` into `out`. `exclude` gets each relative path (Argo matches exclusions with Go
/// `filepath.Match`); an excluded directory is pruned. Fails like Argo CD when no regular file
/// was written.
pub fn pack_dir<W: Write>(
    root: &Path,
    exclude: &dyn Fn(&str) -> bool,
    out: W,
) -> io::Result<PackSummary> {
    pack_tree(Some(root), &[], exclude, out)
}

/// Pack in-memory files (top-level names, mode 0644) after the optional directory `root`:
/// how the ApplicationSet generator hands a request (and its data directory) to the jail.
pub fn pack_tree<W: Write>(
    root: Option<&Path>,
    files: &[(&str, &[u8])],
    exclude: &dyn Fn(&str) -> bool,
    out: W,
) -> io::Result<PackSummary> {
    let hashing = Hashing {
        inner: out,
        hasher: Sha256::new(),
        count: 0,
    };
    let mut gz = GzEncoder::new(hashing, Compression::default());
    let mut s = PackSummary::default();
    match root {
        Some(root) => {
            let md = fs::symlink_metadata(root)?;
            write_entry(&mut gz, ".", &md, b"", None)?;
            s.entries += 1;
            walk(root, root, exclude, &mut gz, &mut s)?;
        }
        None => {
            write_memory_entry(&mut gz, ".", None)?;
            s.entries += 1;
        }
    }
    for (name, data) in files {
        if name.is_empty() || name.contains('/') || name.len() > 100 || !name.is_ascii() {
            return Err(io::Error::other(format!("in-memory entry name {name:?}")));
        }
        write_memory_entry(&mut gz, name, Some(data))?;
        s.entries += 1;
        s.files += 1;
    }
    if s.files == 0 {
        return Err(io::Error::other(format!(
            "no files to send({})",
            root.map_or_else(String::new, |r| r.display().to_string())
        )));
    }
    gz.write_all(&[0u8; 1024])?;
    let hashing = gz.finish()?;
    s.compressed_bytes = hashing.count;
    s.sha256 = hashing.hasher.finalize().into();
    Ok(s)
}

fn walk<W: Write>(
    root: &Path,
    dir: &Path,
    exclude: &dyn Fn(&str) -> bool,
    out: &mut W,
    s: &mut PackSummary,
) -> io::Result<()> {
    let mut names: Vec<_> = fs::read_dir(dir)?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<Result<_, _>>()?;
    names.sort();
    for name in names {
        let path = dir.join(&name);
        let rel = path.strip_prefix(root).map_err(io::Error::other)?;
        let rel = rel
            .to_str()
            .ok_or_else(|| io::Error::other(format!("non-UTF-8 path {}", rel.display())))?;
        if exclude(rel) {
            continue;
        }
        let md = fs::symlink_metadata(&path)?;
        let ft = md.file_type();
        if ft.is_symlink() {
            let target = fs::read_link(&path)?;
            write_entry(out, rel, &md, target.as_os_str().as_encoded_bytes(), None)?;
        } else if ft.is_dir() {
            write_entry(out, rel, &md, b"", None)?;
            s.entries += 1;
            walk(root, &path, exclude, out, s)?;
            continue;
        } else if ft.is_file() {
            write_entry(out, rel, &md, b"", Some(&path))?;
            s.files += 1;
        } else {
            continue; // sockets, FIFOs, devices: skipped, as Argo's supportedFileMode
        }
        s.entries += 1;
    }
    Ok(())
}

fn pax_record(key: &str, value: &[u8]) -> Vec<u8> {
    let body = 1 + key.len() + 1 + value.len() + 1;
    let mut len = body + 1;
    while len.to_string().len() + body != len {
        len = len.to_string().len() + body;
    }
    let mut r = format!("{len} {key}=").into_bytes();
    r.extend_from_slice(value);
    r.push(b'\n');
    r
}

/// Go's `splitUSTARPath`.
fn split_ustar(name: &str) -> Option<(&str, &str)> {
    let b = name.as_bytes();
    let mut length = b.len();
    if length <= 100 || !name.is_ascii() {
        return None;
    }
    if length > 256 {
        length = 256;
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

fn write_entry<W: Write>(
    out: &mut W,
    name: &str,
    md: &fs::Metadata,
    link: &[u8],
    data: Option<&Path>,
) -> io::Result<()> {
    let ft = md.file_type();
    let (typeflag, type_bits) = if ft.is_symlink() {
        (b'2', 0o120000)
    } else if ft.is_dir() {
        (b'5', 0o40000)
    } else {
        (b'0', 0o100000)
    };
    let size = if data.is_some() { md.len() } else { 0 };
    let mut h = tar::Header::new_ustar();
    let mut pax: Vec<(&str, Vec<u8>)> = Vec::new();
    {
        let u = h
            .as_ustar_mut()
            .ok_or_else(|| io::Error::other("ustar header"))?;
        let fits = |s: &[u8], n: usize| s.len() <= n && s.is_ascii();
        if fits(name.as_bytes(), 100) {
            u.name[..name.len()].copy_from_slice(name.as_bytes());
        } else if let Some((prefix, base)) = split_ustar(name) {
            u.prefix[..prefix.len()].copy_from_slice(prefix.as_bytes());
            u.name[..base.len()].copy_from_slice(base.as_bytes());
        } else {
            pax.push(("path", name.as_bytes().to_vec()));
            let ascii: Vec<u8> = name.bytes().filter(u8::is_ascii).take(100).collect();
            u.name[..ascii.len()].copy_from_slice(&ascii);
        }
        if fits(link, 100) {
            u.linkname[..link.len()].copy_from_slice(link);
        } else {
            pax.push(("linkpath", link.to_vec()));
            let ascii: Vec<u8> = link
                .iter()
                .copied()
                .filter(u8::is_ascii)
                .take(100)
                .collect();
            u.linkname[..ascii.len()].copy_from_slice(&ascii);
        }
    }
    let octal_max = |digits: u32| 8u64.pow(digits) - 1;
    let (uid, gid, mtime) = (
        u64::from(md.uid()),
        u64::from(md.gid()),
        md.mtime().max(0) as u64,
    );
    if uid > octal_max(7) {
        pax.push(("uid", uid.to_string().into_bytes()));
    }
    if gid > octal_max(7) {
        pax.push(("gid", gid.to_string().into_bytes()));
    }
    if mtime > octal_max(11) {
        pax.push(("mtime", mtime.to_string().into_bytes()));
    }
    h.set_mode(type_bits | (md.mode() & 0o7777));
    h.set_uid(uid.min(octal_max(7)));
    h.set_gid(gid.min(octal_max(7)));
    h.set_mtime(mtime.min(octal_max(11)));
    h.set_size(size);
    h.set_entry_type(tar::EntryType::new(typeflag));
    if !pax.is_empty() {
        pax.sort();
        let body: Vec<u8> = pax.iter().flat_map(|(k, v)| pax_record(k, v)).collect();
        let mut x = tar::Header::new_ustar();
        let (dir, base) = name.rsplit_once('/').unwrap_or((".", name));
        let xname: Vec<u8> = format!("{dir}/PaxHeaders.0/{base}")
            .bytes()
            .filter(u8::is_ascii)
            .take(100)
            .collect();
        x.as_ustar_mut()
            .ok_or_else(|| io::Error::other("ustar header"))?
            .name[..xname.len()]
            .copy_from_slice(&xname);
        x.set_mode(0o644);
        x.set_size(body.len() as u64);
        x.set_entry_type(tar::EntryType::XHeader);
        x.set_cksum();
        out.write_all(x.as_bytes())?;
        write_padded(out, &body)?;
    }
    h.set_cksum();
    out.write_all(h.as_bytes())?;
    if let Some(p) = data {
        let mut f = fs::File::open(p)?;
        let n = io::copy(&mut io::Read::take(&mut f, size), out)?;
        if n != size {
            return Err(io::Error::other(format!(
                "{} changed while packing",
                p.display()
            )));
        }
        let pad = (512 - (size % 512) as usize) % 512;
        out.write_all(&vec![0u8; pad])?;
    }
    Ok(())
}

/// A ustar entry with no file behind it: the root directory (`data: None`, 0755) or a regular
/// file (0644), owned by 0:0, mtime 0.
fn write_memory_entry<W: Write>(out: &mut W, name: &str, data: Option<&[u8]>) -> io::Result<()> {
    let mut h = tar::Header::new_ustar();
    h.as_ustar_mut()
        .ok_or_else(|| io::Error::other("ustar header"))?
        .name[..name.len()]
        .copy_from_slice(name.as_bytes());
    match data {
        Some(d) => {
            h.set_mode(0o100644);
            h.set_size(d.len() as u64);
            h.set_entry_type(tar::EntryType::Regular);
        }
        None => {
            h.set_mode(0o40755);
            h.set_size(0);
            h.set_entry_type(tar::EntryType::Directory);
        }
    }
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h.set_cksum();
    out.write_all(h.as_bytes())?;
    if let Some(d) = data {
        write_padded(out, d)?;
    }
    Ok(())
}

fn write_padded<W: Write>(out: &mut W, data: &[u8]) -> io::Result<()> {
    out.write_all(data)?;
    let pad = (512 - data.len() % 512) % 512;
    out.write_all(&vec![0u8; pad])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_trees_round_trip_through_the_extractor() {
        let src = tempfile::tempdir().unwrap();
        let long = format!("{}/{}", "d".repeat(120), "f".repeat(200));
        for f in ["a.yaml", "sub/b.yaml", "ü.yaml", ".git/HEAD", long.as_str()] {
            let p = src.path().join(f);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, f).unwrap();
        }
        std::os::unix::fs::symlink("../a.yaml", src.path().join("sub/link")).unwrap();
        let mut buf = Vec::new();
        let s = pack_dir(src.path(), &|rel| rel == ".git", &mut buf).unwrap();
        assert_eq!(s.files, 4);
        let dst = tempfile::tempdir().unwrap();
        let opts = crate::Options {
            expected_sha256: Some(s.sha256),
            ..Default::default()
        };
        let sum = crate::extract_to_dir(&buf[..], dst.path(), &opts).unwrap();
        assert_eq!(sum.files, 4);
        assert!(!dst.path().join(".git").exists());
        assert_eq!(
            fs::read_link(dst.path().join("sub/link")).unwrap(),
            Path::new("../a.yaml")
        );
        assert_eq!(fs::read(dst.path().join(&long)).unwrap(), long.as_bytes());
        let empty = tempfile::tempdir().unwrap();
        assert!(
            pack_dir(empty.path(), &|_| false, Vec::new())
                .unwrap_err()
                .to_string()
                .starts_with("no files to send(")
        );
    }
}
