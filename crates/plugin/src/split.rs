//! Splitting a generate command's stdout into one JSON string per document, exactly as Argo CD's
//! `kube.SplitYAMLToString` (apimachinery `NewYAMLOrJSONDecoder` + `sigs.k8s.io/yaml`) does:
//! a stream whose first non-space byte is `{` is read as concatenated JSON values passed through
//! verbatim; otherwise as YAML documents split on `---` lines, each converted to compact JSON.
//! Empty documents and `null` are skipped.

use crate::json::Json;
use crate::yaml;

/// Output that is not a YAML or JSON stream, or whose manifests would not fit in a reply.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SplitError {
    /// Not YAML or JSON (Argo CD's wording).
    #[error("failed to unmarshal manifest: {0}")]
    Invalid(String),
    /// The manifests (aliases expanded) exceed what one reply may carry.
    #[error(
        "the manifests expand to more than {0} bytes (YAML aliases included), more than one reply may carry (ARGOCD_GRPC_MAX_SIZE_MB)"
    )]
    TooLarge(u64),
}

/// Split `out` into manifests (at most 256 MiB of them).
pub fn split_manifests(out: &str) -> Result<Vec<String>, SplitError> {
    split_manifests_within(out, 256 << 20)
}

/// Split `out` into manifests whose JSON, all together, is at most `max_bytes`: YAML aliases
/// are charged as they expand (before anything is copied), so a small output that expands to
/// gigabytes is refused without the memory ever being spent.
pub fn split_manifests_within(out: &str, max_bytes: u64) -> Result<Vec<String>, SplitError> {
    let max = usize::try_from(max_bytes).unwrap_or(usize::MAX);
    let docs = if out.trim_start().starts_with('{') {
        match split_json(out) {
            Ok(v) => Some(v),
            // apimachinery >= 0.33 falls back to YAML when the JSON reading fails early.
            Err((0 | 1, _)) => None,
            Err((_, e)) => return Err(e),
        }
    } else {
        None
    };
    let docs = match docs {
        Some(d) => d,
        None => split_yaml(out, max)?,
    };
    if docs.iter().map(String::len).sum::<usize>() > max {
        return Err(SplitError::TooLarge(max_bytes));
    }
    Ok(docs)
}

/// Concatenated JSON values; on error, how many values were read before it.
fn split_json(out: &str) -> Result<Vec<String>, (usize, SplitError)> {
    let mut docs = Vec::new();
    let stream =
        serde_json::Deserializer::from_str(out).into_iter::<&serde_json::value::RawValue>();
    for (seen, item) in stream.enumerate() {
        let raw = item.map_err(|e| (seen, SplitError::Invalid(e.to_string())))?;
        let t = raw.get().trim();
        if !t.is_empty() && t != "null" {
            docs.push(t.to_owned());
        }
    }
    Ok(docs)
}

fn split_yaml(out: &str, max: usize) -> Result<Vec<String>, SplitError> {
    let mut docs = Vec::new();
    let mut budget = max;
    for chunk in yaml_documents(out)? {
        let node = match yaml::parse_one_within(&chunk, &mut budget) {
            Ok(n) => n,
            Err(yaml::ParseError::TooLarge) => return Err(SplitError::TooLarge(max as u64)),
            Err(yaml::ParseError::Yaml(e)) => {
                return Err(SplitError::Invalid(format!(
                    "error converting YAML to JSON: {e}"
                )));
            }
        };
        let Some(node) = node else { continue };
        let json = Json::from_yaml(&node)
            .map_err(|e| SplitError::Invalid(format!("error converting YAML to JSON: {e}")))?;
        let s = json.to_go_string();
        if s != "null" && !s.is_empty() {
            docs.push(s);
        }
    }
    Ok(docs)
}

/// apimachinery's `YAMLReader`: a line starting with `---` ends a document; only whitespace or a
/// `#` comment may follow the marker.
fn yaml_documents(out: &str) -> Result<Vec<String>, SplitError> {
    let mut docs = Vec::new();
    let mut buf = String::new();
    for line in out.split_inclusive('\n') {
        if let Some(rest) = line.strip_prefix("---") {
            let trimmed = rest.trim();
            if !trimmed.is_empty() && !trimmed.starts_with('#') {
                return Err(SplitError::Invalid(format!(
                    "invalid Yaml document separator: {trimmed}"
                )));
            }
            if !buf.is_empty() {
                docs.push(std::mem::take(&mut buf));
            }
            continue;
        }
        buf.push_str(line);
    }
    if !buf.is_empty() {
        docs.push(buf);
    }
    Ok(docs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argo_kustomize_example() {
        let out = "apiVersion: v1\ndata:\n  foo: bar\nkind: ConfigMap\nmetadata:\n  name: my-map\n";
        assert_eq!(
            split_manifests(out).unwrap(),
            [
                r#"{"apiVersion":"v1","data":{"foo":"bar"},"kind":"ConfigMap","metadata":{"name":"my-map"}}"#
            ]
        );
    }

    #[test]
    fn documents_and_separators() {
        let out = "---\na: 1\n--- # comment\n# only a comment\n---\n\n---\nb: <x>\n...\n";
        assert_eq!(
            split_manifests(out).unwrap(),
            [r#"{"a":1}"#, r#"{"b":"\u003cx\u003e"}"#]
        );
        assert!(
            split_manifests("a: 1\n--- b\n")
                .unwrap_err()
                .to_string()
                .contains("invalid Yaml document separator: b")
        );
        assert!(split_manifests("invalid yaml: }").is_err());
        assert_eq!(split_manifests("").unwrap(), Vec::<String>::new());
        assert_eq!(
            split_manifests("null\n---\n~\n").unwrap(),
            Vec::<String>::new()
        );
    }

    #[test]
    fn json_streams_pass_through() {
        let out = "{\"kind\": \"A\",  \"z\":1}\n{\"kind\":\"B\"}\nnull\n";
        assert_eq!(
            split_manifests(out).unwrap(),
            [r#"{"kind": "A",  "z":1}"#, r#"{"kind":"B"}"#]
        );
        // Raw values are not range-checked, as with Go's json.Decoder into RawExtension
        // (found by the `split` fuzz target; the repo-server is the one that rejects it).
        assert_eq!(
            split_manifests("{}7777777770e777").unwrap(),
            ["{}", "7777777770e777"]
        );
    }
}
