//! YAML documents parsed into a tree with go-yaml v2's (YAML 1.1) scalar resolution, which is
//! what Argo CD's `sigs.k8s.io/yaml` uses: `yes`/`on` are booleans, `0777` is octal, `1_000` is
//! an int, `<<` merges. Aliases are expanded with a node budget (no billion laughs).

use std::collections::HashMap;

use saphyr_parser::{Event, Parser, ScalarStyle};

/// A YAML node after resolution.
#[derive(Debug, Clone, PartialEq)]
pub enum Node {
    /// `~`, `null`, empty.
    Null,
    /// YAML 1.1 booleans.
    Bool(bool),
    /// Signed integer.
    Int(i64),
    /// Unsigned integer above `i64::MAX`.
    Uint(u64),
    /// Float (may be infinite/NaN; JSON conversion refuses those).
    Float(f64),
    /// String.
    Str(String),
    /// Sequence.
    Seq(Vec<Node>),
    /// Mapping in document order (duplicates kept; later ones win on conversion).
    Map(Vec<(Node, Node)>),
}

/// A YAML syntax or structure error.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("yaml: {0}")]
pub struct YamlError(pub String);

/// Nodes one document may expand to through aliases.
const NODE_BUDGET: usize = 1_000_000;

/// Parse the first document of `text` (`None` when there is none or it is empty).
pub fn parse_one(text: &str) -> Result<Option<Node>, YamlError> {
    let mut b = Builder {
        parser: Parser::new_from_str(text),
        anchors: HashMap::new(),
        budget: NODE_BUDGET,
    };
    loop {
        match b.next()? {
            Event::StreamEnd => return Ok(None),
            Event::DocumentStart(_) => {
                let ev = b.next()?;
                if matches!(ev, Event::DocumentEnd) {
                    return Ok(None);
                }
                return b.node(ev).map(Some);
            }
            _ => {}
        }
    }
}

struct Builder<'a> {
    parser: Parser<'a, saphyr_parser::StrInput<'a>>,
    anchors: HashMap<usize, Node>,
    budget: usize,
}

impl<'a> Builder<'a> {
    fn next(&mut self) -> Result<Event<'a>, YamlError> {
        match self.parser.next_event() {
            Some(Ok((ev, _))) => Ok(ev),
            Some(Err(e)) => Err(YamlError(e.to_string())),
            None => Ok(Event::StreamEnd),
        }
    }

    fn spend(&mut self, n: usize) -> Result<(), YamlError> {
        self.budget = self
            .budget
            .checked_sub(n)
            .ok_or_else(|| YamlError("document too large (alias expansion)".into()))?;
        Ok(())
    }

    fn node(&mut self, ev: Event<'a>) -> Result<Node, YamlError> {
        self.spend(1)?;
        match ev {
            Event::Scalar(v, style, anchor, tag) => {
                let tag = tag.map(|t| format!("{}{}", t.handle, t.suffix));
                let n = resolve(&v, style, tag.as_deref())?;
                if anchor > 0 {
                    self.anchors.insert(anchor, n.clone());
                }
                Ok(n)
            }
            Event::Alias(id) => {
                let n = self
                    .anchors
                    .get(&id)
                    .cloned()
                    .ok_or_else(|| YamlError("unknown anchor".into()))?;
                self.spend(count(&n))?;
                Ok(n)
            }
            Event::SequenceStart(anchor, _) => {
                let mut items = Vec::new();
                loop {
                    match self.next()? {
                        Event::SequenceEnd => break,
                        ev => items.push(self.node(ev)?),
                    }
                }
                let n = Node::Seq(items);
                if anchor > 0 {
                    self.anchors.insert(anchor, n.clone());
                }
                Ok(n)
            }
            Event::MappingStart(anchor, _) => {
                let mut pairs: Vec<(Node, Node)> = Vec::new();
                loop {
                    let kev = match self.next()? {
                        Event::MappingEnd => break,
                        ev => ev,
                    };
                    // Only a plain, untagged `<<` is a merge key (go-yaml v2's !!merge).
                    let is_merge =
                        matches!(&kev, Event::Scalar(v, ScalarStyle::Plain, _, None) if v == "<<");
                    let k = self.node(kev)?;
                    let ev = self.next()?;
                    let v = self.node(ev)?;
                    if is_merge {
                        merge(&mut pairs, v)?;
                    } else {
                        pairs.push((k, v));
                    }
                }
                let n = Node::Map(pairs);
                if anchor > 0 {
                    self.anchors.insert(anchor, n.clone());
                }
                Ok(n)
            }
            other => Err(YamlError(format!("unexpected event {other:?}"))),
        }
    }
}

