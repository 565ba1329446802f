//! Parameters announcements: a dynamic command's JSON output then the static list.

use vocab::request::ParameterAnnouncement;

/// Why dynamic parameter output was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ParamsError {
    /// Not what `json.Unmarshal` takes into `[]*apiclient.ParameterAnnouncement` (Argo's
    /// wording, its `encoding/json` error after the colon).
    #[error("error unmarshaling dynamic parameter output into ParametersAnnouncementResponse: {0}")]
    Unmarshal(String),
    /// A `null` element: Argo CD's cmp-server accepts it as a nil announcement and then
    /// panics marshalling the response; its panic handler answers `Internal` with the panic.
    #[error("runtime error: invalid memory address or nil pointer dereference")]
    NilAnnouncement,
}

/// Parse a dynamic command's stdout (one trailing newline already trimmed) as Go's
/// `json.Unmarshal` into `[]*ParameterAnnouncement` does (`encoding/json`'s syntax errors,
/// keys case-insensitive with the last winning, unknown keys ignored, type errors worded as
/// Go words them, invalid UTF-8 and lone surrogates as U+FFFD).
pub fn parse_dynamic_bytes(out: &[u8]) -> Result<Vec<ParameterAnnouncement>, ParamsError> {
    let list = crate::gojson::decode_params(out).map_err(ParamsError::Unmarshal)?;
    list.into_iter()
        .map(|a| a.ok_or(ParamsError::NilAnnouncement))
        .collect()
}

/// [`parse_dynamic_bytes`] of text.
pub fn parse_dynamic(out: &str) -> Result<Vec<ParameterAnnouncement>, ParamsError> {
    parse_dynamic_bytes(out.as_bytes())
}

/// The announcements as Go's `encoding/json` writes `[]*apiclient.ParameterAnnouncement`:
/// each field under its JSON name, empty ones left out (`omitempty`), map keys sorted.
pub fn as_go_json(list: &[ParameterAnnouncement]) -> serde_json::Value {
    use serde_json::{Map, Value};
    let items = list.iter().map(|a| {
        let mut m = Map::new();
        let mut put = |k: &str, v: &str| {
            if !v.is_empty() {
                m.insert(k.to_owned(), Value::String(v.to_owned()));
            }
        };
        put("name", &a.name);
        put("title", &a.title);
        put("tooltip", &a.tooltip);
        put("itemType", &a.item_type);
        put("collectionType", &a.collection_type);
        put("string", &a.string);
        if a.required {
            m.insert("required".into(), Value::Bool(true));
        }
        if !a.array.is_empty() {
            m.insert(
                "array".into(),
                Value::Array(a.array.iter().cloned().map(Value::String).collect()),
            );
        }
        if !a.map.is_empty() {
            m.insert(
                "map".into(),
                Value::Object(
                    a.map
                        .iter()
                        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
                        .collect(),
                ),
            );
        }
        Value::Object(m)
    });
    Value::Array(items.collect())
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
        let e = |t: &str| match parse_dynamic(t).expect_err("invalid") {
            ParamsError::Unmarshal(m) => m,
            other => panic!("{other}"),
        };
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
            parse_dynamic("").unwrap_err(),
            ParamsError::Unmarshal("unexpected end of JSON input".into())
        );
        assert_eq!(
            parse_dynamic("[").unwrap_err(),
            ParamsError::Unmarshal("unexpected end of JSON input".into())
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
