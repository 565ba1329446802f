//! Discovery globbing with Argo CD's two libraries' semantics.
//!
//! - [`go_glob`]: Go `path/filepath.Glob` (`*` and `?` never cross `/`, `[^...]` classes, `\`
//!   escapes, `*` matches leading dots, no `**`; malformed patterns are errors).
//! - [`zglob`]: go-zglob v0.0.6 (`**/` = any directories, `*`, `[...]`, `{a,b}`; `?` literal;
//!   a pattern without `*` or `{` is a plain existence check that errors when missing; matching
//!   directories are returned too; symlinks are not followed).
//!
//! Patterns are joined to the app directory and cleaned as Go's `filepath.Join` does. One
//! deliberate difference: a pattern whose cleaned form leaves the request tree matches nothing
//! (Argo CD would look outside), and zglob's `$VAR` expansion from the server environment is not
//! done.

use std::path::{Path, PathBuf};

/// `filepath.ErrBadPattern`.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("syntax error in pattern")]
pub struct BadPattern;

/// Go `filepath.Match`.
pub fn go_match(pattern: &str, name: &str) -> Result<bool, BadPattern> {
    let mut pattern = pattern;
    let mut name = name;
    'outer: while !pattern.is_empty() {
        let (star, chunk, rest) = scan_chunk(pattern);
        pattern = rest;
        if star && chunk.is_empty() {
            return Ok(!name.contains('/'));
        }
        let (t, ok, err) = match_chunk(chunk, name);
        if ok && (t.is_empty() || !pattern.is_empty()) {
            name = t;
            continue;
        }
        if let Some(e) = err {
            return Err(e);
        }
        if star {
            let bytes = name.as_bytes();
            let mut i = 0;
            while i < bytes.len() && bytes[i] != b'/' {
                let (t, ok, err) = match_chunk(chunk, &name[i + 1..]);
                if ok {
                    if pattern.is_empty() && !t.is_empty() {
                        i += 1;
                        continue;
                    }
                    name = t;
                    continue 'outer;
                }
                if let Some(e) = err {
                    return Err(e);
                }
                i += 1;
            }
        }
        while !pattern.is_empty() {
            let (_, chunk, rest) = scan_chunk(pattern);
            pattern = rest;
            if let (_, _, Some(e)) = match_chunk(chunk, "") {
                return Err(e);
            }
        }
        return Ok(false);
    }
    Ok(name.is_empty())
}

fn scan_chunk(mut pattern: &str) -> (bool, &str, &str) {
    let mut star = false;
    while let Some(rest) = pattern.strip_prefix('*') {
        pattern = rest;
        star = true;
    }
    let b = pattern.as_bytes();
    let mut inrange = false;
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'\\' if i + 1 < b.len() => i += 1,
            b'[' => inrange = true,
            b']' => inrange = false,
            b'*' if !inrange => break,
            _ => {}
        }
        i += 1;
    }
    (star, &pattern[..i], &pattern[i..])
}

/// Returns (rest of s, matched, error) like Go's `matchChunk`, validating the whole chunk.
fn match_chunk<'a>(mut chunk: &str, mut s: &'a str) -> (&'a str, bool, Option<BadPattern>) {
    let mut failed = false;
    while !chunk.is_empty() {
        if !failed && s.is_empty() {
            failed = true;
        }
        let c0 = chunk.as_bytes()[0];
        match c0 {
            b'[' => {
                let mut r = '\0';
                if !failed {
                    let ch = s.chars().next().unwrap_or('\0');
                    r = ch;
                    s = &s[ch.len_utf8()..];
                }
                chunk = &chunk[1..];
                let mut negated = false;
                if let Some(rest) = chunk.strip_prefix('^') {
                    negated = true;
                    chunk = rest;
                }
                let mut matched = false;
                let mut nrange = 0;
                loop {
                    if nrange > 0 && chunk.starts_with(']') {
                        chunk = &chunk[1..];
                        break;
                    }
                    let (lo, rest) = match get_esc(chunk) {
                        Ok(v) => v,
                        Err(e) => return ("", false, Some(e)),
                    };
                    chunk = rest;
                    let mut hi = lo;
                    if let Some(rest) = chunk.strip_prefix('-') {
                        match get_esc(rest) {
                            Ok((h, rest)) => {
                                hi = h;
                                chunk = rest;
                            }
                            Err(e) => return ("", false, Some(e)),
                        }
                    }
                    if lo <= r && r <= hi {
                        matched = true;
                    }
                    nrange += 1;
                }
                if matched == negated {
                    failed = true;
                }
            }
            b'?' => {
                if !failed {
                    let ch = s.chars().next().unwrap_or('\0');
                    if ch == '/' {
                        failed = true;
                    }
                    s = &s[ch.len_utf8()..];
                }
                chunk = &chunk[1..];
            }
            _ => {
                if c0 == b'\\' {
                    chunk = &chunk[1..];
                    if chunk.is_empty() {
                        return ("", false, Some(BadPattern));
                    }
                }
                let c = chunk.chars().next().unwrap_or('\0');
                if !failed {
                    let sc = s.chars().next().unwrap_or('\0');
                    if sc != c {
                        failed = true;
                    }
                    s = &s[sc.len_utf8().min(s.len())..];
                }
                chunk = &chunk[c.len_utf8()..];
            }
        }
    }
    if failed {
        ("", false, None)
    } else {
        (s, true, None)
    }
}

