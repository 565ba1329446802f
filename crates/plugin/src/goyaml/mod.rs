//! go-yaml v2 (`go.yaml.in/yaml/v2`, what `sigs.k8s.io/yaml` reads YAML with in Argo CD),
//! reproduced: [`unmarshal`] is its `yaml.Unmarshal(in, &interface{})` — the first document,
//! composed from the parser's events, decoded with its resolution rules (YAML 1.1: `yes`/`on`,
//! `0777`, `1_000`, `!!binary`, `<<` merges), its alias checks and its errors, worded as it
//! words them (`yaml: line N: …`). The scanner and parser follow go-yaml's C-derived code
//! function for function, so that every input is accepted, refused and valued as Argo CD's
//! own code does; the differential test against that code (`tests/argo_split.rs`) checks it.

mod parser;
mod scanner;

use std::collections::{HashMap, HashSet};

use parser::{EventType, Parser};
use scanner::ErrorKind;

/// A decoded value, as Go's `interface{}` holds it.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// `nil`.
    Null,
    /// `bool`.
    Bool(bool),
    /// `int`.
    Int(i64),
    /// `uint64` (above `int`'s range).
    Uint(u64),
    /// `float64` (may be infinite or NaN).
    Float(f64),
    /// `string`: its bytes (a `!!binary` value may be any bytes).
    Str(Vec<u8>),
    /// `[]interface{}`.
    Seq(Vec<Value>),
    /// `map[interface{}]interface{}`: each key once (Go's `==`), in the order first set.
    Map(Vec<(Value, Value)>),
}

impl Value {
    /// Go's `==` on two `interface{}` map keys.
    fn same_key(&self, other: &Value) -> bool {
        match (self, other) {
            (Value::Null, Value::Null) => true,
            (Value::Bool(a), Value::Bool(b)) => a == b,
            (Value::Int(a), Value::Int(b)) => a == b,
            (Value::Uint(a), Value::Uint(b)) => a == b,
            (Value::Float(a), Value::Float(b)) => a == b,
            (Value::Str(a), Value::Str(b)) => a == b,
            _ => false,
        }
    }
}

fn map_set(m: &mut Vec<(Value, Value)>, k: Value, v: Value) {
    match m.iter_mut().find(|(x, _)| x.same_key(&k)) {
        Some(slot) => slot.1 = v,
        None => m.push((k, v)),
    }
}

/// Why a document could not be read: go-yaml's error text (`yaml: …`), or the expansion
/// budget (cmp-warden's own bound on what aliases expand to).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// go-yaml's error, as its `Error()` says it.
    Yaml(String),
    /// The document expands past the byte budget.
    TooLarge,
}

const STR_TAG: &[u8] = b"tag:yaml.org,2002:str";
const BOOL_TAG: &[u8] = b"tag:yaml.org,2002:bool";
const INT_TAG: &[u8] = b"tag:yaml.org,2002:int";
const FLOAT_TAG: &[u8] = b"tag:yaml.org,2002:float";
const NULL_TAG: &[u8] = b"tag:yaml.org,2002:null";
const TIMESTAMP_TAG: &[u8] = b"tag:yaml.org,2002:timestamp";
const BINARY_TAG: &[u8] = b"tag:yaml.org,2002:binary";
const MERGE_TAG: &[u8] = b"tag:yaml.org,2002:merge";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Document,
    Mapping,
    Sequence,
    Scalar,
    Alias,
}

#[derive(Debug)]
struct Node {
    kind: Kind,
    tag: Vec<u8>,
    value: Vec<u8>,
    implicit: bool,
    children: Vec<usize>,
    alias: usize,
}

/// What a node costs against the budget beyond its scalar's bytes.
const NODE_COST: usize = 64;

struct Composer<'a> {
    p: Parser<'a>,
    event: Option<parser::Event>,
    nodes: Vec<Node>,
    anchors: HashMap<Vec<u8>, usize>,
}

/// go-yaml's `failf`/`fail`: the error that ends the unmarshal.
type Fail<T> = Result<T, Error>;

fn failf(msg: impl std::fmt::Display) -> Error {
    Error::Yaml(format!("yaml: {msg}"))
}

