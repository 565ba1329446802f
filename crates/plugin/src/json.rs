//! JSON values and Go `encoding/json` output: keys sorted, `<`, `>`, `&`, U+2028/9 escaped,
//! floats formatted as Go does. This is what `sigs.k8s.io/yaml.YAMLToJSON` produces, so manifests
//! we return are byte-identical to Argo CD's.

use std::collections::BTreeMap;
use std::fmt::Write;

use crate::yaml::Node;

/// A JSON value with Go's number distinctions.
#[derive(Debug, Clone, PartialEq)]
pub enum Json {
    /// null
    Null,
    /// true/false
    Bool(bool),
    /// integer
    Int(i64),
    /// integer above i64::MAX
    Uint(u64),
    /// float
    Float(f64),
    /// string
    Str(String),
    /// array
    Arr(Vec<Json>),
    /// object, sorted by key as Go marshals maps
    Obj(BTreeMap<String, Json>),
}

/// A YAML value JSON cannot hold.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct ConvertError(pub String);

impl Json {
    /// Convert a YAML tree as `sigs.k8s.io/yaml` does (keys stringified, later duplicates win).
    pub fn from_yaml(n: &Node) -> Result<Json, ConvertError> {
        Ok(match n {
            Node::Null => Json::Null,
            Node::Bool(b) => Json::Bool(*b),
            Node::Int(i) => Json::Int(*i),
            Node::Uint(u) => Json::Uint(*u),
            Node::Float(f) => {
                if !f.is_finite() {
                    return Err(ConvertError(format!(
                        "json: unsupported value: {}",
                        go_float_name(*f)
                    )));
                }
                Json::Float(*f)
            }
            Node::Str(s) => Json::Str(s.clone()),
            Node::Seq(v) => Json::Arr(v.iter().map(Json::from_yaml).collect::<Result<_, _>>()?),
            Node::Map(pairs) => {
                let mut m = BTreeMap::new();
                for (k, v) in pairs {
                    m.insert(key_string(k)?, Json::from_yaml(v)?);
                }
                Json::Obj(m)
            }
        })
    }

    /// Compact Go-style encoding.
    pub fn to_go_string(&self) -> String {
        let mut s = String::new();
        self.write(&mut s);
        s
    }

    fn write(&self, out: &mut String) {
        match self {
            Json::Null => out.push_str("null"),
            Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Json::Int(i) => {
                let _ = write!(out, "{i}");
            }
            Json::Uint(u) => {
                let _ = write!(out, "{u}");
            }
            Json::Float(f) => out.push_str(&go_json_float(*f)),
            Json::Str(s) => go_quote_json(s, out),
            Json::Arr(v) => {
                out.push('[');
                for (i, x) in v.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    x.write(out);
                }
                out.push(']');
            }
            Json::Obj(m) => {
                out.push('{');
                for (i, (k, v)) in m.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    go_quote_json(k, out);
                    out.push(':');
                    v.write(out);
                }
                out.push('}');
            }
        }
    }
}

fn go_float_name(f: f64) -> &'static str {
    if f.is_nan() {
        "NaN"
    } else if f > 0.0 {
        "+Inf"
    } else {
        "-Inf"
    }
}

/// How `sigs.k8s.io/yaml` turns a map key into a JSON key.
fn key_string(k: &Node) -> Result<String, ConvertError> {
    Ok(match k {
        Node::Str(s) => s.clone(),
        Node::Int(i) => i.to_string(),
        Node::Uint(u) => u.to_string(),
        Node::Bool(b) => b.to_string(),
        Node::Float(f) => go_format_g(*f, false),
        Node::Null => "null".to_owned(),
        _ => {
            return Err(ConvertError(
                "unsupported map key of type sequence or mapping".into(),
            ));
        }
    })
}

/// Go `encoding/json` float: 'f' shortest for 1e-6 <= |f| < 1e21, else 'e' with `e-07` → `e-7`.
pub fn go_json_float(f: f64) -> String {
    let a = f.abs();
    let sign = if f.is_sign_negative() { "-" } else { "" };
    if a == 0.0 {
        return format!("{sign}0");
    }
    let (digits, exp) = crate::gonum::shortest(f, 64);
    if (1e-6..1e21).contains(&a) {
        if exp < 0 {
            return format!("{sign}0.{}{digits}", "0".repeat((-exp - 1) as usize));
        }
        let int_len = exp as usize + 1;
        return if digits.len() <= int_len {
            format!("{sign}{digits}{}", "0".repeat(int_len - digits.len()))
        } else {
            format!("{sign}{}.{}", &digits[..int_len], &digits[int_len..])
        };
    }
    let (first, rest) = digits.split_at(1);
    let dot = if rest.is_empty() {
        String::new()
    } else {
        format!(".{rest}")
    };
    format!(
        "{sign}{first}{dot}e{}{}",
        if exp < 0 { '-' } else { '+' },
        exp.abs()
    )
}

/// Go `strconv.FormatFloat(f, 'g', -1, 32|64)`.
pub fn go_format_g(f: f64, bits32: bool) -> String {
    crate::gonum::format_g(f, if bits32 { 32 } else { 64 })
}

/// Go `encoding/json` string quoting with HTML escaping.
pub fn go_quote_json(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '<' | '>' | '&' | '\u{2028}' | '\u{2029}' => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_floats() {
        assert_eq!(go_json_float(1000.0), "1000");
        assert_eq!(go_json_float(0.1), "0.1");
        assert_eq!(go_json_float(1e21), "1e+21");
        assert_eq!(go_json_float(1e-7), "1e-7");
        assert_eq!(go_json_float(1.5e300), "1.5e+300");
        // Exactly halfway between two shortest candidates: the even one, as Go writes it.
        // (The literal is the float 1222222222222222.25, which lies exactly between the two.)
        assert_eq!(go_json_float(1_222_222_222_222_222.3), "1222222222222222.2");
        assert_eq!(go_json_float(-0.0), "-0");
        assert_eq!(go_json_float(-2.5e-7), "-2.5e-7");
        assert_eq!(go_format_g(1.0, true), "1");
        assert_eq!(go_format_g(1.1, true), "1.1");
        assert_eq!(go_format_g(123456.0, true), "123456");
        assert_eq!(go_format_g(1234567.0, true), "1.234567e+06");
        assert_eq!(go_format_g(0.0001, false), "0.0001");
        assert_eq!(go_format_g(0.00001, false), "1e-05");
        assert_eq!(go_format_g(1e6, false), "1e+06");
    }

    #[test]
    fn go_strings() {
        let mut s = String::new();
        go_quote_json("a<b>&\"\\\n\u{1b}\u{2028}é", &mut s);
        assert_eq!(s, r#""a\u003cb\u003e\u0026\"\\\n\u001b\u2028é""#);
    }
}
