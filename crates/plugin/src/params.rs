//! Parameters announcements: a dynamic command's JSON output then the static list.

use crate::config::ParameterAnnouncement;
use crate::json::Json;

/// Why dynamic parameter output was refused (Argo's wording).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("error unmarshaling dynamic parameter output into ParametersAnnouncementResponse: {0}")]
pub struct ParamsError(pub String);

/// Parse a dynamic command's stdout (one trailing newline already trimmed) as Go
/// `json.Unmarshal` into `[]ParameterAnnouncement` would: `null` is empty, empty input is
/// `unexpected end of JSON input`, keys case-insensitive, unknown keys ignored.
pub fn parse_dynamic(out: &str) -> Result<Vec<ParameterAnnouncement>, ParamsError> {
    if out.trim().is_empty() {
        return Err(ParamsError("unexpected end of JSON input".into()));
    }
    let v: serde_json::Value = serde_json::from_str(out).map_err(|e| {
        // Go's encoding/json says this for any truncated input (Argo's test expects it).
        ParamsError(if e.is_eof() {
            "unexpected end of JSON input".to_owned()
        } else {
            go_json_syntax_error(out, &e)
        })
    })?;
    let items = match v {
        serde_json::Value::Null => return Ok(Vec::new()),
        serde_json::Value::Array(items) => items,
        other => {
            return Err(ParamsError(format!(
                "json: cannot unmarshal {} into Go value of type []*apiclient.ParameterAnnouncement",
                kind(&other)
            )));
        }
    };
    items.iter().map(announcement).collect()
}

/// A syntax error worded as Go's `encoding/json` words it: `invalid character 'x' <where>`,
/// the character being the one the parser stopped at (serde_json's position).
pub fn go_json_syntax_error(input: &str, e: &serde_json::Error) -> String {
    let msg = e.to_string();
    let place = [
        ("expected value", "looking for beginning of value"),
        ("expected `,` or `]`", "after array element"),
        ("expected `,` or `}`", "after object key:value pair"),
        ("expected `:`", "after object key"),
        (
            "key must be a string",
            "looking for beginning of object key string",
        ),
        ("trailing characters", "after top-level value"),
        ("invalid escape", "in string escape code"),
        ("control character", "in string literal"),
        ("invalid number", "in numeric literal"),
    ]
    .iter()
    .find(|(serde, _)| msg.starts_with(serde))
    .map(|(_, go)| *go);
    let Some(place) = place else { return msg };
    let at = input
        .split_inclusive('\n')
        .nth(e.line().saturating_sub(1))
        .and_then(|l| {
            let col = e.column().saturating_sub(1);
            l.get(col..).and_then(|r| r.chars().next())
        });
    match at {
        Some(c) => format!("invalid character {} {place}", go_quote_char(c)),
        None => msg,
    }
}

/// Go's `quoteChar`: `'\''` and `'"'` as themselves, the rest as `strconv.Quote` with single quotes.
fn go_quote_char(c: char) -> String {
    match c {
        '\'' => r"'\''".to_owned(),
        '"' => "'\"'".to_owned(),
        _ => {
            let q = format!("{:?}", c.to_string());
            format!("'{}'", &q[1..q.len() - 1])
        }
    }
}

fn kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "bool",
        serde_json::Value::Number(_) => "number",
        serde_json::Value::String(_) => "string",
        serde_json::Value::Array(_) => "array",
        serde_json::Value::Object(_) => "object",
    }
}

fn field<'a>(
    m: &'a serde_json::Map<String, serde_json::Value>,
    name: &str,
) -> Option<&'a serde_json::Value> {
    // Go: the last key in document order that matches (exact or case-insensitive) wins; serde's
    // map is sorted, so prefer the exact key when both exist.
    m.get(name).or_else(|| {
        m.iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v)
            .next_back()
    })
}

fn s(v: Option<&serde_json::Value>, what: &str) -> Result<String, ParamsError> {
    match v {
        None | Some(serde_json::Value::Null) => Ok(String::new()),
        Some(serde_json::Value::String(s)) => Ok(s.clone()),
        Some(o) => Err(ParamsError(format!(
            "json: cannot unmarshal {} into Go struct field ParameterAnnouncement.{what} of type string",
            kind(o)
        ))),
    }
}