fn get_esc(chunk: &str) -> Result<(char, &str), BadPattern> {
    let mut chunk = chunk;
    if chunk.is_empty() || chunk.starts_with('-') || chunk.starts_with(']') {
        return Err(BadPattern);
    }
    if let Some(rest) = chunk.strip_prefix('\\') {
        chunk = rest;
        if chunk.is_empty() {
            return Err(BadPattern);
        }
    }
    let r = chunk.chars().next().ok_or(BadPattern)?;
    let rest = &chunk[r.len_utf8()..];
    if rest.is_empty() {
        return Err(BadPattern);
    }
    Ok((r, rest))
}

fn has_meta(p: &str) -> bool {
    p.contains(['*', '?', '[', '\\'])
}

/// Go `filepath.Clean` for absolute paths.
pub fn clean(p: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for c in p.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            c => parts.push(c),
        }
    }
    let s = format!("/{}", parts.join("/"));
    if !p.starts_with('/') {
        s[1..].to_owned()
    } else {
        s
    }
}

/// `filepath.Join(dir, pattern)` when it stays beneath `root`, else `None`.
fn join_beneath(root: &Path, dir: &Path, pattern: &str) -> Option<String> {
    let joined = clean(&format!("{}/{}", dir.display(), pattern));
    let root = clean(&root.display().to_string());
    (joined == root || joined.starts_with(&format!("{root}/"))).then_some(joined)
}

/// Go `filepath.Glob(Join(app_dir, pattern))`, restricted to `root`; returns the matches.
pub fn go_glob(root: &Path, app_dir: &Path, pattern: &str) -> Result<Vec<PathBuf>, BadPattern> {
    go_match(pattern, "")?;
    let Some(full) = join_beneath(root, app_dir, pattern) else {
        return Ok(Vec::new());
    };
    glob_abs(&full)
}

fn glob_abs(pattern: &str) -> Result<Vec<PathBuf>, BadPattern> {
    if !has_meta(pattern) {
        return Ok(if std::fs::symlink_metadata(pattern).is_ok() {
            vec![PathBuf::from(pattern)]
        } else {
            Vec::new()
        });
    }
    let (dir, file) = match pattern.rfind('/') {
        Some(i) => (&pattern[..=i], &pattern[i + 1..]),
        None => ("", pattern),
    };
    let dir = match dir {
        "" => ".".to_owned(),
        "/" => "/".to_owned(),
        d => d[..d.len() - 1].to_owned(),
    };
    let mut out = Vec::new();
    if !has_meta(&dir) {
        glob_dir(&dir, file, &mut out)?;
        return Ok(out);
    }
    if dir == pattern {
        return Err(BadPattern);
    }
    for d in glob_abs(&dir)? {
        glob_dir(&d.display().to_string(), file, &mut out)?;
    }
    Ok(out)
}