impl Composer<'_> {
    /// `parser.fail`: the parser's error as go-yaml words it.
    fn fail(&self) -> Error {
        let s = &self.p.s;
        let line = if s.problem_mark.line != 0 {
            s.problem_mark.line + usize::from(s.error == ErrorKind::Scanner)
        } else {
            s.context_mark.line
        };
        let where_ = if line != 0 {
            format!("line {line}: ")
        } else {
            String::new()
        };
        let msg = if s.problem.is_empty() {
            "unknown problem parsing YAML content"
        } else {
            &s.problem
        };
        failf(format!("{where_}{msg}"))
    }

    fn peek(&mut self) -> Fail<EventType> {
        if let Some(e) = &self.event
            && e.typ != EventType::None
        {
            return Ok(e.typ);
        }
        match self.p.parse() {
            Some(e) => {
                let t = e.typ;
                self.event = Some(e);
                Ok(t)
            }
            None => Err(self.fail()),
        }
    }

    fn expect(&mut self, want: EventType) -> Fail<parser::Event> {
        let got = self.peek()?;
        if got == EventType::StreamEnd && want != EventType::StreamEnd {
            return Err(failf(
                "attempted to go past the end of stream; corrupted value?",
            ));
        }
        if got != want {
            self.p.s.problem = format!(
                "expected {} event but got {}",
                want.go_name(),
                got.go_name()
            );
            return Err(self.fail());
        }
        Ok(self.event.take().expect("peeked"))
    }

    fn node(&mut self, kind: Kind) -> usize {
        self.nodes.push(Node {
            kind,
            tag: Vec::new(),
            value: Vec::new(),
            implicit: false,
            children: Vec::new(),
            alias: usize::MAX,
        });
        self.nodes.len() - 1
    }

    fn anchor(&mut self, n: usize, anchor: Option<Vec<u8>>) {
        if let Some(a) = anchor {
            self.anchors.insert(a, n);
        }
    }

    /// `parser.parse`: the next node (`None` at the stream's end).
    fn parse(&mut self) -> Fail<Option<usize>> {
        match self.peek()? {
            EventType::Scalar => {
                let e = self.expect(EventType::Scalar)?;
                let n = self.node(Kind::Scalar);
                self.nodes[n].value = e.value;
                self.nodes[n].tag = e.tag;
                self.nodes[n].implicit = e.implicit;
                self.anchor(n, e.anchor);
                Ok(Some(n))
            }
            EventType::Alias => {
                let e = self.expect(EventType::Alias)?;
                let name = e.anchor.unwrap_or_default();
                let Some(&target) = self.anchors.get(&name) else {
                    return Err(failf(format!(
                        "unknown anchor '{}' referenced",
                        String::from_utf8_lossy(&name)
                    )));
                };
                let n = self.node(Kind::Alias);
                self.nodes[n].value = name;
                self.nodes[n].alias = target;
                Ok(Some(n))
            }
            EventType::MappingStart | EventType::SequenceStart => {
                let start = self.peek()?;
                let (kind, end) = if start == EventType::MappingStart {
                    (Kind::Mapping, EventType::MappingEnd)
                } else {
                    (Kind::Sequence, EventType::SequenceEnd)
                };
                let n = self.node(kind);
                let anchor = self.event.as_mut().and_then(|e| e.anchor.take());
                self.anchor(n, anchor);
                self.expect(start)?;
                while self.peek()? != end {
                    let child = self.parse()?;
                    self.push_child(n, child);
                    if kind == Kind::Mapping {
                        let child = self.parse()?;
                        self.push_child(n, child);
                    }
                }
                self.expect(end)?;
                Ok(Some(n))
            }
            EventType::DocumentStart => {
                let n = self.node(Kind::Document);
                self.anchors.clear();
                self.expect(EventType::DocumentStart)?;
                let child = self.parse()?;
                self.push_child(n, child);
                self.expect(EventType::DocumentEnd)?;
                Ok(Some(n))
            }
            EventType::StreamEnd => Ok(None),
            other => Err(failf(format!(
                "attempted to parse unknown event: {}",
                other.go_name()
            ))),
        }
    }

    fn push_child(&mut self, n: usize, child: Option<usize>) {
        // go-yaml appends a nil node for a premature stream end; the decoder never meets
        // one (the parser fails first), so a missing child is left out.
        if let Some(c) = child {
            self.nodes[n].children.push(c);
        }
    }
}

