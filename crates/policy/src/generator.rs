//! The ApplicationSet plugin generator's configuration (`cmp-warden appset serve --config`):
//! where parameters come from (a command run in the jail, a static list, or a file) and the
//! HTTP limits. Our own format, so unknown fields are errors; validated once at load.

use std::path::{Path, PathBuf};

use serde::Deserialize;

pub use crate::error::API_VERSION;
use crate::error::{PolicyError, invalid};
use crate::policy::{RawQty, from_yaml, qty};
/// `kind` of a generator config.
pub const KIND: &str = "AppSetGenerator";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Raw {
    api_version: String,
    kind: String,
    metadata: RawMeta,
    spec: RawSpec,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMeta {
    name: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawSpec {
    #[serde(default)]
    command: Vec<String>,
    #[serde(default)]
    args: Vec<String>,
    #[serde(rename = "static")]
    static_: Option<Vec<serde_json::Map<String, serde_json::Value>>>,
    file: Option<String>,
    data_dir: Option<String>,
    #[serde(default)]
    limits: RawLimits,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawLimits {
    body_bytes: Option<RawQty>,
    timeout_seconds: Option<u64>,
    concurrency: Option<usize>,
}

/// Where a request's parameters come from.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    /// Run this argv in the jail; the request body on stdin, a JSON array of objects on stdout.
    Command(Vec<String>),
    /// Always answer this list.
    Static(Vec<serde_json::Map<String, serde_json::Value>>),
    /// Read this JSON or YAML file (an array of objects) on every request.
    File(PathBuf),
}

/// A validated generator config.
#[derive(Debug, Clone, PartialEq)]
pub struct GeneratorConfig {
    /// `metadata.name` (logs, audit).
    pub name: String,
    /// Where parameters come from.
    pub source: Source,
    /// A directory packed into each command request's tree (read by the command), if any.
    pub data_dir: Option<PathBuf>,
    /// Largest request body accepted (413 beyond).
    pub body_bytes: u64,
    /// Whole-request limit: reading the body, waiting for a slot, running the command.
    pub timeout_seconds: u64,
    /// Requests served at once; more wait for a slot until their timeout (then 503).
    pub concurrency: usize,
}

/// Defaults: 1 MiB bodies, 30 s (the ApplicationSet controller's own default timeout), 16 at once.
pub const DEFAULT_BODY_BYTES: u64 = 1 << 20;
/// See [`DEFAULT_BODY_BYTES`].
pub const DEFAULT_TIMEOUT_SECONDS: u64 = 30;
/// See [`DEFAULT_BODY_BYTES`].
pub const DEFAULT_CONCURRENCY: usize = 16;

impl GeneratorConfig {
    /// Read and validate a config file; relative paths in it are resolved against its directory.
    pub fn load(path: &Path) -> Result<Self, PolicyError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| PolicyError::Parse(format!("cannot read {}: {e}", path.display())))?;
        Self::parse(&text, path.parent().unwrap_or(Path::new(".")))
    }

    /// Parse and validate config text; errors name the field and its line.
    pub fn parse(text: &str, dir: &Path) -> Result<Self, PolicyError> {
        Self::parse_unlocated(text, dir).map_err(|e| e.located(text))
    }

    fn parse_unlocated(text: &str, dir: &Path) -> Result<Self, PolicyError> {
        let raw: Raw = from_yaml(text, "generator config: ")?;
        if raw.api_version != API_VERSION {
            return Err(invalid(
                "apiVersion",
                format!("must be {API_VERSION}, got {:?}", raw.api_version),
            ));
        }
        if raw.kind != KIND {
            return Err(invalid(
                "kind",
                format!("must be {KIND}, got {:?}", raw.kind),
            ));
        }
        if raw.metadata.name.is_empty() {
            return Err(invalid("metadata.name", "must not be empty"));
        }
        let s = raw.spec;
        let resolve = |p: &str| {
            let p = Path::new(p);
            if p.is_absolute() {
                p.to_path_buf()
            } else {
                dir.join(p)
            }
        };
        let mut argv = s.command.clone();
        argv.extend(s.args.iter().cloned());
        let sources = [!s.command.is_empty(), s.static_.is_some(), s.file.is_some()];
        if sources.iter().filter(|x| **x).count() != 1 {
            return Err(invalid(
                "spec",
                "exactly one of command, static or file must be given",
            ));
        }
        if !s.args.is_empty() && s.command.is_empty() {
            return Err(invalid("spec.args", "needs spec.command"));
        }
        let source = if let Some(list) = s.static_ {
            Source::Static(list)
        } else if let Some(f) = &s.file {
            Source::File(resolve(f))
        } else {
            Source::Command(argv)
        };
        let data_dir = s.data_dir.as_deref().map(resolve);
        if data_dir.is_some() && !matches!(source, Source::Command(_)) {
            return Err(invalid(
                "spec.dataDir",
                "only a command reads a data directory",
            ));
        }
        if let Some(d) = &data_dir
            && !d.is_dir()
        {
            return Err(invalid(
                "spec.dataDir",
                format!("{} is not a directory", d.display()),
            ));
        }
        let body_bytes = match &s.limits.body_bytes {
            Some(q) => qty(q, "spec.limits.bodyBytes", 1024)?,
            None => DEFAULT_BODY_BYTES,
        };
        let timeout_seconds = s.limits.timeout_seconds.unwrap_or(DEFAULT_TIMEOUT_SECONDS);
        if !(1..=3600).contains(&timeout_seconds) {
            return Err(invalid("spec.limits.timeoutSeconds", "must be 1..=3600"));
        }
        let concurrency = s.limits.concurrency.unwrap_or(DEFAULT_CONCURRENCY);
        if !(1..=1024).contains(&concurrency) {
            return Err(invalid("spec.limits.concurrency", "must be 1..=1024"));
        }
        Ok(Self {
            name: raw.metadata.name,
            source,
            data_dir,
            body_bytes,
            timeout_seconds,
            concurrency,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(spec: &str) -> Result<GeneratorConfig, PolicyError> {
        GeneratorConfig::parse(
            &format!(
                "apiVersion: cmp-warden.io/v1alpha1\nkind: AppSetGenerator\nmetadata: {{name: g}}\nspec:\n{spec}"
            ),
            Path::new("/cfg"),
        )
    }

    #[test]
    fn command_static_and_file_sources() {
        let c = parse("  command: [sh, -c]\n  args: ['cat']\n").expect("command");
        assert_eq!(
            c.source,
            Source::Command(vec!["sh".into(), "-c".into(), "cat".into()])
        );
        assert_eq!(
            (c.body_bytes, c.timeout_seconds, c.concurrency),
            (1 << 20, 30, 16)
        );
        let c = parse("  static: [{env: dev}, {env: prod}]\n  limits: {bodyBytes: 64Ki, timeoutSeconds: 5, concurrency: 4}\n")
            .expect("static");
        assert!(matches!(c.source, Source::Static(ref l) if l.len() == 2));
        assert_eq!(
            (c.body_bytes, c.timeout_seconds, c.concurrency),
            (65536, 5, 4)
        );
        let c = parse("  file: params.yaml\n").expect("file");
        assert_eq!(c.source, Source::File(PathBuf::from("/cfg/params.yaml")));
    }

    #[test]
    fn refuses_ambiguous_unknown_or_out_of_range() {
        for bad in [
            "  command: [x]\n  static: []\n",
            "  {}\n",
            "  command: [x]\n  commandd: [y]\n",
            "  static: []\n  dataDir: /tmp\n",
            "  command: [x]\n  limits: {concurrency: 0}\n",
            "  command: [x]\n  limits: {timeoutSeconds: 0}\n",
            "  command: [x]\n  limits: {bodyBytes: 10}\n",
            "  args: [x]\n  static: []\n",
        ] {
            assert!(parse(bad).is_err(), "accepted: {bad}");
        }
    }
}
