//! `plugin.yaml` (kind `ConfigManagementPlugin`) parsed exactly as Argo CD accepts it:
//! `sigs.k8s.io/yaml` YAML→JSON (scalars become strings where the field is a string: `1.0` → "1",
//! `yes` → "true"), then Go `encoding/json` into the struct (exact key first, else
//! case-insensitive; unknown keys ignored but reported as warnings; JSON `null` leaves defaults;
//! type mismatches are errors). Validation has Argo's three checks and messages.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use vocab::request::ParameterAnnouncement;

use crate::json::{Json, go_format_g};
use crate::yaml::{self, Node};

/// A command line: `command` then `args`.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Command {
    /// argv prefix.
    pub command: Vec<String>,
    /// appended arguments.
    pub args: Vec<String>,
}

impl Command {
    /// The full argv (`command ++ args`).
    pub fn argv(&self) -> Vec<String> {
        self.command.iter().chain(&self.args).cloned().collect()
    }
}

/// `spec.discover.find`: a command (embedded, so `command`/`args`) or a glob.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Find {
    /// `find.command` / `find.args`.
    pub command: Command,
    /// `find.glob` (go-zglob).
    pub glob: String,
}

/// `spec.discover`.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Discover {
    /// `fileName` (Go `filepath.Glob`).
    pub file_name: String,
    /// `find`.
    pub find: Find,
}

impl Discover {
    /// Argo's `IsDefined`: fileName, find.glob or find.command (args alone do not count).
    pub fn is_defined(&self) -> bool {
        !self.file_name.is_empty()
            || !self.find.glob.is_empty()
            || !self.find.command.command.is_empty()
    }
}

/// `spec.parameters`.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Parameters {
    /// `static`
    pub static_: Vec<ParameterAnnouncement>,
    /// `dynamic` (command printing a JSON list)
    pub dynamic: Command,
}

/// `spec`.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Spec {
    /// `version`: appended to the socket and plugin name.
    pub version: String,
    /// `init`
    pub init: Command,
    /// `generate`
    pub generate: Command,
    /// `discover`
    pub discover: Discover,
    /// `parameters`
    pub parameters: Parameters,
    /// `preserveFileMode`
    pub preserve_file_mode: bool,
    /// `provideGitCreds`
    pub provide_git_creds: bool,
}

/// A validated `plugin.yaml`.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PluginConfig {
    /// `apiVersion` (not validated, as in Argo CD)
    pub api_version: String,
    /// `kind`
    pub kind: String,
    /// `metadata.name`
    pub name: String,
    /// `spec`
    pub spec: Spec,
}

/// Why a plugin.yaml was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// File could not be read.
    #[error("error reading plugin configuration file {path}: {msg}")]
    Read {
        /// Path.
        path: String,
        /// Cause.
        msg: String,
    },
    /// YAML or type error.
    #[error("error unmarshaling plugin configuration: {0}")]
    Decode(String),
    /// Argo's validation failures (same messages).
    #[error("invalid plugin configuration file. {0}")]
    Invalid(String),
}

impl ConfigError {
    /// The same error with the YAML line of the field it names appended (`(plugin.yaml line
    /// N)`), for start-up messages; the text before it stays Argo CD's.
    pub fn located(self, text: &str) -> Self {
        let line = |msg: &str| {
            let field = msg
                .split_once("Go struct field ")
                .map(|(_, rest)| rest.split(' ').next().unwrap_or_default())
                .or_else(|| msg.split(' ').next().filter(|f| f.contains('.')))?;
            crate::locate::yaml_line(text, &crate::locate::parse_dotted(field))
        };
        match self {
            ConfigError::Decode(m) => match line(&m) {
                Some(n) => ConfigError::Decode(format!("{m} (plugin.yaml line {n})")),
                None => ConfigError::Decode(m),
            },
            ConfigError::Invalid(m) => match line(&m) {
                Some(n) => ConfigError::Invalid(format!("{m} (plugin.yaml line {n})")),
                None => ConfigError::Invalid(m),
            },
            other => other,
        }
    }
}

/// A parsed config plus the unknown keys that were ignored.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// The config.
    pub config: PluginConfig,
    /// Unknown keys, as dotted paths (warned, as Argo CD silently ignores them).
    pub unknown_keys: Vec<String>,
}

