//! What the jail is asked to do ([`Task`]: crosses the pipe unchanged, inside the header frame),
//! and the generator's output as the jail and the server read it. The request's vocabulary
//! (operation, outcome, error) is `vocab::request`.

use std::time::Duration;

use plugin::PluginConfig;
use serde::{Deserialize, Serialize};
use vocab::request::{Operation, TimeLimit};

/// What the jail needs to run one request besides its archive bytes and its clock; built by
/// `supervisor::Plan::task` and sent to the jail as it is.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Task {
    /// Which RPC.
    pub op: Operation,
    /// The plugin.
    pub config: PluginConfig,
    /// `metadata.appRelPath`.
    pub app_rel_path: String,
    /// Environment for commands (the policy's server variables, then the request's).
    pub env: Vec<(String, String)>,
    /// Archive limits; `preserve_file_mode` comes from the plugin config.
    pub archive: archive::Options,
    /// Budget for each command's stdout and stderr.
    pub output_bytes: u64,
    /// The most a reply may carry (the gRPC message limit): generate's manifests, YAML
    /// aliases expanded, must fit in it.
    pub reply_bytes: u64,
    /// Which limit the request's deadline comes from (named in the error when it fires).
    pub deadline_limit: TimeLimit,
    /// Per-command limit (`ARGOCD_EXEC_TIMEOUT`) and its configured text.
    pub command_timeout: Option<(Duration, String)>,
    /// The SHA-256 the client claims for the archive (`metadata.checksum`): it only chooses
    /// a cached tree; the bytes are verified as they arrive all the same.
    #[serde(default)]
    pub archive_sha256: Option<String>,
    /// The archive's size the client states (`metadata.size`, bytes of the `.tar.gz`): it
    /// only decides whether the archive is worth caching.
    #[serde(default)]
    pub archive_size: Option<u64>,
}

/// The generator command's stdout: a JSON array whose elements are all objects, re-encoded
/// compactly (an empty output means no parameters). Also the format of a generator's static
/// file source. The error reads `generator output is not a JSON array of objects: …`.
pub fn parse_generated(out: &str) -> Result<String, String> {
    generated(out).map_err(|e| format!("generator output is not a JSON array of objects: {e}"))
}

fn generated(out: &str) -> Result<String, String> {
    if out.trim().is_empty() {
        return Ok("[]".into());
    }
    let v: serde_json::Value = serde_json::from_str(out).map_err(|e| {
        let head: String = out.chars().take(200).collect();
        format!("{e} (output starts: {head:?})")
    })?;
    match &v {
        serde_json::Value::Array(items) => {
            if let Some(i) = items.iter().position(|x| !x.is_object()) {
                return Err(format!("element {i} is not an object"));
            }
        }
        other => {
            return Err(format!(
                "got a JSON {}",
                match other {
                    serde_json::Value::Object(_) => "object",
                    serde_json::Value::String(_) => "string",
                    serde_json::Value::Number(_) => "number",
                    serde_json::Value::Bool(_) => "boolean",
                    _ => "null",
                }
            ));
        }
    }
    Ok(v.to_string())
}
