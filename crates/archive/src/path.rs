//! Name normalisation and the syntactic symlink rule (ARCHITECTURE.md, archive pipeline: names and symlinks).

use crate::error::{LimitKind, Reason};
use crate::limits::Limits;

/// A checked, normalised relative path: non-empty components, no `.`/`..`, no leading `./`,
/// no trailing `/`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EntryPath(Vec<u8>);

impl EntryPath {
    /// The path bytes (`a/b/c`).
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// Its components.
    pub fn components(&self) -> impl DoubleEndedIterator<Item = &[u8]> {
        self.0.split(|&b| b == b'/')
    }

    /// Number of components.
    pub fn depth(&self) -> usize {
        self.components().count()
    }

    /// Parent path (empty for a top-level entry) and final component.
    pub fn split_last(&self) -> (&[u8], &[u8]) {
        match self.0.iter().rposition(|&b| b == b'/') {
            Some(i) => (&self.0[..i], &self.0[i + 1..]),
            None => (&[], &self.0),
        }
    }
}

fn check_bytes(raw: &[u8]) -> Result<(), Reason> {
    for &b in raw {
        if b < 0x20 || b == 0x7f {
            return Err(Reason::ControlByte(b));
        }
        if b == b'\\' {
            return Err(Reason::Backslash);
        }
    }
    Ok(())
}

/// Normalise an entry name. `Ok(None)` is the root entry (`.` or `./`).
pub fn normalize(raw: &[u8], is_dir: bool, limits: &Limits) -> Result<Option<EntryPath>, Reason> {
    if raw.is_empty() {
        return Err(Reason::EmptyName);
    }
    check_bytes(raw)?;
    if raw[0] == b'/' {
        return Err(Reason::AbsolutePath);
    }
    if raw == b"." || raw == b"./" {
        return if is_dir {
            Ok(None)
        } else {
            Err(Reason::RootNotDirectory)
        };
    }
    let mut name = raw.strip_prefix(b"./").unwrap_or(raw);
    if let Some(stripped) = name.strip_suffix(b"/") {
        if !is_dir {
            return Err(Reason::EmptyComponent);
        }
        name = stripped;
    }
    if name.len() > limits.path_bytes {
        return Err(Reason::limit(
            LimitKind::PathBytes,
            limits.path_bytes as u64,
        ));
    }
    let mut depth = 0usize;
    for comp in name.split(|&b| b == b'/') {
        match comp {
            b"" => return Err(Reason::EmptyComponent),
            b"." => return Err(Reason::DotComponent),
            b".." => return Err(Reason::DotDot),
            c if c.len() > limits.component_bytes => {
                return Err(Reason::limit(
                    LimitKind::ComponentBytes,
                    limits.component_bytes as u64,
                ));
            }
            _ => depth += 1,
        }
    }
    if depth > limits.path_depth {
        return Err(Reason::limit(
            LimitKind::PathDepth,
            limits.path_depth as u64,
        ));
    }
    Ok(Some(EntryPath(name.to_vec())))
}

/// The symlink rule: a relative, non-empty target whose `..` components form only a leading
/// run no longer than the number of directories above the link. Sound because links are never
/// followed during extraction and nothing is ever created beneath a link.
pub fn check_symlink(link: &EntryPath, target: &[u8], limits: &Limits) -> Result<(), Reason> {
    if target.is_empty() {
        return Err(Reason::EmptyName);
    }
    if target.len() > limits.link_target_bytes {
        return Err(Reason::limit(
            LimitKind::LinkTargetBytes,
            limits.link_target_bytes as u64,
        ));
    }
    check_bytes(target)?;
    if target[0] == b'/' {
        return Err(Reason::SymlinkAbsolute);
    }
    let dirs_above = link.depth() - 1;
    let mut ups = 0usize;
    let mut seen_name = false;
    for comp in target.split(|&b| b == b'/') {
        match comp {
            b"" | b"." => {}
            b".." if seen_name => return Err(Reason::SymlinkInnerDotDot),
            b".." => ups += 1,
            _ => seen_name = true,
        }
    }
    if ups > dirs_above {
        return Err(Reason::SymlinkEscapes);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(s: &str) -> Result<Option<EntryPath>, Reason> {
        normalize(s.as_bytes(), false, &Limits::default())
    }

    #[test]
    fn names() {
        assert_eq!(n("a/b").unwrap().unwrap().as_bytes(), b"a/b");
        assert_eq!(n("./a").unwrap().unwrap().as_bytes(), b"a");
        assert!(
            normalize(b"d/", true, &Limits::default())
                .unwrap()
                .is_some()
        );
        assert!(matches!(n("d/"), Err(Reason::EmptyComponent)));
        assert!(matches!(n("/etc/x"), Err(Reason::AbsolutePath)));
        assert!(matches!(n("a/../b"), Err(Reason::DotDot)));
        assert!(matches!(n("a/./b"), Err(Reason::DotComponent)));
        assert!(matches!(n("a//b"), Err(Reason::EmptyComponent)));
        assert!(matches!(n("././a"), Err(Reason::DotComponent)));
        assert!(matches!(n("a\nb"), Err(Reason::ControlByte(b'\n'))));
        assert!(matches!(n("..\\x"), Err(Reason::Backslash)));
        assert!(matches!(n("."), Err(Reason::RootNotDirectory)));
        assert!(normalize(b".", true, &Limits::default()).unwrap().is_none());
    }

    #[test]
    fn symlinks() {
        let l = Limits::default();
        let at = |p: &str| normalize(p.as_bytes(), false, &l).unwrap().unwrap();
        assert!(check_symlink(&at("a/link"), b"../README.md", &l).is_ok());
        assert!(check_symlink(&at("a/b/link"), b"../../base/values.yaml", &l).is_ok());
        assert!(check_symlink(&at("link"), b"./x", &l).is_ok());
        assert!(check_symlink(&at("a/link"), b"..", &l).is_ok());
        assert!(check_symlink(&at("link"), b"..", &l).is_err());
        assert!(check_symlink(&at("a/link"), b"../../x", &l).is_err());
        assert!(check_symlink(&at("a/link"), b"b/../../x", &l).is_err());
        assert!(check_symlink(&at("a/link"), b"/etc/passwd", &l).is_err());
        assert!(check_symlink(&at("a/link"), b"", &l).is_err());
    }
}