impl PluginConfig {
    /// Read `<dir>/plugin.yaml`.
    pub fn read_dir(dir: &Path) -> Result<Loaded, ConfigError> {
        let path = dir.join("plugin.yaml");
        let text = std::fs::read_to_string(&path).map_err(|e| ConfigError::Read {
            path: path.display().to_string(),
            msg: e.to_string(),
        })?;
        Self::parse(&text).map_err(|e| e.located(&text))
    }

    /// Parse and validate plugin.yaml text.
    pub fn parse(text: &str) -> Result<Loaded, ConfigError> {
        let node = yaml::parse_one(text)
            .map_err(|e| ConfigError::Decode(e.to_string()))?
            .unwrap_or(Node::Null);
        let mut d = Decoder {
            unknown: Vec::new(),
        };
        let config = d.config(&node)?;
        config.validate()?;
        Ok(Loaded {
            config,
            unknown_keys: d.unknown,
        })
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if self.name.is_empty() {
            return Err(ConfigError::Invalid(
                "metadata.name should be non-empty".into(),
            ));
        }
        if self.kind != "ConfigManagementPlugin" {
            return Err(ConfigError::Invalid(format!(
                "kind should be ConfigManagementPlugin, found {}",
                self.kind
            )));
        }
        if self.spec.generate.command.is_empty() {
            return Err(ConfigError::Invalid(
                "spec.generate command should be non-empty".into(),
            ));
        }
        Ok(())
    }

    /// `<name>` or `<name>-<version>`: the plugin name Applications use and the socket stem.
    pub fn plugin_name(&self) -> String {
        if self.spec.version.is_empty() {
            self.name.clone()
        } else {
            format!("{}-{}", self.name, self.spec.version)
        }
    }

    /// `<sockdir>/<name>[-<version>].sock`.
    pub fn socket_path(&self, sock_dir: &Path) -> PathBuf {
        sock_dir.join(format!("{}.sock", self.plugin_name()))
    }
}

struct Decoder {
    unknown: Vec<String>,
}

