//! File denials a failed command names, for when the kernel's records cannot say: a sidecar
//! has neither the host's audit netlink nor `CAP_AUDIT_READ`, and a host may run with audit
//! off. A path the command's error calls "permission denied" (or "operation not permitted")
//! that no `spec.filesystem` rule covers is one Landlock refuses whatever its file modes, so
//! the error can name it and the field that allows it, and `policy suggest` can propose it.
//!
//! Only the message's text is read: the supervisor opens, stats or resolves none of these
//! paths (a command chooses what its error says). Absolute paths only; the request's own
//! directories (its tree under the work root, its private `/tmp`) are never named.

use std::path::{Component, Path};

use vocab::record::LandlockDenial;

/// What a denial inferred from a command's message is called (`blockers`): not the kernel's
/// name for an access, since the message does not say which one was refused.
pub const FROM_MESSAGE: &str = "fs (named in the command's error)";

/// The field that allows such a path.
pub const ALLOWED_BY: &str =
    "spec.filesystem.readOnly (or readWrite, to write) lists it or a directory above it";

/// At most this many paths are named (a tool may list many).
const MAX_NAMED: usize = 3;

/// Phrases of a refused access, as libc's `strerror`, Go and Python print them.
const REFUSED: &[&str] = &["permission denied", "operation not permitted"];

/// Whether a message calls some access refused ("permission denied", …), in any case.
pub fn says_refused(message: &str) -> bool {
    let lower = message.to_ascii_lowercase();
    REFUSED.iter().any(|p| lower.contains(p))
}

/// The paths a failed command's error (Argo CD's `` `argv` failed <cause>: <stderr> ``) names
/// in its stderr as refused that none of `rules` covers and that are not beneath any of `own`,
/// as denials (in the order named, without repeats). The argv is not read: the command line
/// names paths it never opened.
pub fn inferred<'a>(
    message: &str,
    rules: impl Iterator<Item = &'a Path> + Clone,
    own: &[&Path],
) -> Vec<LandlockDenial> {
    let Some(stderr) = message
        .split_once("` failed ")
        .and_then(|(_, rest)| rest.split_once(": "))
        .map(|(_, stderr)| stderr)
    else {
        return Vec::new();
    };
    let mut out: Vec<LandlockDenial> = Vec::new();
    for line in stderr.lines() {
        let lower = line.to_ascii_lowercase();
        if !REFUSED.iter().any(|p| lower.contains(p)) {
            continue;
        }
        for p in absolute_paths(line) {
            let path = Path::new(p);
            let beneath = |r: &Path| path.starts_with(r);
            if rules.clone().any(beneath)
                || own.iter().any(|o| beneath(o))
                || out.iter().any(|d| d.object == p)
            {
                continue;
            }
            out.push(LandlockDenial {
                blockers: FROM_MESSAGE.to_owned(),
                object: p.chars().take(256).collect(),
                allowed_by: Some(ALLOWED_BY.to_owned()),
            });
            if out.len() == MAX_NAMED {
                return out;
            }
        }
    }
    out
}