/// go-yaml v2: a merged mapping sets its keys (later explicit keys override); a sequence of
/// mappings is merged last-to-first so earlier ones win.
fn merge(pairs: &mut Vec<(Node, Node)>, v: Node) -> Result<(), YamlError> {
    match v {
        Node::Map(m) => pairs.extend(m),
        Node::Seq(items) => {
            for item in items.into_iter().rev() {
                match item {
                    Node::Map(m) => pairs.extend(m),
                    _ => {
                        return Err(YamlError(
                            "map merge requires map or sequence of maps as the value".into(),
                        ));
                    }
                }
            }
        }
        _ => {
            return Err(YamlError(
                "map merge requires map or sequence of maps as the value".into(),
            ));
        }
    }
    Ok(())
}

fn count(n: &Node) -> usize {
    match n {
        Node::Seq(v) => 1 + v.iter().map(count).sum::<usize>(),
        Node::Map(v) => 1 + v.iter().map(|(k, v)| count(k) + count(v)).sum::<usize>(),
        _ => 1,
    }
}

/// Resolve one scalar as go-yaml v2 does.
fn resolve(v: &str, style: ScalarStyle, tag: Option<&str>) -> Result<Node, YamlError> {
    match tag {
        Some("tag:yaml.org,2002:str") | Some("!!str") => return Ok(Node::Str(v.to_owned())),
        Some("tag:yaml.org,2002:int") | Some("!!int") => {
            return match resolve_plain(v) {
                n @ (Node::Int(_) | Node::Uint(_)) => Ok(n),
                _ => Err(YamlError(format!("cannot decode !!str `{v}` as a !!int"))),
            };
        }
        Some("tag:yaml.org,2002:float") | Some("!!float") => {
            return match resolve_plain(v) {
                Node::Int(i) => Ok(Node::Float(i as f64)),
                Node::Uint(u) => Ok(Node::Float(u as f64)),
                n @ Node::Float(_) => Ok(n),
                _ => Err(YamlError(format!("cannot decode !!str `{v}` as a !!float"))),
            };
        }
        Some("tag:yaml.org,2002:bool") | Some("!!bool") => {
            return match resolve_plain(v) {
                n @ Node::Bool(_) => Ok(n),
                _ => Err(YamlError(format!("cannot decode !!str `{v}` as a !!bool"))),
            };
        }
        Some("tag:yaml.org,2002:null") | Some("!!null") => return Ok(Node::Null),
        _ => {}
    }
    if style != ScalarStyle::Plain {
        return Ok(Node::Str(v.to_owned()));
    }
    Ok(resolve_plain(v))
}

fn resolve_plain(v: &str) -> Node {
    match v {
        "" | "~" | "null" | "Null" | "NULL" => return Node::Null,
        "y" | "Y" | "yes" | "Yes" | "YES" | "true" | "True" | "TRUE" | "on" | "On" | "ON" => {
            return Node::Bool(true);
        }
        "n" | "N" | "no" | "No" | "NO" | "false" | "False" | "FALSE" | "off" | "Off" | "OFF" => {
            return Node::Bool(false);
        }
        ".inf" | ".Inf" | ".INF" | "+.inf" | "+.Inf" | "+.INF" => {
            return Node::Float(f64::INFINITY);
        }
        "-.inf" | "-.Inf" | "-.INF" => return Node::Float(f64::NEG_INFINITY),
        ".nan" | ".NaN" | ".NAN" => return Node::Float(f64::NAN),
        _ => {}
    }
    let first = v.as_bytes()[0];
    if first.is_ascii_digit() || matches!(first, b'+' | b'-' | b'.') {
        let plain: String = v.chars().filter(|&c| c != '_').collect();
        if let Some(i) = go_parse_int(&plain) {
            return Node::Int(i);
        }
        if let Some(u) = go_parse_uint(&plain) {
            return Node::Uint(u);
        }
        if is_yaml_float(&plain)
            && let Ok(f) = plain.parse::<f64>()
        {
            return Node::Float(f);
        }
    }
    Node::Str(v.to_owned())
}

