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
            e.to_string()
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