/// `yaml.Unmarshal(input, &v)` with `v` an `interface{}`: the first document's value, or
/// go-yaml's error; what it expands to (aliases included) is drawn from `budget` (bytes of
/// scalars plus a per-node cost).
pub fn unmarshal(input: &[u8], budget: &mut usize) -> Result<Value, Error> {
    let input: &[u8] = if input.is_empty() { b"\n" } else { input };
    let mut c = Composer {
        p: Parser::new(input),
        event: None,
        nodes: Vec::new(),
        anchors: HashMap::new(),
    };
    c.expect(EventType::StreamStart)?;
    let Some(root) = c.parse()? else {
        return Ok(Value::Null);
    };
    let mut d = Decoder {
        nodes: &c.nodes,
        aliases: HashSet::new(),
        decode_count: 0,
        alias_count: 0,
        alias_depth: 0,
        budget,
    };
    d.unmarshal(root)
}

struct Decoder<'n, 'b> {
    nodes: &'n [Node],
    aliases: HashSet<usize>,
    decode_count: u64,
    alias_count: u64,
    alias_depth: u32,
    budget: &'b mut usize,
}

fn allowed_alias_ratio(decode_count: u64) -> f64 {
    const LOW: u64 = 400_000;
    const HIGH: u64 = 4_000_000;
    if decode_count <= LOW {
        0.99
    } else if decode_count >= HIGH {
        0.10
    } else {
        0.99 - 0.89 * ((decode_count - LOW) as f64 / (HIGH - LOW) as f64)
    }
}

impl Decoder<'_, '_> {
    fn spend(&mut self, n: usize) -> Fail<()> {
        match self.budget.checked_sub(n) {
            Some(left) => {
                *self.budget = left;
                Ok(())
            }
            None => Err(Error::TooLarge),
        }
    }

    fn unmarshal(&mut self, n: usize) -> Fail<Value> {
        self.decode_count += 1;
        if self.alias_depth > 0 {
            self.alias_count += 1;
        }
        if self.alias_count > 100
            && self.decode_count > 1000
            && self.alias_count as f64 / self.decode_count as f64
                > allowed_alias_ratio(self.decode_count)
        {
            return Err(failf("document contains excessive aliasing"));
        }
        self.spend(NODE_COST)?;
        let node = &self.nodes[n];
        match node.kind {
            Kind::Document => match node.children.as_slice() {
                [only] => self.unmarshal(*only),
                _ => Ok(Value::Null),
            },
            Kind::Alias => {
                if self.aliases.contains(&n) {
                    return Err(failf(format!(
                        "anchor '{}' value contains itself",
                        String::from_utf8_lossy(&node.value)
                    )));
                }
                self.aliases.insert(n);
                self.alias_depth += 1;
                let v = self.unmarshal(node.alias);
                self.alias_depth -= 1;
                self.aliases.remove(&n);
                v
            }
            Kind::Scalar => self.scalar(n),
            Kind::Sequence => {
                let mut items = Vec::with_capacity(node.children.len().min(1024));
                for &c in &node.children {
                    items.push(self.unmarshal(c)?);
                }
                Ok(Value::Seq(items))
            }
            Kind::Mapping => {
                let mut m = Vec::new();
                self.mapping_into(n, &mut m)?;
                Ok(Value::Map(m))
            }
        }
    }

    fn scalar(&mut self, n: usize) -> Fail<Value> {
        let node = &self.nodes[n];
        self.spend(node.value.len())?;
        if node.tag.is_empty() && !node.implicit {
            return Ok(Value::Str(node.value.clone()));
        }
        let (tag, resolved) = resolve(&node.tag, &node.value)?;
        if tag == BINARY_TAG {
            let Value::Str(text) = &resolved else {
                unreachable!("binary values resolve to their text")
            };
            return match base64_std_decode(text) {
                Some(data) => Ok(Value::Str(data)),
                None => Err(failf("!!binary value contains invalid base64 data")),
            };
        }
        if tag == TIMESTAMP_TAG {
            return Ok(Value::Str(node.value.clone()));
        }
        Ok(resolved)
    }

