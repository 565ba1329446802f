//! Where in the user's YAML an error is (plugin.yaml, policies): the field path of a serde error and the YAML line of
//! a field path. serde sees the document as JSON (the project's one YAML reader converts it), so
//! its positions are JSON positions; these two steps turn them back into what the user wrote.

/// One step of a field path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seg {
    /// A mapping key.
    Key(String),
    /// A sequence index.
    Index(usize),
}

/// The path as users write it: `spec.network.allow[0].host`.
pub fn dotted(path: &[Seg]) -> String {
    let mut out = String::new();
    for s in path {
        match s {
            Seg::Key(k) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(k);
            }
            Seg::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

/// Parse a dotted path (`spec.network.allow[0].host`) back into steps.
pub fn parse_dotted(field: &str) -> Vec<Seg> {
    let mut out = Vec::new();
    for part in field.split('.') {
        let (key, mut rest) = part.split_once('[').map_or((part, ""), |(k, r)| (k, r));
        if !key.is_empty() {
            out.push(Seg::Key(key.to_owned()));
        }
        while let Some((idx, r)) = rest.split_once(']') {
            if let Ok(i) = idx.parse() {
                out.push(Seg::Index(i));
            }
            rest = r.strip_prefix('[').unwrap_or(r);
        }
    }
    out
}

/// The field path at 1-based `line` of `serde_json::to_string_pretty` output (one member or
/// element per line, two spaces per level): the member on that line, or the object or array a
/// closing bracket there ends (serde reports a missing field at the end of its object).
pub fn json_path_at(pretty: &str, line: usize) -> Vec<Seg> {
    // Each open container: the step that leads to it and, for arrays, the next index.
    let mut stack: Vec<(Option<Seg>, Option<usize>)> = Vec::new();
    let path = |stack: &[(Option<Seg>, Option<usize>)]| -> Vec<Seg> {
        stack.iter().filter_map(|(s, _)| s.clone()).collect()
    };
    for (n, raw) in pretty.lines().enumerate() {
        let t = raw.trim().trim_end_matches(',');
        if t.starts_with('}') || t.starts_with(']') {
            if n + 1 == line {
                return path(&stack);
            }
            stack.pop();
            continue;
        }
        let (seg, value) = match stack.last_mut() {
            None => (None, t),
            Some((_, Some(next))) => {
                *next += 1;
                (Some(Seg::Index(*next - 1)), t)
            }
            Some((_, None)) => match split_member(t) {
                Some((k, v)) => (Some(Seg::Key(k)), v),
                None => (None, t),
            },
        };
        if n + 1 == line {
            let mut p = path(&stack);
            p.extend(seg);
            return p;
        }
        match value {
            "{" => stack.push((seg, None)),
            "[" => stack.push((seg, Some(0))),
            _ => {}
        }
    }
    path(&stack)
}

/// `"key": value` → (key, value).
fn split_member(t: &str) -> Option<(String, &str)> {
    let bytes = t.as_bytes();
    if bytes.first() != Some(&b'"') {
        return None;
    }
    let mut i = 1;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' => i += 2,
            b'"' => break,
            _ => i += 1,
        }
    }
    let key: String = serde_json::from_str(t.get(..=i)?).ok()?;
    let value = t.get(i + 1..)?.trim_start().strip_prefix(':')?.trim_start();
    Some((key, value))
}

/// The 1-based line of `path` in the YAML `text` as the user wrote it, block or flow style;
/// `None` when it cannot be told (then the message names the path alone). List indices are
/// followed in block sequences (`- ` items); in flow sequences the line of the list is kept.
pub fn yaml_line(text: &str, path: &[Seg]) -> Option<usize> {
    let lines: Vec<&str> = text.lines().collect();
    let mut at: Option<(usize, usize)> = None; // (line index, indent) of the last step found
    for seg in path {
        let (from, parent_indent) = at.map_or((0, None), |(l, i)| (l, Some(i)));
        let found = match seg {
            Seg::Key(k) => find_key(&lines, from, parent_indent, k),
            Seg::Index(i) => find_item(&lines, from, parent_indent, *i),
        };
        match found {
            Some(f) => at = Some(f),
            None if at.is_some() => break,
            None => return None,
        }
    }
    at.map(|(l, _)| l + 1)
}

fn content(line: &str) -> &str {
    // Drop a comment (a `#` after a space or at the start); good enough for keys.
    let mut cut = line.len();
    let b = line.as_bytes();
    for i in 0..b.len() {
        if b[i] == b'#' && (i == 0 || b[i - 1] == b' ') {
            cut = i;
            break;
        }
    }
    &line[..cut]
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start_matches([' ', '-']).len()
}

/// The key's line after `from`: on the parent's own line (flow style) or below it, indented
/// deeper than the parent; the search ends where the parent's block ends.
fn find_key(
    lines: &[&str],
    from: usize,
    parent: Option<usize>,
    key: &str,
) -> Option<(usize, usize)> {
    for (n, line) in lines.iter().enumerate().skip(from) {
        let c = content(line);
        if c.trim().is_empty() {
            continue;
        }
        let ind = indent(c);
        if let Some(p) = parent
            && n > from
            && ind <= p
            && !c.trim_start().starts_with(['}', ']'])
        {
            return None;
        }
        if has_key(c, key, n == from && parent.is_some()) {
            return Some((n, ind));
        }
    }
    None
}

