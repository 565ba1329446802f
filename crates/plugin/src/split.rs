//! Splitting a generate command's stdout into manifests exactly as Argo CD's cmp-server does:
//! `kube.SplitYAMLToString`, which reads with apimachinery's `YAMLOrJSONDecoder` (4096 bytes
//! peeked to guess JSON; JSON values passed through raw by `encoding/json`'s `Decoder` until
//! one fails, then YAML from the end of the last one, with its quirks reproduced: the
//! whitespace eaten before the switch, four bytes at a time) and, for YAML, `YAMLReader`'s
//! `---` lines (CRLF read as LF, a separator followed by anything but a comment refused)
//! and `sigs.k8s.io/yaml`'s conversion of each document (go-yaml v2, then `json.Marshal`).
//! Empty documents and `null` are skipped. The Go code is the reference: the differential
//! test `tests/argo_split.rs` runs both on the same inputs.

use crate::gojson::{self, DecodeError, StreamDecoder};
use crate::goyaml;

/// Output that is not a YAML or JSON stream, or whose manifests could not be sent.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SplitError {
    /// Not YAML or JSON: `kube.SplitYAMLToString`'s error (Argo CD's wording).
    #[error("failed to unmarshal manifest: {0}")]
    Invalid(String),
    /// The manifests (aliases expanded) exceed what one reply may carry.
    #[error(
        "the manifests expand to more than {0} bytes (YAML aliases included), more than one reply may carry (ARGOCD_GRPC_MAX_SIZE_MB)"
    )]
    TooLarge(u64),
}

impl SplitError {
    /// The text Argo CD's side reports for it (`SplitYAMLToString`'s error).
    pub fn argo_text(&self) -> String {
        self.to_string()
    }
}

/// Split a generate command's stdout (one trailing newline trimmed) into manifests, as the
/// cmp-server does (at most 256 MiB of them).
pub fn split_output(out: &[u8]) -> Result<Vec<String>, SplitError> {
    split_output_within(out, 256 << 20)
}

/// [`split_output`] of text.
pub fn split_manifests(out: &str) -> Result<Vec<String>, SplitError> {
    split_output(out.as_bytes())
}

/// [`split_output_within`] of text.
pub fn split_manifests_within(out: &str, max_bytes: u64) -> Result<Vec<String>, SplitError> {
    split_output_within(out.as_bytes(), max_bytes)
}

/// How far apimachinery peeks to guess JSON.
const PEEK: usize = 4096;

/// [`split_output`], the manifests all together (aliases charged as they expand, before
/// anything is copied) at most `max_bytes`: a small output that expands to gigabytes is
/// refused without the memory ever being spent.
pub fn split_output_within(out: &[u8], max_bytes: u64) -> Result<Vec<String>, SplitError> {
    let max = usize::try_from(max_bytes).unwrap_or(usize::MAX);
    let mut budget = max;
    let mut raws: Vec<Vec<u8>> = Vec::new();
    let yaml_from = if is_json_buffer(&out[..out.len().min(PEEK)]) {
        json_values(out, &mut raws)?
    } else {
        Some(0)
    };
    if let Some(start) = yaml_from {
        yaml_documents_upto(&out[start..], &mut budget, &mut raws, None).map_err(|e| match e {
            SplitError::TooLarge(_) => SplitError::TooLarge(max_bytes),
            e => e,
        })?;
    }
    if raws.iter().map(Vec::len).sum::<usize>() > max {
        return Err(SplitError::TooLarge(max_bytes));
    }
    Ok(raws.into_iter().map(utf8).collect())
}

/// A manifest as a protobuf string must be: UTF-8. Only a JSON value passed through raw can
/// hold other bytes, and only inside its strings (Go's scanner allows them nowhere else);
/// each such byte becomes U+FFFD, which is what the repo-server's JSON reading makes of it,
/// so the object Argo CD builds is the same (Argo CD's own cmp-server sends the bytes as
/// they are, which its gogo-protobuf code does not check).
fn utf8(raw: Vec<u8>) -> String {
    match String::from_utf8(raw) {
        Ok(s) => s,
        Err(e) => crate::gonum::go_lossy(e.as_bytes()),
    }
}

fn invalid(e: impl Into<String>) -> SplitError {
    SplitError::Invalid(e.into())
}

/// Go's `unicode.IsSpace`.
fn is_unicode_space(c: char) -> bool {
    matches!(
        c,
        '\t' | '\n'
            | '\u{0b}'
            | '\u{0c}'
            | '\r'
            | ' '
            | '\u{85}'
            | '\u{a0}'
            | '\u{1680}'
            | '\u{2000}'
            ..='\u{200a}' | '\u{2028}' | '\u{2029}' | '\u{202f}' | '\u{205f}' | '\u{3000}'
    )
}

/// `IsJSONBuffer`: the first non-space (Unicode) byte is `{`.
fn is_json_buffer(b: &[u8]) -> bool {
    let mut i = 0;
    while i < b.len() {
        match crate::gonum::decode_rune(&b[i..]) {
            (Some(c), w) if is_unicode_space(c) => i += w,
            _ => break,
        }
    }
    b.get(i) == Some(&b'{')
}