    /// `decoder.mapping` into a map that may already hold keys (a merge writes into its
    /// parent's).
    fn mapping_into(&mut self, n: usize, m: &mut Vec<(Value, Value)>) -> Fail<()> {
        let children = &self.nodes[n].children;
        for pair in children.chunks(2) {
            let [k, v] = pair else { break };
            if self.is_merge(*k) {
                self.merge(*v, m)?;
                continue;
            }
            let key = self.unmarshal(*k)?;
            if matches!(key, Value::Map(_) | Value::Seq(_)) {
                return Err(failf(format!(
                    "invalid map key: {}",
                    go_sharp_v(&key, true)
                )));
            }
            let value = self.unmarshal(*v)?;
            map_set(m, key, value);
        }
        Ok(())
    }

    fn is_merge(&self, n: usize) -> bool {
        let node = &self.nodes[n];
        node.kind == Kind::Scalar && node.value == b"<<" && (node.implicit || node.tag == MERGE_TAG)
    }

    /// Decoding `n` into the map `m` (go-yaml's `unmarshal(n, out)` with `out` the map).
    fn unmarshal_into(&mut self, n: usize, m: &mut Vec<(Value, Value)>) -> Fail<()> {
        self.decode_count += 1;
        if self.alias_depth > 0 {
            self.alias_count += 1;
        }
        if self.alias_count > 100
            && self.decode_count > 1000
            && self.alias_count as f64 / self.decode_count as f64
                > allowed_alias_ratio(self.decode_count)
        {
            return Err(failf("document contains excessive aliasing"));
        }
        self.spend(NODE_COST)?;
        let node = &self.nodes[n];
        match node.kind {
            Kind::Alias => {
                if self.aliases.contains(&n) {
                    return Err(failf(format!(
                        "anchor '{}' value contains itself",
                        String::from_utf8_lossy(&node.value)
                    )));
                }
                self.aliases.insert(n);
                self.alias_depth += 1;
                let r = self.unmarshal_into(node.alias, m);
                self.alias_depth -= 1;
                self.aliases.remove(&n);
                r
            }
            Kind::Mapping => self.mapping_into(n, m),
            _ => Ok(()),
        }
    }

    fn merge(&mut self, n: usize, m: &mut Vec<(Value, Value)>) -> Fail<()> {
        let want_map = || failf("map merge requires map or sequence of maps as the value");
        let node = &self.nodes[n];
        match node.kind {
            Kind::Mapping => self.unmarshal_into(n, m),
            Kind::Alias => {
                if self.nodes[node.alias].kind != Kind::Mapping {
                    return Err(want_map());
                }
                self.unmarshal_into(n, m)
            }
            Kind::Sequence => {
                for &c in node.children.iter().rev() {
                    let child = &self.nodes[c];
                    if child.kind == Kind::Alias {
                        if self.nodes[child.alias].kind != Kind::Mapping {
                            return Err(want_map());
                        }
                    } else if child.kind != Kind::Mapping {
                        return Err(want_map());
                    }
                    self.unmarshal_into(c, m)?;
                }
                Ok(())
            }
            _ => Err(want_map()),
        }
    }
}

/// `shortTag`.
fn short_tag(tag: &[u8]) -> String {
    let t = String::from_utf8_lossy(tag);
    match t.strip_prefix("tag:yaml.org,2002:") {
        Some(rest) => format!("!!{rest}"),
        None => t.into_owned(),
    }
}

