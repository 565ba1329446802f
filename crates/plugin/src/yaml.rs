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

/// What one document may expand to, aliases included, when the caller sets no budget: bytes
/// of scalars plus [`NODE_COST`] per node.
const DEFAULT_BUDGET: usize = 64 << 20;
/// What a node costs beyond its scalar's bytes: about what it takes in memory here (the
/// enum, a vector slot, an allocation), so the budget bounds the tree's memory too.
const NODE_COST: usize = 64;

/// The expansion budget ran out: the document expands (through aliases) to more than allowed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ParseError {
    /// Not YAML.
    #[error(transparent)]
    Yaml(#[from] YamlError),
    /// Expands past the budget.
    #[error("yaml: document expands past the byte budget (alias expansion included)")]
    TooLarge,
}

/// Parse the first document of `text` (`None` when there is none or it is empty).
pub fn parse_one(text: &str) -> Result<Option<Node>, YamlError> {
    let mut budget = DEFAULT_BUDGET;
    parse_one_within(text, &mut budget).map_err(|e| match e {
        ParseError::Yaml(y) => y,
        ParseError::TooLarge => YamlError("document too large (alias expansion)".into()),
    })
}

/// [`parse_one`], drawing what the document expands to — bytes of every scalar, aliases
/// expanded, plus a per-node cost — from `budget` (shared by the caller across documents).
pub fn parse_one_within(text: &str, budget: &mut usize) -> Result<Option<Node>, ParseError> {
    let mut b = Builder {
        parser: Parser::new_from_str(text),
        anchors: HashMap::new(),
        budget: *budget,
        exhausted: false,
    };
    let r = b.document();
    *budget = b.budget;
    match r {
        Err(_) if b.exhausted => Err(ParseError::TooLarge),
        Err(e) => Err(ParseError::Yaml(e)),
        Ok(n) => Ok(n),
    }
}

impl Builder<'_> {
    fn document(&mut self) -> Result<Option<Node>, YamlError> {
        let b = self;
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
}

struct Builder<'a> {
    parser: Parser<'a, saphyr_parser::StrInput<'a>>,
    anchors: HashMap<usize, Node>,
    budget: usize,
    exhausted: bool,
}

impl<'a> Builder<'a> {
    fn next(&mut self) -> Result<Event<'a>, YamlError> {
        match self.parser.next_event() {
            Some(Ok((ev, _))) => Ok(ev),
            Some(Err(e)) => Err(YamlError(go_yaml_message(&e))),
            None => Ok(Event::StreamEnd),
        }
    }

    fn spend(&mut self, n: usize) -> Result<(), YamlError> {
        match self.budget.checked_sub(n) {
            Some(left) => {
                self.budget = left;
                Ok(())
            }
            None => {
                self.exhausted = true;
                Err(YamlError("document too large (alias expansion)".into()))
            }
        }
    }

    fn node(&mut self, ev: Event<'a>) -> Result<Node, YamlError> {
        self.spend(NODE_COST)?;
        match ev {
            Event::Scalar(v, style, anchor, tag) => {
                self.spend(v.len())?;
                let tag = tag.map(|t| format!("{}{}", t.handle, t.suffix));
                let n = resolve(&v, style, tag.as_deref())?;
                if anchor > 0 {
                    self.anchors.insert(anchor, n.clone());
                }
                Ok(n)
            }
            Event::Alias(id) => {
                // Charged before the copy is made: an expansion past the budget never allocates.
                let c = self
                    .anchors
                    .get(&id)
                    .map(cost)
                    .ok_or_else(|| YamlError("unknown anchor".into()))?;
                self.spend(c)?;
                Ok(self.anchors.get(&id).cloned().unwrap_or(Node::Null))
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

/// A syntax error worded as go-yaml v2 words it (what Argo CD users see): `line N: <problem>`,
/// the problem without libyaml's "while parsing …" context; the line is the problem mark's
/// line, 1-based for scanner errors and 0-based for parser errors (go-yaml's own quirk), and
/// left out when that is 0.
fn go_yaml_message(e: &saphyr_parser::ScanError) -> String {
    let info = e.info();
    let parser = info.starts_with("while parsing") || info.starts_with("did not find expected <");
    let problem = match info.strip_prefix("while parsing") {
        Some(rest) => rest.split_once(", ").map_or(info, |(_, p)| p),
        None => info,
    };
    let problem = if problem.starts_with("expected ") {
        format!("did not find {problem}")
    } else {
        problem.to_owned()
    };
    let line = if parser {
        e.marker().line().saturating_sub(1)
    } else {
        e.marker().line()
    };
    if line == 0 {
        problem
    } else {
        format!("line {line}: {problem}")
    }
}

/// What expanding `n` once more costs: its scalars' bytes and [`NODE_COST`] per node.
fn cost(n: &Node) -> usize {
    match n {
        Node::Seq(v) => v.iter().map(cost).fold(NODE_COST, usize::saturating_add),
        Node::Map(v) => v
            .iter()
            .map(|(k, v)| cost(k).saturating_add(cost(v)))
            .fold(NODE_COST, usize::saturating_add),
        Node::Str(s) => NODE_COST + s.len(),
        _ => NODE_COST,
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

    #[test]
    fn syntax_errors_read_as_go_yaml_words_them() {
        let e = |t: &str| parse_one(t).expect_err("invalid").to_string();
        assert_eq!(
            e("a: b: c\n"),
            "yaml: line 1: mapping values are not allowed in this context"
        );
        assert_eq!(
            e("a: 1\nb: 2\n  c: 3\n"),
            "yaml: line 3: mapping values are not allowed in this context"
        );
        assert_eq!(
            e("a:\n  - x\n y: z\n"),
            "yaml: line 2: did not find expected key"
        );
    }

    #[test]
    fn aliases_are_charged_by_the_bytes_they_expand_to() {
        // A 1 MiB scalar and 100 aliases: ~100 MiB expanded from ~1 MiB of text.
        let doc = format!(
            "a: &x {}\nb: [{}]\n",
            "y".repeat(1 << 20),
            vec!["*x"; 100].join(", ")
        );
        let mut budget = 64 << 20;
        assert_eq!(
            parse_one_within(&doc, &mut budget),
            Err(ParseError::TooLarge)
        );
        let mut budget = 256 << 20;
        assert!(parse_one_within(&doc, &mut budget).is_ok());
        assert!(budget < (256 << 20) - (100 << 20));
    }

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