fn glob_dir(dir: &str, pattern: &str, out: &mut Vec<PathBuf>) -> Result<(), BadPattern> {
    let Ok(md) = std::fs::metadata(dir) else {
        return Ok(());
    };
    if !md.is_dir() {
        return Ok(());
    }
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    let mut names: Vec<String> = rd
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    for n in names {
        if go_match(pattern, &n)? {
            out.push(Path::new(dir).join(n));
        }
    }
    Ok(())
}

/// Why a zglob failed (Argo reports it as `error finding glob match for pattern`).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ZglobError {
    /// A plain pattern that does not exist.
    #[error("file does not exist")]
    NotExist,
    /// The pattern does not compile.
    #[error("error parsing regexp: {0}")]
    Bad(String),
}

/// go-zglob v0.0.6 `Glob(Join(app_dir, pattern))`, restricted to `root`.
pub fn zglob(root: &Path, app_dir: &Path, pattern: &str) -> Result<Vec<PathBuf>, ZglobError> {
    let Some(full) = join_beneath(root, app_dir, pattern) else {
        return Ok(Vec::new());
    };
    // The static root: components before the first one holding `*` or `{`.
    let comps: Vec<&str> = full.split('/').collect();
    let Some(first_wild) = comps
        .iter()
        .position(|c| c.contains('*') || c.contains('{'))
    else {
        return if std::fs::metadata(&full).is_ok() {
            Ok(vec![PathBuf::from(full)])
        } else {
            Err(ZglobError::NotExist)
        };
    };
    let walk_root = match comps[..first_wild].join("/") {
        s if s.is_empty() => "/".to_owned(),
        s => s,
    };
    let re = regex::Regex::new(&format!("^{}$", zglob_regex(&full)))
        .map_err(|e| ZglobError::Bad(e.to_string()))?;
    let mut out = Vec::new();
    let md = std::fs::symlink_metadata(&walk_root).map_err(|_| ZglobError::NotExist)?;
    if md.is_dir() {
        walk(Path::new(&walk_root), &re, &mut out);
    }
    out.sort();
    Ok(out)
}

fn walk(dir: &Path, re: &regex::Regex, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.filter_map(|e| e.ok()) {
        let p = e.path();
        let s = p.to_string_lossy();
        if re.is_match(&s) {
            out.push(p.clone());
        }
        if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            walk(&p, re, out);
        }
    }
}