fn announcement(v: &serde_json::Value) -> Result<ParameterAnnouncement, ParamsError> {
    let m = match v {
        serde_json::Value::Null => return Ok(ParameterAnnouncement::default()),
        serde_json::Value::Object(m) => m,
        o => {
            return Err(ParamsError(format!(
                "json: cannot unmarshal {} into Go value of type apiclient.ParameterAnnouncement",
                kind(o)
            )));
        }
    };
    let mut a = ParameterAnnouncement {
        name: s(field(m, "name"), "name")?,
        title: s(field(m, "title"), "title")?,
        tooltip: s(field(m, "tooltip"), "tooltip")?,
        item_type: s(field(m, "itemType"), "itemType")?,
        collection_type: s(field(m, "collectionType"), "collectionType")?,
        string: s(field(m, "string"), "string")?,
        ..Default::default()
    };
    match field(m, "required") {
        None | Some(serde_json::Value::Null) => {}
        Some(serde_json::Value::Bool(b)) => a.required = *b,
        Some(o) => {
            return Err(ParamsError(format!(
                "json: cannot unmarshal {} into Go struct field ParameterAnnouncement.required of type bool",
                kind(o)
            )));
        }
    }
    match field(m, "array") {
        None | Some(serde_json::Value::Null) => {}
        Some(serde_json::Value::Array(items)) => {
            a.array = items
                .iter()
                .map(|i| s(Some(i), "array"))
                .collect::<Result<_, _>>()?;
        }
        Some(o) => {
            return Err(ParamsError(format!(
                "json: cannot unmarshal {} into Go struct field ParameterAnnouncement.array of type []string",
                kind(o)
            )));
        }
    }
    match field(m, "map") {
        None | Some(serde_json::Value::Null) => {}
        Some(serde_json::Value::Object(mm)) => {
            for (k, v) in mm {
                a.map.insert(k.clone(), s(Some(v), "map")?);
            }
        }
        Some(o) => {
            return Err(ParamsError(format!(
                "json: cannot unmarshal {} into Go struct field ParameterAnnouncement.map of type map[string]string",
                kind(o)
            )));
        }
    }
    let _ = Json::Null;
    Ok(a)
}

/// Dynamic first, then static, no de-duplication (Argo's order).
pub fn announce(
    dynamic: Vec<ParameterAnnouncement>,
    static_: &[ParameterAnnouncement],
) -> Vec<ParameterAnnouncement> {
    let mut all = dynamic;
    all.extend_from_slice(static_);
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syntax_errors_read_as_gos_encoding_json_words_them() {
        let e = |t: &str| parse_dynamic(t).expect_err("invalid").0;
        assert_eq!(
            e("x"),
            "invalid character 'x' looking for beginning of value"
        );
        assert_eq!(e("[1 2]"), "invalid character '2' after array element");
        assert_eq!(e(r#"[{"a" 1}]"#), "invalid character '1' after object key");
        assert_eq!(
            e("[{1:2}]"),
            "invalid character '1' looking for beginning of object key string"
        );
        assert_eq!(e("[] x"), "invalid character 'x' after top-level value");
        assert_eq!(
            e(r#"[{"a":"1" "b":"2"}]"#),
            "invalid character '\"' after object key:value pair"
        );
        assert_eq!(
            e("[\n  1,\n  ?]"),
            "invalid character '?' looking for beginning of value"
        );
        assert_eq!(e("[1"), "unexpected end of JSON input");
    }

    #[test]
    fn dynamic_output() {
        assert_eq!(
            parse_dynamic("").unwrap_err().0,
            "unexpected end of JSON input"
        );
        assert_eq!(
            parse_dynamic("[").unwrap_err().0,
            "unexpected end of JSON input"
        );
        assert!(parse_dynamic("null").unwrap().is_empty());
        let v = parse_dynamic(
            r#"[{"name":"a","String":"x","Required":true,"unknown":1,"map":{"k":"v"}}]"#,
        )
        .unwrap();
        assert_eq!(v[0].name, "a");
        assert_eq!(v[0].string, "x");
        assert!(v[0].required);
        assert_eq!(v[0].map["k"], "v");
    }
}
