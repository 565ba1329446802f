//! Writing a policy back out as a policy file (for `cmp-warden policy suggest`): every field
//! explicit, so the reviewer sees the whole policy in one place.

use std::fmt::Write as _;
use vocab::egress;

use crate::policy::{NetworkMode, Policy, SeccompMode};

/// YAML (flow lists, JSON-quoted strings) that [`Policy::parse`] reads back to `p`, with
/// `profile` as `spec.seccomp.profile` and `notes` as leading comments.
pub fn to_yaml(p: &Policy, profile: &str, notes: &[String]) -> String {
    let q = |s: &str| serde_json::to_string(s).unwrap_or_default();
    let list = |v: &[String]| v.iter().map(|s| q(s)).collect::<Vec<_>>().join(", ");
    let paths = |v: &[std::path::PathBuf]| {
        v.iter()
            .map(|s| q(&s.display().to_string()))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let require: Vec<String> = p
        .require
        .iter()
        .filter_map(|r| serde_json::to_value(r).ok())
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect();
    let ns = &p.namespaces;
    let namespaces: Vec<String> = [
        ("mount", ns.mount),
        ("pid", ns.pid),
        ("net", ns.net),
        ("ipc", ns.ipc),
        ("uts", ns.uts),
        ("cgroup", ns.cgroup),
    ]
    .iter()
    .filter(|(_, on)| *on)
    .map(|(n, _)| (*n).to_owned())
    .collect();
    let mut o = String::new();
    for n in notes {
        let _ = writeln!(o, "# {}", comment_text(n));
    }
    let l = &p.limits;
    let a = &p.archive;
    let _ = write!(
        o,
        "apiVersion: cmp-warden.io/v1alpha1
kind: SandboxPolicy
metadata:
  name: {name}
spec:
{node_wide}  filesystem:
    readOnly: [{ro}]
    readWrite: [{rw}]
{net}  env:
    pass: [{pass}]
  seccomp: {{profile: {profile}, mode: {mode}}}
  limits:
    wallSeconds: {wall}
    memoryBytes: {mem}
    pids: {pids}
    cpuMillis: {cpu}
    outputBytes: {out}
    openFiles: {files}
    fileSizeBytes: {fsize}
    diskBytes: {disk}
    dataBytes: {data}
    addressSpaceBytes: {asb}
  archive:
    compressedBytes: {ac}
    extractedBytes: {ae}
    fileBytes: {af}
    entries: {an}
    symlinks: {asl}
    pathDepth: {ad}
    maxRatio: {ar}
    wallSeconds: {aw}
{strict}",
        name = q(&p.name),
        // A selected policy says what it is for and takes the node-wide fields from the
        // default policy, which alone may set them.
        node_wide = match &p.select {
            Some(s) => format!("  select: {}\n", select(s)),
            None => format!(
                "  require: [{}]\n  namespaces: [{}]\n  uidRange: {{first: {}, count: {}}}\n",
                list(&require),
                namespaces.join(", "),
                p.uid_first,
                p.uid_count
            ),
        },
        ro = paths(&p.read_only),
        rw = paths(&p.read_write),
        net = network(p),
        pass = list(&p.env_pass),
        profile = q(profile),
        mode = match p.seccomp_mode {
            SeccompMode::Enforce => "enforce",
            SeccompMode::Audit => "audit",
        },
        wall = l.wall_seconds,
        mem = bytes(l.memory_bytes),
        pids = l.pids,
        cpu = l.cpu_millis,
        out = bytes(l.output_bytes),
        files = l.open_files,
        fsize = bytes(l.file_size_bytes),
        disk = bytes(l.disk_bytes),
        data = bytes(l.data_bytes),
        asb = bytes(l.address_space_bytes),
        ac = bytes(a.compressed_bytes),
        ae = bytes(a.extracted_bytes),
        af = bytes(a.file_bytes),
        an = a.entries,
        asl = a.symlinks,
        ad = a.path_depth,
        ar = a.max_ratio,
        aw = a.wall_seconds,
        strict = if a.strict_names {
            "    strictNames: true\n"
        } else {
            ""
        },
    );
    let default_uid = p.uid_first.checked_add(p.uid_count);
    let _ = p.select.is_none().then(|| {
        writeln!(
            o,
            "  cache: {{enabled: {}, bytes: {}{}{}}}",
            p.cache.enabled,
            bytes(p.cache.bytes),
            if Some(p.cache.uid) == default_uid {
                String::new()
            } else {
                format!(", uid: {}", p.cache.uid)
            },
            if p.cache.min_archive_bytes == crate::policy::DEFAULT_CACHE_MIN_ARCHIVE_BYTES {
                String::new()
            } else {
                format!(", minArchiveBytes: {}", bytes(p.cache.min_archive_bytes))
            }
        )
    });
    let ll = &p.landlock;
    if p.require.contains(&crate::Protection::Landlock)
        && (ll.min_abi > 1 || !ll.features.is_empty())
    {
        let features: Vec<&str> = ll.features.iter().map(|f| f.as_str()).collect();
        let _ = writeln!(
            o,
            "  landlock: {{minAbi: {}, features: [{}]}}",
            ll.min_abi,
            features.join(", ")
        );
    }
    o
}

/// `spec.select` as a flow mapping of the lists given.
fn select(s: &crate::select::Select) -> String {
    let q = |p: &crate::select::Pattern| serde_json::to_string(&p.to_string()).unwrap_or_default();
    let parts: Vec<String> = [
        ("projects", &s.projects),
        ("namespaces", &s.namespaces),
        ("apps", &s.apps),
    ]
    .iter()
    .filter(|(_, l)| !l.is_empty())
    .map(|(n, l)| format!("{n}: [{}]", l.iter().map(q).collect::<Vec<_>>().join(", ")))
    .collect();
    format!("{{{}}}", parts.join(", "))
}

/// A byte count as the policy files write it: `256Mi`, `2Gi`, or the number.
fn bytes(v: u64) -> String {
    for (unit, suffix) in [
        (1u64 << 40, "Ti"),
        (1 << 30, "Gi"),
        (1 << 20, "Mi"),
        (1 << 10, "Ki"),
    ] {
        if v >= unit && v.is_multiple_of(unit) {
            return format!("{}{suffix}", v / unit);
        }
    }
    v.to_string()
}

/// The `network:` block (two-space indented under `spec:`), with the allow list.
fn network(p: &Policy) -> String {
    let mode = match p.network {
        NetworkMode::None => "none",
        NetworkMode::Egress => "egress",
        NetworkMode::AllowList => "allowList",
    };
    let loopback = if p.network_loopback {
        ", loopback: true"
    } else {
        ""
    };
    if p.network != NetworkMode::AllowList {
        return format!("  network: {{mode: {mode}{loopback}}}\n");
    }
    let mut o = format!("  network:\n    mode: {mode}\n    allow:\n");
    if p.egress.rules.is_empty() {
        o.truncate(o.len() - "    allow:\n".len());
    }
    for r in &p.egress.rules {
        let ports: Vec<String> = r.ports.iter().map(u16::to_string).collect();
        let target = match &r.target {
            egress::Target::Host(h) => format!("host: {}", quoted(&h.to_string())),
            egress::Target::Cidr(c) => format!("cidr: {}", quoted(&c.to_string())),
        };
        let internal = if r.internal { ", internal: true" } else { "" };
        o.push_str(&format!(
            "      - {{{target}, ports: [{}]{internal}}}\n",
            ports.join(", ")
        ));
    }
    if p.egress.audit {
        o.push_str("    audit: true\n");
    }
    if p.egress.search_domains {
        o.push_str("    searchDomains: true\n");
    }
    if p.network_loopback {
        o.push_str("    loopback: true\n");
    }
    if !p.egress.hosts.is_empty() {
        o.push_str("    hosts:\n");
        for (name, ips) in &p.egress.hosts {
            let ips: Vec<String> = ips.iter().map(|ip| quoted(&ip.to_string())).collect();
            o.push_str(&format!("      {}: [{}]\n", quoted(name), ips.join(", ")));
        }
    }
    o.push_str(&format!(
        "    maxConnections: {}\n",
        p.egress_max_connections
    ));
    o
}

/// `output` with the comments of `input` put back on the same keys: comment lines above a key
/// stay above it, a comment after a key's value stays after it. Both are policy files whose
/// mapping keys start their lines (as policy files and [`to_yaml`] write them); comments above
/// `apiVersion` describe the input file itself and are not carried over, nor are those on list
/// items (their key path is not stable).
pub fn keep_comments(input: &str, output: &str) -> String {
    use std::collections::HashMap;
    let mut above: HashMap<String, Vec<String>> = HashMap::new();
    let mut after: HashMap<String, String> = HashMap::new();
    let mut pending: Vec<String> = Vec::new();
    let mut path = KeyPath::default();
    for line in input.lines() {
        let t = line.trim_start();
        if t.starts_with('#') {
            pending.push(t.to_owned());
            continue;
        }
        if t.is_empty() {
            continue;
        }
        match path.step(line) {
            Some(key) => {
                if !pending.is_empty() && key != "apiVersion" {
                    above.insert(key.clone(), std::mem::take(&mut pending));
                }
                if let Some(c) = trailing_comment(line) {
                    after.insert(key, c.to_owned());
                }
            }
            None => {
                // A list item or a continuation line: its comment belongs to the key above.
                if let (Some(c), Some(key)) = (trailing_comment(line), path.current()) {
                    after.entry(key).or_insert_with(|| c.to_owned());
                }
            }
        }
        pending.clear();
    }
    let mut out = String::with_capacity(output.len() + input.len());
    let mut path = KeyPath::default();
    for line in output.lines() {
        let t = line.trim_start();
        let key = if t.starts_with('#') || t.is_empty() {
            None
        } else {
            path.step(line)
        };
        if let Some(key) = key {
            let indent = &line[..line.len() - t.len()];
            for c in above.get(&key).into_iter().flatten() {
                let _ = writeln!(out, "{indent}{c}");
            }
            if let (Some(c), None) = (after.get(&key), trailing_comment(line)) {
                let _ = writeln!(out, "{line}   {c}");
                continue;
            }
        }
        let _ = writeln!(out, "{line}");
    }
    out
}

/// The dotted key path of block-mapping lines, by indentation.
#[derive(Default)]
struct KeyPath {
    stack: Vec<(usize, String)>,
}

impl KeyPath {
    /// The path of `line`'s key, if it starts with one (not a list item).
    fn step(&mut self, line: &str) -> Option<String> {
        let t = line.trim_start();
        let indent = line.len() - t.len();
        let (key, _) = t.split_once(':')?;
        let key = key.trim().trim_matches('"');
        if t.starts_with('-')
            || key.is_empty()
            || !key
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_.-*".contains(c))
        {
            return None;
        }
        while self.stack.last().is_some_and(|(i, _)| *i >= indent) {
            self.stack.pop();
        }
        self.stack.push((indent, key.to_owned()));
        self.current()
    }

    fn current(&self) -> Option<String> {
        (!self.stack.is_empty()).then(|| {
            self.stack
                .iter()
                .map(|(_, k)| k.as_str())
                .collect::<Vec<_>>()
                .join(".")
        })
    }
}

/// The `# …` ending `line`, outside quotes.
fn trailing_comment(line: &str) -> Option<&str> {
    let (mut single, mut double, mut prev_space) = (false, false, false);
    for (i, c) in line.char_indices() {
        match c {
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            '#' if !single && !double && prev_space => return Some(&line[i..]),
            _ => {}
        }
        prev_space = c.is_whitespace();
    }
    None
}

/// `text` as one comment line: every control character and YAML line break (a note may quote
/// what a command named, a process name set with `prctl` among it) written as an escape, so
/// nothing in it can end the comment and become YAML.
pub fn comment_text(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_control() || matches!(c, '\u{85}' | '\u{2028}' | '\u{2029}' | '\u{feff}') {
                c.escape_unicode().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

fn quoted(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A note carrying a newline (a process name set with `prctl`, as the fourth attack round
    /// did) stays one comment: the policy reads back unchanged, with no line of the note's.
    #[test]
    fn a_note_cannot_end_its_comment() {
        let p = Policy::default_policy().expect("default");
        let hostile =
            "seccomp: ptrace by x\nspec: {env: {pass: [AWS_SECRET_ACCESS_KEY]}}\r\u{2028}y";
        let out = to_yaml(&p, "seccomp/default.json", &[hostile.into()]);
        assert_eq!(
            out.lines().filter(|l| l.contains("AWS_SECRET")).count(),
            1,
            "{out}"
        );
        assert!(
            out.lines()
                .next()
                .expect("line")
                .starts_with("# seccomp: ptrace by x\\u{a}spec"),
            "{out}"
        );
        let back = Policy::parse(&out, None).expect("parses");
        assert!(!back.env_pass.iter().any(|n| n.starts_with("AWS")), "{out}");
    }

    #[test]
    fn the_input_policys_comments_come_back_on_the_same_keys() {
        let p = Policy::default_policy().expect("default");
        let out = keep_comments(
            crate::policy::DEFAULT_POLICY_YAML,
            &to_yaml(&p, "seccomp/default.json", &["a note".into()]),
        );
        assert!(out.starts_with("# a note\napiVersion"), "{out}");
        assert!(!out.contains("embedded in the binary"), "{out}");
        assert!(
            out.contains(
                "  # Start-up fails closed unless each of these can be enforced.\n  require: ["
            ),
            "{out}"
        );
        assert!(
            out.contains("    cpuMillis: 2000   # CPU quota, in millicores\n"),
            "{out}"
        );
        assert!(
            out.contains("  network: {mode: none}   # none | allowList"),
            "{out}"
        );
        // Still the same policy.
        let back = Policy::parse(&out, None).expect("parses back");
        assert_eq!(back.limits, p.limits);
        assert_eq!(back.read_only, p.read_only);
    }

    #[test]
    fn hashes_inside_quotes_are_not_comments() {
        assert_eq!(
            trailing_comment(r#"  name: "a # b"   # real"#),
            Some("# real")
        );
        assert_eq!(trailing_comment("  url: http://x/#frag"), None);
    }

    #[test]
    fn the_default_policy_round_trips() {
        let p = Policy::default_policy().expect("default");
        let text = to_yaml(&p, "seccomp/default.json", &["a note".into()]);
        assert!(text.starts_with("# a note\n"));
        let back = Policy::parse(&text, None).expect("parses back");
        let strip = |mut p: Policy| {
            p.sha256.clear();
            p
        };
        assert_eq!(strip(back), strip(p));
        // A non-default cache size floor is written, and read back.
        let text = crate::policy::DEFAULT_POLICY_YAML.replacen(
            "cache: {enabled: true, bytes: 512Mi}",
            "cache: {enabled: true, bytes: 512Mi, minArchiveBytes: 1Mi}",
            1,
        );
        let p = Policy::parse(&text, None).expect("policy");
        let out = to_yaml(&p, "seccomp/default.json", &[]);
        assert!(out.contains("minArchiveBytes: 1Mi"), "{out}");
        let back = Policy::parse(&out, None).expect("parses back");
        assert_eq!(back.cache.min_archive_bytes, 1 << 20);
    }
}