/// Whether `key:` starts a member on this line (at the start, after `- `, `{` or `,`); on the
/// parent's own line only a flow member counts (the parent key itself is not its child).
fn has_key(c: &str, key: &str, only_flow: bool) -> bool {
    let quoted = [key.to_owned(), format!("\"{key}\""), format!("'{key}'")];
    let b = c.as_bytes();
    for k in &quoted {
        let mut start = 0;
        while let Some(pos) = c[start..].find(k.as_str()) {
            let i = start + pos;
            let before = c[..i].trim_end();
            let after = c[i + k.len()..].trim_start();
            let starts_member = if only_flow {
                before.ends_with('{') || before.ends_with(',')
            } else {
                before.is_empty()
                    || before.ends_with('-')
                    || before.ends_with('{')
                    || before.ends_with(',')
            };
            if starts_member && after.starts_with(':') {
                return true;
            }
            start = i + 1;
            if start >= b.len() {
                break;
            }
        }
    }
    false
}

/// The `index`th `- ` item below the parent key (block sequences); a flow sequence keeps the
/// parent's line.
fn find_item(
    lines: &[&str],
    from: usize,
    parent: Option<usize>,
    index: usize,
) -> Option<(usize, usize)> {
    let here = lines.get(from)?;
    if content(here).contains('[') {
        return Some((from, parent.unwrap_or(0)));
    }
    let mut seen = 0;
    let mut item_indent = None;
    for (n, line) in lines.iter().enumerate().skip(from + 1) {
        let c = content(line);
        if c.trim().is_empty() {
            continue;
        }
        let lead = c.len() - c.trim_start().len();
        if parent.is_some_and(|p| lead < p || (lead == p && !c.trim_start().starts_with('-'))) {
            return None;
        }
        if c.trim_start().starts_with("- ") || c.trim() == "-" {
            if *item_indent.get_or_insert(lead) != lead {
                continue;
            }
            if seen == index {
                // Keys of the item are indented past its dash.
                return Some((n, lead + 1));
            }
            seen += 1;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(k: &str) -> Seg {
        Seg::Key(k.into())
    }

    #[test]
    fn path_of_a_pretty_json_line() {
        let v: serde_json::Value = serde_json::from_str(
            r#"{"kind":"P","spec":{"limits":{"memoryBytes":"1Gi","pids":5},"allow":[{"host":"a"},{"host":"b"}]}}"#,
        )
        .expect("json");
        let pretty = serde_json::to_string_pretty(&v).expect("pretty");
        let line_of = |needle: &str| {
            pretty
                .lines()
                .position(|l| l.contains(needle))
                .expect("line")
                + 1
        };
        assert_eq!(
            json_path_at(&pretty, line_of("\"pids\"")),
            [key("spec"), key("limits"), key("pids")]
        );
        assert_eq!(
            json_path_at(&pretty, line_of("\"b\"")),
            [key("spec"), key("allow"), Seg::Index(1), key("host")]
        );
        // A closing bracket: the object it ends (where serde reports a missing field).
        assert_eq!(
            json_path_at(&pretty, line_of("\"pids\"") + 1),
            [key("spec"), key("limits")]
        );
        assert_eq!(
            dotted(&json_path_at(&pretty, line_of("\"b\""))),
            "spec.allow[1].host"
        );
        assert_eq!(
            parse_dotted("spec.allow[1].host"),
            [key("spec"), key("allow"), Seg::Index(1), key("host")]
        );
    }

    #[test]
    fn yaml_line_of_a_path_in_block_and_flow_style() {
        let text = "\
apiVersion: v1   # limits: not this one
kind: SandboxPolicy
spec:
  uidRange: {first: 1, count: 2}
  limits:
    wallSeconds: 3
    memoryBytes: 1Gi
  network:
    allow:
      - host: a
        ports: [1]
      - {host: b, ports: [2]}
  env: {pass: [PATH]}
";
        let at = |p: &[Seg]| yaml_line(text, p);
        assert_eq!(
            at(&[key("spec"), key("limits"), key("memoryBytes")]),
            Some(7)
        );
        assert_eq!(at(&[key("spec"), key("uidRange"), key("count")]), Some(4));
        assert_eq!(at(&[key("spec"), key("env"), key("pass")]), Some(13));
        assert_eq!(
            at(&[
                key("spec"),
                key("network"),
                key("allow"),
                Seg::Index(0),
                key("ports")
            ]),
            Some(11)
        );
        assert_eq!(
            at(&[
                key("spec"),
                key("network"),
                key("allow"),
                Seg::Index(1),
                key("host")
            ]),
            Some(12)
        );
        // A key missing from the file: the deepest step that is there.
        assert_eq!(at(&[key("spec"), key("limits"), key("pids")]), Some(5));
        assert_eq!(at(&[key("nothere")]), None);
    }
}