impl Decoder {
    /// The mapping's entries assigned to `known` field names (exact, else case-insensitive);
    /// JSON object order (sorted keys) decides which duplicate wins, as in Go.
    fn fields<'a>(
        &mut self,
        n: &'a Node,
        path: &str,
        known: &[&'static str],
    ) -> Result<Vec<(&'static str, &'a Node)>, ConfigError> {
        match n {
            Node::Null => Ok(Vec::new()),
            Node::Map(pairs) => {
                let mut keyed: BTreeMap<String, &'a Node> = BTreeMap::new();
                for (k, v) in pairs {
                    keyed.insert(key_string(k), v);
                }
                let keyed: Vec<(String, &'a Node)> = keyed.into_iter().collect();
                let mut out = Vec::new();
                for (k, v) in keyed {
                    let field = known
                        .iter()
                        .find(|f| **f == k)
                        .or_else(|| known.iter().find(|f| f.eq_ignore_ascii_case(&k)));
                    match field {
                        Some(f) => out.push((*f, v)),
                        None => self.unknown.push(if path.is_empty() {
                            k
                        } else {
                            format!("{path}.{k}")
                        }),
                    }
                }
                Ok(out)
            }
            other => Err(mismatch(other, path, "object")),
        }
    }

    fn config(&mut self, n: &Node) -> Result<PluginConfig, ConfigError> {
        let mut c = PluginConfig::default();
        for (k, v) in self.fields(n, "", &["apiVersion", "kind", "metadata", "spec"])? {
            match k {
                "apiVersion" => c.api_version = string(v, "apiVersion")?,
                "kind" => c.kind = string(v, "kind")?,
                "metadata" => {
                    for (mk, mv) in self.fields_lenient(v, "metadata", &["name"])? {
                        if mk == "name" {
                            c.name = string(mv, "metadata.name")?;
                        }
                    }
                }
                _ => c.spec = self.spec(v)?,
            }
        }
        Ok(c)
    }

    /// `metadata` is a full ObjectMeta in Go: its other fields are known, not warned about.
    fn fields_lenient<'a>(
        &mut self,
        n: &'a Node,
        path: &str,
        known: &[&'static str],
    ) -> Result<Vec<(&'static str, &'a Node)>, ConfigError> {
        let before = self.unknown.len();
        let out = self.fields(n, path, known)?;
        self.unknown.truncate(before);
        Ok(out)
    }

    fn spec(&mut self, n: &Node) -> Result<Spec, ConfigError> {
        let mut s = Spec::default();
        let known = [
            "version",
            "init",
            "generate",
            "discover",
            "parameters",
            "preserveFileMode",
            "provideGitCreds",
        ];
        for (k, v) in self.fields(n, "spec", &known)? {
            match k {
                "version" => s.version = string(v, "spec.version")?,
                "init" => s.init = self.command(v, "spec.init")?,
                "generate" => s.generate = self.command(v, "spec.generate")?,
                "discover" => {
                    for (dk, dv) in self.fields(v, "spec.discover", &["fileName", "find"])? {
                        if dk == "fileName" {
                            s.discover.file_name = string(dv, "spec.discover.fileName")?;
                        } else {
                            for (fk, fv) in
                                self.fields(dv, "spec.discover.find", &["command", "args", "glob"])?
                            {
                                match fk {
                                    "command" => {
                                        s.discover.find.command.command =
                                            strings(fv, "spec.discover.find.command")?
                                    }
                                    "args" => {
                                        s.discover.find.command.args =
                                            strings(fv, "spec.discover.find.args")?
                                    }
                                    _ => {
                                        s.discover.find.glob =
                                            string(fv, "spec.discover.find.glob")?
                                    }
                                }
                            }
                        }
                    }
                }
                "parameters" => {
                    for (pk, pv) in self.fields(v, "spec.parameters", &["static", "dynamic"])? {
                        if pk == "static" {
                            s.parameters.static_ = match pv {
                                Node::Null => Vec::new(),
                                Node::Seq(items) => items
                                    .iter()
                                    .map(|i| self.announcement(i, "spec.parameters.static"))
                                    .collect::<Result<_, _>>()?,
                                other => {
                                    return Err(mismatch(other, "spec.parameters.static", "array"));
                                }
                            };
                        } else {
                            s.parameters.dynamic = self.command(pv, "spec.parameters.dynamic")?;
                        }
                    }
                }
                "preserveFileMode" => s.preserve_file_mode = boolean(v, "spec.preserveFileMode")?,
                _ => s.provide_git_creds = boolean(v, "spec.provideGitCreds")?,
            }
        }
        Ok(s)
    }

    fn command(&mut self, n: &Node, path: &str) -> Result<Command, ConfigError> {
        let mut c = Command::default();
        for (k, v) in self.fields(n, path, &["command", "args"])? {
            if k == "command" {
                c.command = strings(v, path)?;
            } else {
                c.args = strings(v, path)?;
            }
        }
        Ok(c)
    }

    fn announcement(&mut self, n: &Node, path: &str) -> Result<ParameterAnnouncement, ConfigError> {
        let known = [
            "name",
            "title",
            "tooltip",
            "required",
            "itemType",
            "collectionType",
            "string",
            "array",
            "map",
        ];
        let mut a = ParameterAnnouncement::default();
        for (k, v) in self.fields(n, path, &known)? {
            match k {
                "name" => a.name = string(v, path)?,
                "title" => a.title = string(v, path)?,
                "tooltip" => a.tooltip = string(v, path)?,
                "required" => a.required = boolean(v, path)?,
                "itemType" => a.item_type = string(v, path)?,
                "collectionType" => a.collection_type = string(v, path)?,
                "string" => a.string = string(v, path)?,
                "array" => a.array = strings(v, path)?,
                _ => {
                    a.map = match v {
                        Node::Null => BTreeMap::new(),
                        Node::Map(pairs) => pairs
                            .iter()
                            .map(|(k, v)| Ok((key_string(k), string(v, path)?)))
                            .collect::<Result<_, ConfigError>>()?,
                        other => return Err(mismatch(other, path, "map[string]string")),
                    }
                }
            }
        }
        Ok(a)
    }
}

fn key_string(k: &Node) -> String {
    match Json::from_yaml(&Node::Map(vec![(k.clone(), Node::Null)])) {
        Ok(Json::Obj(m)) => m.into_keys().next().unwrap_or_default(),
        _ => String::new(),
    }
}

fn kind_name(n: &Node) -> &'static str {
    match n {
        Node::Null => "null",
        Node::Bool(_) => "bool",
        Node::Int(_) | Node::Uint(_) | Node::Float(_) => "number",
        Node::Str(_) => "string",
        Node::Seq(_) => "array",
        Node::Map(_) => "object",
    }
}

fn mismatch(n: &Node, path: &str, want: &str) -> ConfigError {
    ConfigError::Decode(format!(
        "json: cannot unmarshal {} into Go struct field {path} of type {want}",
        kind_name(n)
    ))
}

