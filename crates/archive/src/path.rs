//! Name normalisation and the syntactic symlink rule (docs/design.md, archive pipeline: names and symlinks).

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

/// NUL ends a C string: never part of a name. `\` and the other control bytes are ordinary
/// bytes on Linux (Argo CD accepts them; the writer is fd-relative and errors escape them),
/// refused only in the strict mode.
fn check_bytes(raw: &[u8], strict: bool) -> Result<(), Reason> {
    for &b in raw {
        if b == 0 || (strict && (b < 0x20 || b == 0x7f)) {
            return Err(Reason::ControlByte(b));
        }
        if strict && b == b'\\' {
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
    check_bytes(raw, limits.strict_names)?;
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
///
/// Returns the target to write. Every target is read as Argo CD reads it — beneath the link's
/// own directory (`Join(Dir(link), target)`, lexically cleaned, so an absolute target lands
/// inside the tree) — and written relative to that directory, as Argo CD writes it
/// (`a/../b` → `b`, `/dev/null` from `conf/null` → `dev/null`, beneath `conf`); one that climbs above the
/// tree is refused, as Argo CD refuses it. The written target is clean (a leading run of `..`,
/// then names), so the rule holds for what the kernel will resolve, whatever the entry said.
/// `archive.strictNames` instead refuses absolute targets and inner `..`, writing targets as
/// given.
pub fn check_symlink(link: &EntryPath, target: &[u8], limits: &Limits) -> Result<Vec<u8>, Reason> {
    if target.is_empty() {
        return Err(Reason::EmptyName);
    }
    if target.len() > limits.link_target_bytes {
        return Err(Reason::limit(
            LimitKind::LinkTargetBytes,
            limits.link_target_bytes as u64,
        ));
    }
    check_bytes(target, limits.strict_names)?;
    let target = if !limits.strict_names {
        rebase(link, target)?
    } else if target[0] == b'/' {
        return Err(Reason::SymlinkAbsolute);
    } else {
        target.to_vec()
    };
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
    Ok(target)
}

/// `Rel(Dir(link), Clean(Join(Dir(link), target)))` (Go's `filepath.Join` reads an absolute
/// `target` beneath the directory too), computed on components from the tree's root; climbing
/// above the root is an escape.
fn rebase(link: &EntryPath, target: &[u8]) -> Result<Vec<u8>, Reason> {
    let (dir, _) = link.split_last();
    let dir: Vec<&[u8]> = if dir.is_empty() {
        Vec::new()
    } else {
        dir.split(|&b| b == b'/').collect()
    };
    let mut resolved: Vec<&[u8]> = dir.clone();
    for comp in target.split(|&b| b == b'/') {
        match comp {
            b"" | b"." => {}
            b".." => {
                if resolved.pop().is_none() {
                    return Err(Reason::SymlinkEscapes);
                }
            }
            c => resolved.push(c),
        }
    }
    let common = dir
        .iter()
        .zip(&resolved)
        .take_while(|(a, b)| a == b)
        .count();
    let mut parts: Vec<&[u8]> = vec![b".."; dir.len() - common];
    parts.extend_from_slice(&resolved[common..]);
    if parts.is_empty() {
        return Ok(b".".to_vec());
    }
    Ok(parts.join(&b'/'))
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
        // Ordinary bytes on Linux, as Argo CD accepts them; refused in the strict mode.
        assert_eq!(n("a\nb").unwrap().unwrap().as_bytes(), b"a\nb");
        assert_eq!(n("..\\x").unwrap().unwrap().as_bytes(), b"..\\x");
        let strict = Limits {
            strict_names: true,
            ..Limits::default()
        };
        assert!(matches!(
            normalize(b"a\nb", false, &strict),
            Err(Reason::ControlByte(b'\n'))
        ));
        assert!(matches!(
            normalize(b"..\\x", false, &strict),
            Err(Reason::Backslash)
        ));
        assert!(matches!(n("."), Err(Reason::RootNotDirectory)));
        assert!(normalize(b".", true, &Limits::default()).unwrap().is_none());
    }

    /// Each bound admits a name exactly at it and refuses one past it; the strict mode's
    /// control bytes end below the space and include DEL.
    #[test]
    fn bounds_are_inclusive_and_strict_bytes_exact() {
        let l = Limits {
            path_bytes: 7,
            component_bytes: 3,
            path_depth: 2,
            ..Limits::default()
        };
        assert!(normalize(b"abc/def", false, &l).is_ok());
        assert!(matches!(
            normalize(b"abc/defg", false, &l),
            Err(Reason::Limit {
                kind: LimitKind::PathBytes,
                ..
            })
        ));
        assert!(normalize(b"abc", false, &l).is_ok());
        assert!(matches!(
            normalize(b"abcd", false, &l),
            Err(Reason::Limit {
                kind: LimitKind::ComponentBytes,
                ..
            })
        ));
        assert!(normalize(b"a/b", false, &l).is_ok());
        assert!(matches!(
            normalize(b"a/b/c", false, &l),
            Err(Reason::Limit {
                kind: LimitKind::PathDepth,
                ..
            })
        ));
        let short = Limits {
            link_target_bytes: 3,
            ..Limits::default()
        };
        let link = normalize(b"l", false, &short).unwrap().unwrap();
        assert!(check_symlink(&link, b"abc", &short).is_ok());
        assert!(matches!(
            check_symlink(&link, b"abcd", &short),
            Err(Reason::Limit {
                kind: LimitKind::LinkTargetBytes,
                ..
            })
        ));
        let strict = Limits {
            strict_names: true,
            ..Limits::default()
        };
        assert!(normalize(b"a b", false, &strict).is_ok());
        assert!(matches!(
            normalize(b"a\x1fb", false, &strict),
            Err(Reason::ControlByte(0x1f))
        ));
        assert!(matches!(
            normalize(b"a\x7fb", false, &strict),
            Err(Reason::ControlByte(0x7f))
        ));
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
        // Stays inside once cleaned (`a/b/../../x` is `x`): written as Argo CD writes it.
        assert_eq!(
            check_symlink(&at("a/link"), b"b/../../x", &l).unwrap(),
            b"../x"
        );
        assert!(check_symlink(&at("a/link"), b"b/../../../x", &l).is_err());
        assert!(check_symlink(&at("a/link"), b"", &l).is_err());
        let w = |p: &str, t: &str| check_symlink(&at(p), t.as_bytes(), &l);
        // Relative targets are written cleaned, as Argo CD writes them.
        assert_eq!(w("a/link", "../README.md").unwrap(), b"../README.md");
        assert_eq!(w("link", "a/../b").unwrap(), b"b");
        assert_eq!(w("link", "./x").unwrap(), b"x");
        assert_eq!(w("link", "b/").unwrap(), b"b");
        assert_eq!(w("a/link", "../a/x").unwrap(), b"x");
        assert_eq!(w("a/b/l", "x/../../y").unwrap(), b"../y");
        // Lexically inside but through a name: `cur/..` is the root, written as such (what the
        // kernel resolves is the clean form, never the name it went through).
        assert_eq!(w("par", "cur/..").unwrap(), b".");
        assert_eq!(w("a/l", "../b/..").unwrap(), b"..");
        assert!(matches!(
            w("link", "a/../../x"),
            Err(Reason::SymlinkEscapes)
        ));
        // Absolute targets, as Argo CD reads and writes them.
        assert_eq!(w("a/link", "/etc/passwd").unwrap(), b"etc/passwd");
        assert_eq!(w("a/b/null", "/dev/null").unwrap(), b"dev/null");
        assert_eq!(w("a/b/up", "/../x").unwrap(), b"../x");
        assert_eq!(w("a/b/up", "/../../x").unwrap(), b"../../x");
        assert_eq!(w("a/self", "/").unwrap(), b".");
        assert!(matches!(
            w("a/b/up", "/../../../x"),
            Err(Reason::SymlinkEscapes)
        ));
        assert!(matches!(w("top", "/../x"), Err(Reason::SymlinkEscapes)));
        let strict = Limits {
            strict_names: true,
            ..Limits::default()
        };
        assert!(matches!(
            check_symlink(&at("a/link"), b"/etc/passwd", &strict),
            Err(Reason::SymlinkAbsolute)
        ));
        assert!(matches!(
            check_symlink(&at("link"), b"a/../b", &strict),
            Err(Reason::SymlinkInnerDotDot)
        ));
        assert_eq!(check_symlink(&at("link"), b"./x", &strict).unwrap(), b"./x");
        // The strict mode's own escape rule: no more `..` than the link has directories
        // above it (names longer than a byte, so a miscounted depth shows).
        assert!(matches!(
            check_symlink(&at("dir/sub/link"), b"../../../x", &strict),
            Err(Reason::SymlinkEscapes)
        ));
        assert_eq!(
            check_symlink(&at("dir/sub/link"), b"../../x", &strict).unwrap(),
            b"../../x"
        );
        // `.` and empty components are neither names nor climbs.
        assert_eq!(
            check_symlink(&at("dir/link"), b"./../x", &strict).unwrap(),
            b"./../x"
        );
        assert!(matches!(
            check_symlink(&at("dir/link"), b".//../../x", &strict),
            Err(Reason::SymlinkEscapes)
        ));
    }
}