/// The JSON half: values until the stream ends (`None`: all of it was JSON) or one fails;
/// then where YAML takes over, or the error.
fn json_values(out: &[u8], raws: &mut Vec<Vec<u8>>) -> Result<Option<usize>, SplitError> {
    let mut dec = StreamDecoder::new(out);
    let mut count = 0usize;
    let mut consumed = 0usize;
    loop {
        match dec.decode() {
            Ok(raw) => {
                count += 1;
                consumed = dec.input_offset();
                if !raw.is_empty() && raw != b"null" {
                    raws.push(raw.to_vec());
                }
            }
            Err(DecodeError::Eof) => return Ok(None),
            Err(e) => {
                let (plain, first) = match &e {
                    DecodeError::Syntax(s) => (
                        s.msg.clone(),
                        format!("json: offset {}: {}", s.offset, s.msg),
                    ),
                    DecodeError::UnexpectedEof | DecodeError::Eof => {
                        ("unexpected EOF".to_owned(), "unexpected EOF".to_owned())
                    }
                };
                // More than one value read: an unambiguous JSON stream.
                if count > 1 {
                    return Err(invalid(plain));
                }
                return match consume_whitespace(out, consumed) {
                    Some(start) => match first_yaml(&out[start..], &first) {
                        Ok(()) => Ok(Some(start)),
                        Err(e) => Err(e),
                    },
                    None => Err(invalid(first)),
                };
            }
        }
    }
}

/// The YAML decode in the same call as the JSON failure: its own error is not reported (the
/// JSON one is), and the document is read again by [`yaml_documents`].
fn first_yaml(rest: &[u8], json_error: &str) -> Result<(), SplitError> {
    let mut budget = usize::MAX;
    let mut scratch = Vec::new();
    match yaml_documents_upto(rest, &mut budget, &mut scratch, Some(1)) {
        Ok(()) => Ok(()),
        Err(_) => Err(invalid(json_error)),
    }
}

/// `consumeWhitespace` after a rewind to `pos`: Unicode spaces up to and including the first
/// newline, read four bytes at a time (fewer than four left is `io.EOF`: no YAML); `None`
/// when it fails.
fn consume_whitespace(out: &[u8], pos: usize) -> Option<usize> {
    let mut at = pos;
    loop {
        if out.len() - at < 4 {
            return None;
        }
        let (c, w) = crate::gonum::decode_rune(&out[at..at + 4]);
        let c = c.filter(|c| *c != '\u{fffd}')?;
        if !is_unicode_space(c) {
            return Some(at);
        }
        at += w;
        if c == '\n' {
            return Some(at);
        }
    }
}

/// `YAMLToJSONDecoder`: documents of `YAMLReader` (lines through `bufio.ReadLine`: a
/// `\r\n` read as `\n`, a last line given its `\n`), each converted to JSON as
/// `sigs.k8s.io/yaml.Unmarshal` into a `RawExtension` does; at most `limit` documents.
fn yaml_documents_upto(
    rest: &[u8],
    budget: &mut usize,
    raws: &mut Vec<Vec<u8>>,
    limit: Option<usize>,
) -> Result<(), SplitError> {
    let mut doc: Vec<u8> = Vec::new();
    let mut done = 0usize;
    let mut lines = rest.split_inclusive(|c| *c == b'\n').peekable();
    loop {
        if limit.is_some_and(|l| done >= l) {
            return Ok(());
        }
        let Some(raw_line) = lines.next() else {
            if !doc.is_empty() {
                convert(&doc, budget, raws)?;
            }
            return Ok(());
        };
        let mut line = raw_line.strip_suffix(b"\n").unwrap_or(raw_line);
        if raw_line.ends_with(b"\n") {
            line = line.strip_suffix(b"\r").unwrap_or(line);
        }
        if let Some(after) = line.strip_prefix(b"---") {
            let trimmed = trim_unicode_space(after);
            if !trimmed.is_empty() && trimmed[0] != b'#' {
                return Err(invalid(format!(
                    "invalid Yaml document separator: {}",
                    crate::gonum::go_lossy(trimmed)
                )));
            }
            if !doc.is_empty() {
                convert(&doc, budget, raws)?;
                doc.clear();
                done += 1;
                continue;
            }
            // Into an empty document, the separator line is kept (`YAMLReader` writes it):
            // go-yaml then reads its `---` itself.
        }
        doc.extend_from_slice(line);
        doc.push(b'\n');
    }
}

/// Go's `strings.TrimSpace`.
fn trim_unicode_space(b: &[u8]) -> &[u8] {
    let mut s = 0;
    while s < b.len() {
        match crate::gonum::decode_rune(&b[s..]) {
            (Some(c), w) if is_unicode_space(c) => s += w,
            _ => break,
        }
    }
    let mut e = b.len();
    while e > s {
        // Step back over one UTF-8 character.
        let mut st = e - 1;
        while st > s && b[st] & 0xC0 == 0x80 {
            st -= 1;
        }
        match crate::gonum::decode_rune(&b[st..e]) {
            (Some(c), w) if w == e - st && is_unicode_space(c) => e = st,
            _ => break,
        }
    }
    &b[s..e]
}

/// One document through `sigs.k8s.io/yaml` into a `RawExtension`.
fn convert(doc: &[u8], budget: &mut usize, raws: &mut Vec<Vec<u8>>) -> Result<(), SplitError> {
    let wrap = |e: String| invalid(format!("error converting YAML to JSON: {e}"));
    let value = match goyaml::unmarshal(doc, budget) {
        Ok(v) => v,
        Err(goyaml::Error::TooLarge) => return Err(SplitError::TooLarge(0)),
        Err(goyaml::Error::Yaml(e)) => return Err(wrap(e)),
    };
    let json = gojson::jsonable(&value).map_err(wrap)?;
    let mut bytes = Vec::new();
    gojson::marshal(&json, &mut bytes).map_err(wrap)?;
    if !bytes.is_empty() && bytes != b"null" {
        raws.push(bytes);
    }
    Ok(())
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