/// The absolute paths in `line`: a `/` at the start or after a space, quote, bracket, `=` or
/// `:`, up to the first character no path in an error message has; normal components only.
fn absolute_paths(line: &str) -> impl Iterator<Item = &str> {
    let bytes = line.as_bytes();
    let starts = (0..bytes.len()).filter(move |&i| {
        bytes[i] == b'/'
            && (i == 0
                || matches!(
                    bytes[i - 1],
                    b' ' | b'"' | b'\'' | b'`' | b'(' | b'[' | b'=' | b':' | b'\t'
                ))
    });
    starts.filter_map(move |i| {
        let rest = &line[i..];
        let end = rest
            .find(|c: char| {
                c.is_whitespace() || matches!(c, ':' | '"' | '\'' | '`' | ')' | ']' | ',' | ';')
            })
            .unwrap_or(rest.len());
        let p = rest[..end].trim_end_matches('.');
        let path = Path::new(p);
        // `//` starts no path a tool prints (it is a URL's `://`).
        (p.len() > 1
            && !p.starts_with("//")
            && path
                .components()
                .all(|c| matches!(c, Component::RootDir | Component::Normal(_))))
        .then_some(p)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// Argo CD's form of a failed command, with `stderr`.
    fn failed(stderr: &str) -> String {
        format!(
            "error generating manifests: `sh -c \"cat /srv/named/in/argv\"` failed exit status 1: {stderr}"
        )
    }

    fn named(stderr: &str) -> Vec<String> {
        let message = failed(stderr);
        let rules: Vec<PathBuf> = ["/usr", "/etc/ssl", "/etc/passwd", "/dev/null"]
            .iter()
            .map(PathBuf::from)
            .collect();
        inferred(
            &message,
            rules.iter().map(PathBuf::as_path),
            &[Path::new("/tmp"), Path::new("/work/_cmp_server")],
        )
        .into_iter()
        .map(|d| {
            assert_eq!(d.blockers, FROM_MESSAGE);
            assert_eq!(d.allowed_by.as_deref(), Some(ALLOWED_BY));
            d.object
        })
        .collect()
    }

    #[test]
    fn the_refused_paths_outside_every_rule_are_named_as_tools_print_them() {
        // coreutils, sh, Go, Python.
        assert_eq!(
            named("cat: /srv/x/a.yaml: Permission denied"),
            ["/srv/x/a.yaml"]
        );
        assert_eq!(
            named("sh: 1: /opt2/tool: Permission denied"),
            ["/opt2/tool"]
        );
        assert_eq!(
            named("Error: open /var/lib/helm/repos.yaml: permission denied"),
            ["/var/lib/helm/repos.yaml"]
        );
        assert_eq!(
            named("PermissionError: [Errno 13] Permission denied: '/root/.config/x'"),
            ["/root/.config/x"]
        );
        assert_eq!(
            named("mkdir: cannot create directory '/var/cache/x': Operation not permitted"),
            ["/var/cache/x"]
        );
        // Several, without repeats, at most three.
        assert_eq!(
            named(
                "/a/1: permission denied\n/a/1: permission denied\n/b /c /d /e: permission denied"
            ),
            ["/a/1", "/b", "/c"]
        );
    }

    #[test]
    fn covered_own_relative_and_unrefused_paths_are_not_named() {
        // Covered by a rule (the refusal is the file's modes, not Landlock).
        assert!(named("cat: /etc/ssl/private/k.pem: Permission denied").is_empty());
        assert!(named("cat: /usr/share/x: Permission denied").is_empty());
        // A rule names a file: its siblings are not covered, the file itself is.
        assert!(named("cat: /etc/passwd: Permission denied").is_empty());
        assert_eq!(
            named("cat: /etc/passwd-: Permission denied"),
            ["/etc/passwd-"]
        );
        // The request's own directories.
        assert!(named("touch: /tmp/x: Permission denied").is_empty());
        assert!(named("rm: /work/_cmp_server/j1/repo/a: Permission denied").is_empty());
        // Relative paths, `..`, a lone `/`, and lines that do not say an access was refused.
        assert!(named("cat: ../secret: Permission denied").is_empty());
        assert!(named("cat: /srv/../etc/shadow: Permission denied").is_empty());
        assert!(named("cannot write to /: permission denied").is_empty());
        assert!(named("cat: /srv/x: No such file or directory").is_empty());
        // URLs.
        assert!(named("fatal: https://git.example/r.git: permission denied").is_empty());
    }

    #[test]
    fn only_the_stderr_of_a_failed_command_is_read() {
        let rules: [&Path; 0] = [];
        // The argv's paths are not named, though the line says "Permission denied".
        assert!(
            inferred(
                "error: `cat /srv/a` failed exit status 1: Permission denied",
                rules.iter().copied(),
                &[]
            )
            .is_empty()
        );
        // Not a failed command's error: nothing is read.
        assert!(inferred("cat: /srv/a: Permission denied", rules.iter().copied(), &[]).is_empty());
        let d = inferred(
            &failed("cat: /srv/a: Permission denied"),
            rules.iter().copied(),
            &[],
        );
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].object, "/srv/a");
    }
}