/// go-yaml's `resolve(tag, in)`: the tag it resolves to and the value, or the error its
/// deferred check raises when an explicit tag does not fit.
fn resolve(tag: &[u8], input: &[u8]) -> Fail<(Vec<u8>, Value)> {
    let resolvable = tag.is_empty()
        || [
            STR_TAG,
            BOOL_TAG,
            INT_TAG,
            FLOAT_TAG,
            NULL_TAG,
            TIMESTAMP_TAG,
        ]
        .contains(&tag);
    if !resolvable {
        return Ok((tag.to_vec(), Value::Str(input.to_vec())));
    }
    let (rtag, out) = resolve_inner(tag, input);
    // The deferred check.
    if tag.is_empty() || tag == rtag || tag == STR_TAG || tag == BINARY_TAG {
        return Ok((rtag.to_vec(), out));
    }
    if tag == FLOAT_TAG
        && rtag == INT_TAG
        && let Value::Int(i) = out
    {
        return Ok((FLOAT_TAG.to_vec(), Value::Float(i as f64)));
    }
    Err(failf(format!(
        "cannot decode {} `{}` as a {}",
        short_tag(rtag),
        String::from_utf8_lossy(input),
        short_tag(tag)
    )))
}

fn resolve_inner<'t>(tag: &'t [u8], input: &[u8]) -> (&'t [u8], Value)
where
    'static: 't,
{
    let hint = match input.first() {
        None => b'N',
        Some(b'+' | b'-') => b'S',
        Some(b'0'..=b'9') => b'D',
        Some(b'y' | b'Y' | b'n' | b'N' | b't' | b'T' | b'f' | b'F' | b'o' | b'O' | b'~') => b'M',
        Some(b'.') => b'.',
        Some(_) => 0,
    };
    let text = || Value::Str(input.to_vec());
    if hint == 0 || tag == STR_TAG || tag == BINARY_TAG {
        return (STR_TAG, text());
    }
    let s = match std::str::from_utf8(input) {
        Ok(s) => s,
        Err(_) => return (STR_TAG, text()),
    };
    match s {
        "y" | "Y" | "yes" | "Yes" | "YES" | "true" | "True" | "TRUE" | "on" | "On" | "ON" => {
            return (BOOL_TAG, Value::Bool(true));
        }
        "n" | "N" | "no" | "No" | "NO" | "false" | "False" | "FALSE" | "off" | "Off" | "OFF" => {
            return (BOOL_TAG, Value::Bool(false));
        }
        "" | "~" | "null" | "Null" | "NULL" => return (NULL_TAG, Value::Null),
        ".nan" | ".NaN" | ".NAN" => return (FLOAT_TAG, Value::Float(f64::NAN)),
        ".inf" | ".Inf" | ".INF" | "+.inf" | "+.Inf" | "+.INF" => {
            return (FLOAT_TAG, Value::Float(f64::INFINITY));
        }
        "-.inf" | "-.Inf" | "-.INF" => return (FLOAT_TAG, Value::Float(f64::NEG_INFINITY)),
        "<<" => return (MERGE_TAG, text()),
        _ => {}
    }
    match hint {
        b'.' => {
            if let Some(f) = crate::gonum::parse_float(s) {
                return (FLOAT_TAG, Value::Float(f));
            }
        }
        b'D' | b'S' => {
            if (tag.is_empty() || tag == TIMESTAMP_TAG) && crate::gonum::is_timestamp(s) {
                return (TIMESTAMP_TAG, text());
            }
            let plain = s.replace('_', "");
            if let Some(i) = crate::gonum::parse_int(&plain, 0) {
                return (INT_TAG, Value::Int(i));
            }
            if let Some(u) = crate::gonum::parse_uint(&plain, 0) {
                return (INT_TAG, Value::Uint(u));
            }
            if crate::gonum::is_yaml_style_float(&plain)
                && let Some(f) = crate::gonum::parse_float(&plain)
            {
                return (FLOAT_TAG, Value::Float(f));
            }
            if let Some(rest) = plain.strip_prefix("0b") {
                if let Some(i) = crate::gonum::parse_int(rest, 2) {
                    return (INT_TAG, Value::Int(i));
                }
                if let Some(u) = crate::gonum::parse_uint(rest, 2) {
                    return (INT_TAG, Value::Uint(u));
                }
            } else if let Some(rest) = plain.strip_prefix("-0b")
                && let Some(i) = crate::gonum::parse_int(&format!("-{rest}"), 2)
            {
                return (INT_TAG, Value::Int(i));
            }
        }
        _ => {}
    }
    (STR_TAG, text())
}

/// Go's `base64.StdEncoding.DecodeString`: padded standard alphabet, `\r` and `\n` skipped.
fn base64_std_decode(text: &[u8]) -> Option<Vec<u8>> {
    let val = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => u32::from(c - b'A'),
            b'a'..=b'z' => u32::from(c - b'a') + 26,
            b'0'..=b'9' => u32::from(c - b'0') + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        })
    };
    let chars: Vec<u8> = text
        .iter()
        .copied()
        .filter(|c| *c != b'\r' && *c != b'\n')
        .collect();
    if !chars.len().is_multiple_of(4) {
        return None;
    }
    let mut out = Vec::with_capacity(chars.len() / 4 * 3);
    for (i, q) in chars.chunks(4).enumerate() {
        let last = i == chars.len() / 4 - 1;
        let pad = q.iter().rev().take_while(|c| **c == b'=').count();
        if pad > 2 || (pad > 0 && !last) {
            return None;
        }
        let mut n = 0u32;
        for (j, &c) in q.iter().enumerate() {
            let v = if j >= 4 - pad { 0 } else { val(c)? };
            n = (n << 6) | v;
        }
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        // Go requires the bits a padded quantum leaves unused to be zero (strict: no; the
        // standard encoding is not strict, so they are ignored).
        out.extend_from_slice(&bytes[..3 - pad]);
    }
    Some(out)
}