/// Go `strconv.ParseInt(s, 0, 64)`: optional sign, then `0x`/`0o`/`0b`/leading-`0` octal/decimal.
fn go_parse_int(s: &str) -> Option<i64> {
    let (neg, body) = match s.as_bytes().first()? {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    let mag = go_parse_uint(body)?;
    if neg {
        if mag <= i64::MAX as u64 + 1 {
            Some((mag as i128).wrapping_neg() as i64)
        } else {
            None
        }
    } else {
        i64::try_from(mag).ok()
    }
}

/// Go `strconv.ParseUint(s, 0, 64)` (no sign).
fn go_parse_uint(s: &str) -> Option<u64> {
    if s.is_empty() {
        return None;
    }
    let (radix, digits) = if let Some(r) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        (16, r)
    } else if let Some(r) = s.strip_prefix("0o").or_else(|| s.strip_prefix("0O")) {
        (8, r)
    } else if let Some(r) = s.strip_prefix("0b").or_else(|| s.strip_prefix("0B")) {
        (2, r)
    } else if s.len() > 1 && s.starts_with('0') {
        (8, &s[1..])
    } else {
        (10, s)
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    u64::from_str_radix(digits, radix).ok()
}

/// `^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$`
fn is_yaml_float(s: &str) -> bool {
    let b = s.as_bytes();
    let mut i = 0;
    if i < b.len() && (b[i] == b'-' || b[i] == b'+') {
        i += 1;
    }
    let digits = |i: &mut usize| {
        let s = *i;
        while *i < b.len() && b[*i].is_ascii_digit() {
            *i += 1;
        }
        *i - s
    };
    if i < b.len() && b[i] == b'.' {
        i += 1;
        if digits(&mut i) == 0 {
            return false;
        }
    } else {
        if digits(&mut i) == 0 {
            return false;
        }
        if i < b.len() && b[i] == b'.' {
            i += 1;
            digits(&mut i);
        }
    }
    if i < b.len() && (b[i] == b'e' || b[i] == b'E') {
        i += 1;
        if i < b.len() && (b[i] == b'-' || b[i] == b'+') {
            i += 1;
        }
        if digits(&mut i) == 0 {
            return false;
        }
    }
    i == b.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(s: &str) -> Node {
        parse_one(s).unwrap().unwrap()
    }

    #[test]
    fn scalars_resolve_like_go_yaml_v2() {
        assert_eq!(one("yes"), Node::Bool(true));
        assert_eq!(one("Off"), Node::Bool(false));
        assert_eq!(one("'yes'"), Node::Str("yes".into()));
        assert_eq!(one("0777"), Node::Int(511));
        assert_eq!(one("0x1F"), Node::Int(31));
        assert_eq!(one("1_000"), Node::Int(1000));
        assert_eq!(one("08"), Node::Float(8.0));
        assert_eq!(one("1.5e3"), Node::Float(1500.0));
        assert_eq!(one("18446744073709551615"), Node::Uint(u64::MAX));
        assert_eq!(one("~"), Node::Null);
        assert_eq!(one("!!str 12"), Node::Str("12".into()));
        assert_eq!(one("1.2.3"), Node::Str("1.2.3".into()));
        assert_eq!(one("-x"), Node::Str("-x".into()));
    }

    #[test]
    fn merges_and_aliases() {
        let n = one("base: &b {a: 1, b: 2}\nx:\n  <<: *b\n  b: 3\n");
        let Node::Map(top) = n else { panic!() };
        assert_eq!(
            top[1].1,
            Node::Map(vec![
                (Node::Str("a".into()), Node::Int(1)),
                (Node::Str("b".into()), Node::Int(2)),
                (Node::Str("b".into()), Node::Int(3)),
            ])
        );
        let bomb = "a: &a [x,x,x,x,x,x,x,x,x,x]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b]\nd: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c]\ne: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d,*d]\nf: [*e,*e,*e,*e,*e,*e,*e,*e,*e,*e]\ng: [*e,*e,*e,*e,*e,*e,*e,*e,*e,*e]\n";
        assert!(parse_one(bomb).is_err());
    }
}