/// zglob's pattern → regexp translation.
fn zglob_regex(pattern: &str) -> String {
    let cc: Vec<char> = pattern.chars().collect();
    let mut re = String::new();
    let mut i = 0;
    let mut in_brace = false;
    while i < cc.len() {
        let c = cc[i];
        if c == '*' && cc.get(i + 1) == Some(&'*') && cc.get(i + 2) == Some(&'/') {
            re.push_str("(.*/)?");
            i += 3;
            continue;
        }
        match c {
            '*' => re.push_str("[^/]*"),
            '{' => {
                in_brace = true;
                re.push('(');
            }
            '}' if in_brace => {
                in_brace = false;
                re.push(')');
            }
            ',' if in_brace => re.push('|'),
            '[' => {
                // Copy a character class through to its closing bracket.
                let mut j = i + 1;
                let mut class = String::from("[");
                while j < cc.len() && cc[j] != ']' {
                    if cc[j] == '\\' {
                        class.push('\\');
                    }
                    class.push(cc[j]);
                    j += 1;
                }
                if j < cc.len() {
                    class.push(']');
                    re.push_str(&class);
                    i = j + 1;
                    continue;
                }
                re.push_str("\\[");
            }
            c => re.push_str(&regex::escape(&c.to_string())),
        }
        i += 1;
    }
    re
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_match_cases() {
        for (p, n, want) in [
            ("abc", "abc", true),
            ("*", "abc", true),
            ("*c", "abc", true),
            ("a*", "a", true),
            ("a*/b", "abc/b", true),
            ("a*/b", "a/c/b", false),
            ("a*b*c*d*e*/f", "axbxcxdxe/f", true),
            ("a*b?c*x", "abxbbxdbxebxczzx", true),
            ("ab[c]", "abc", true),
            ("ab[b-d]", "abc", true),
            ("ab[^c]", "abc", false),
            ("a\\*b", "a*b", true),
            ("a?b", "a/b", false),
            ("*", ".hidden", true),
            ("*.yaml", "kustomization.yaml", true),
            // The last chunk after a star matches early and not to the end: the next start.
            ("*c", "acbc", true),
            ("a*c", "abcbc", true),
            // A star inside a class is a literal; one after a class starts the next chunk.
            ("a[*]b", "a*b", true),
            ("a[*]b", "axb", false),
            ("[a]*b", "axxb", true),
            // Both ends of a range bound it.
            ("ab[b-d]", "abe", false),
            ("ab[b-d]", "aba", false),
        ] {
            assert_eq!(go_match(p, n), Ok(want), "{p} {n}");
        }
        for p in ["[", "[]", "[^]", "a[", "a\\", "[x-]", "*x[", "[-a]", "[]a]"] {
            assert_eq!(go_match(p, "x"), Err(BadPattern), "{p}");
        }
    }

    #[test]
    fn globs_on_a_tree() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
        for f in [
            "app/kustomization.yaml",
            "app/sub/plugin.yaml",
            "app/sub/deeper/plugin.yaml",
            "app/a.json",
        ] {
            let p = root.join(f);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, "").unwrap();
        }
        let app = root.join("app");
        assert_eq!(go_glob(root, &app, "kustomization.yaml").unwrap().len(), 1);
        assert_eq!(go_glob(root, &app, "*.y*ml").unwrap().len(), 1);
        // A pattern whose directory part has meta characters: each matching directory globbed.
        assert_eq!(
            go_glob(root, &app, "*/plugin.yaml").unwrap(),
            vec![app.join("sub/plugin.yaml")]
        );
        assert_eq!(
            go_glob(root, &app, "s*/*/plugin.yaml").unwrap(),
            vec![app.join("sub/deeper/plugin.yaml")]
        );
        assert!(go_glob(root, &app, "missing").unwrap().is_empty());
        assert_eq!(go_glob(root, &app, "["), Err(BadPattern));
        assert!(go_glob(root, &app, "../../*").unwrap().is_empty());
        assert_eq!(zglob(root, &app, "**/*/plugin.yaml").unwrap().len(), 2);
        assert_eq!(zglob(root, &app, "**/kustomization.yaml").unwrap().len(), 1);
        assert_eq!(zglob(root, &app, "**/*.{json,yaml}").unwrap().len(), 4);
        assert_eq!(
            zglob(root, &app, "does-not-exist"),
            Err(ZglobError::NotExist)
        );
        assert!(zglob(root, &app, "**/nothing.yaml").unwrap().is_empty());
    }

    #[test]
    fn zglob_classes_braces_and_their_literal_characters() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
        let app = root.join("app");
        for f in [
            "a.json",
            "b.json",
            "x,y.json",
            "q}.txt",
            "[x.txt",
            "b\\.txt",
            "sub/plugin.yaml",
            "sub/deeper/plugin.yaml",
        ] {
            let p = app.join(f);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, "").unwrap();
        }
        let names = |pattern: &str| -> Vec<String> {
            zglob(root, &app, pattern)
                .unwrap()
                .iter()
                .map(|p| p.strip_prefix(&app).unwrap().display().to_string())
                .collect()
        };
        // A class is copied through to its closing bracket (a pattern with no `*` or `{` is an
        // existence check).
        assert_eq!(names("*[a].json"), ["a.json"]);
        assert_eq!(names("[ab]*.json"), ["a.json", "b.json"]);
        // A backslash inside a class is a literal backslash.
        assert_eq!(names("b*[\\].txt"), ["b\\.txt"]);
        // An unclosed bracket is a literal one.
        assert_eq!(names("*[x.txt"), ["[x.txt"]);
        // A comma or closing brace outside braces is literal.
        assert_eq!(names("*,y.json"), ["x,y.json"]);
        assert_eq!(names("*}.txt"), ["q}.txt"]);
        assert_eq!(names("{a,b}.json"), ["a.json", "b.json"]);
        // Only `**/` crosses directories; a star before another character and a slash does not.
        assert_eq!(names("s*b/plugin.yaml"), ["sub/plugin.yaml"]);
        assert_eq!(
            names("s**/plugin.yaml"),
            ["sub/deeper/plugin.yaml", "sub/plugin.yaml"]
        );
    }
}