/// Go's `%#v` of a decoded value (`%+#v` prints the same for these types). `top`: the value
/// itself rather than an element of an `[]interface{}` (where `nil` prints as
/// `interface {}(nil)`).
pub fn go_sharp_v(v: &Value, top: bool) -> String {
    match v {
        Value::Null if top => "<nil>".to_owned(),
        Value::Null => "interface {}(nil)".to_owned(),
        Value::Bool(b) => b.to_string(),
        Value::Int(i) => i.to_string(),
        Value::Uint(u) => format!("0x{u:x}"),
        Value::Float(f) => crate::gonum::format_g(*f, 64),
        Value::Str(s) => crate::gonum::quote(s),
        Value::Seq(items) => format!(
            "[]interface {{}}{{{}}}",
            items
                .iter()
                .map(|i| go_sharp_v(i, false))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Value::Map(pairs) => {
            // fmt prints a map's keys sorted (internal/fmtsort): by value within a type; nil
            // first.
            let mut sorted: Vec<&(Value, Value)> = pairs.iter().collect();
            sorted.sort_by(|(a, _), (b, _)| fmtsort(a, b));
            let shown: Vec<(String, String)> = sorted
                .iter()
                .map(|(k, v)| (go_sharp_v(k, false), go_sharp_v(v, false)))
                .collect();
            format!(
                "map[interface {{}}]interface {{}}{{{}}}",
                shown
                    .iter()
                    .map(|(k, v)| format!("{k}:{v}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        }
    }
}

/// `internal/fmtsort`'s order of two map keys.
fn fmtsort(a: &Value, b: &Value) -> std::cmp::Ordering {
    use std::cmp::Ordering;
    // Keys of different types: by their type descriptors' addresses in the Go binary; this is
    // the order Argo CD v3.5.7 built with Go 1.26 prints (the differential test checks it).
    let rank = |v: &Value| match v {
        Value::Null => 0,
        Value::Str(_) => 1,
        Value::Uint(_) => 2,
        Value::Int(_) => 3,
        Value::Float(_) => 4,
        Value::Bool(_) => 5,
        Value::Seq(_) => 6,
        Value::Map(_) => 7,
    };
    match (a, b) {
        (Value::Bool(x), Value::Bool(y)) => x.cmp(y),
        (Value::Int(x), Value::Int(y)) => x.cmp(y),
        (Value::Uint(x), Value::Uint(y)) => x.cmp(y),
        // NaN sorts before every other float.
        (Value::Float(x), Value::Float(y)) => match (x.is_nan(), y.is_nan()) {
            (true, true) => Ordering::Equal,
            (true, false) => Ordering::Less,
            (false, true) => Ordering::Greater,
            _ => x.partial_cmp(y).unwrap_or(Ordering::Equal),
        },
        (Value::Str(x), Value::Str(y)) => x.cmp(y),
        _ => rank(a).cmp(&rank(b)),
    }
}