/// A string field: sigs.k8s.io/yaml turns YAML scalars into strings for string targets.
fn string(n: &Node, path: &str) -> Result<String, ConfigError> {
    Ok(match n {
        Node::Null => String::new(),
        Node::Str(s) => s.clone(),
        Node::Bool(b) => b.to_string(),
        Node::Int(i) => i.to_string(),
        Node::Uint(u) => u.to_string(),
        Node::Float(f) => go_format_g(*f, true),
        other => return Err(mismatch(other, path, "string")),
    })
}

fn strings(n: &Node, path: &str) -> Result<Vec<String>, ConfigError> {
    match n {
        Node::Null => Ok(Vec::new()),
        Node::Seq(items) => items.iter().map(|i| string(i, path)).collect(),
        other => Err(mismatch(other, path, "[]string")),
    }
}

fn boolean(n: &Node, path: &str) -> Result<bool, ConfigError> {
    match n {
        Node::Null => Ok(false),
        Node::Bool(b) => Ok(*b),
        other => Err(mismatch(other, path, "bool")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(s: &str) -> String {
        PluginConfig::parse(s).unwrap_err().to_string()
    }

    #[test]
    fn argo_validation_messages() {
        assert_eq!(
            err(""),
            "invalid plugin configuration file. metadata.name should be non-empty"
        );
        assert_eq!(
            err("metadata: {}\n"),
            "invalid plugin configuration file. metadata.name should be non-empty"
        );
        assert_eq!(
            err("kind: Other\nmetadata: {name: x}\n"),
            "invalid plugin configuration file. kind should be ConfigManagementPlugin, found Other"
        );
        assert_eq!(
            err("kind: ConfigManagementPlugin\nmetadata: {name: x}\nspec: {}\n"),
            "invalid plugin configuration file. spec.generate command should be non-empty"
        );
        assert!(err("kind: ConfigManagementPlugin\nmetadata: {name: x}\nspec: {generate: {command: sh -c x}}\n")
            .contains("cannot unmarshal string"));
    }

    #[test]
    fn go_json_semantics() {
        let l = PluginConfig::parse(
            "apiVersion: argoproj.io/v1alpha1\nKind: ConfigManagementPlugin\nmetadata:\n  name: cmp\n  labels: {a: b}\n\
             spec:\n  version: 1.0\n  generate:\n    command: [sh, -c, 1]\n  discovery: [x]\n  allowConcurrency: true\n\
             \x20 discover:\n    find:\n      args: [a]\n  parameters:\n    static:\n      - name: p\n        collectiontype: map\n        map: {k: 1}\n\
             \x20 preserveFileMode: yes\n",
        )
        .unwrap();
        let c = &l.config;
        assert_eq!(c.kind, "ConfigManagementPlugin");
        assert_eq!(c.spec.version, "1");
        assert_eq!(c.plugin_name(), "cmp-1");
        assert_eq!(c.spec.generate.command, ["sh", "-c", "1"]);
        assert!(!c.spec.discover.is_defined());
        assert!(c.spec.preserve_file_mode);
        assert_eq!(c.spec.parameters.static_[0].collection_type, "map");
        assert_eq!(c.spec.parameters.static_[0].map["k"], "1");
        assert_eq!(l.unknown_keys, ["spec.allowConcurrency", "spec.discovery"]);
        assert_eq!(c.socket_path(Path::new("/s")), Path::new("/s/cmp-1.sock"));
    }
}

#[cfg(test)]
mod located_tests {
    use super::*;

    #[test]
    fn start_up_errors_keep_argos_words_and_add_the_yaml_line() {
        let text = "apiVersion: argoproj.io/v1alpha1\nkind: ConfigManagementPlugin\nmetadata:\n  name: x\nspec:\n  discover:\n    find:\n      command: [1, {a: b}]\n  generate:\n    command: [sh]\n";
        let e = PluginConfig::parse(text).expect_err("a map where a string goes");
        let argo = e.to_string();
        assert!(
            argo.contains("Go struct field spec.discover.find.command of type string"),
            "{argo}"
        );
        assert_eq!(
            e.located(text).to_string(),
            format!("{argo} (plugin.yaml line 8)")
        );
        let text = "kind: ConfigManagementPlugin\nmetadata:\n  name: \"\"\nspec: {generate: {command: [sh]}}\n";
        let e = PluginConfig::parse(text).expect_err("no name");
        assert!(
            e.located(text)
                .to_string()
                .ends_with("metadata.name should be non-empty (plugin.yaml line 3)")
        );
    }
}
