//! The audit event (schema `cmp-warden.audit/v1`, docs/audit.md): one JSON line per request,
//! the struct the server writes and every reader — `policy suggest`, the tests, tools — reads
//! back. A field renamed here breaks its readers at compile time, not at run time.

#![forbid(unsafe_code)]

use serde::{Deserialize, Serialize};
use vocab::egress::Connection;

use vocab::record::{CommandRecord, LandlockDenial, Limit, SeccompEvent, TreeCacheUse};

/// Schema identifier of an audit event.
pub const SCHEMA: &str = "cmp-warden.audit/v1";

/// The archive as received.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ArchiveInfo {
    /// SHA-256 of the compressed stream (what the client's checksum covers).
    pub sha256: Option<String>,
    /// Compressed bytes received.
    pub bytes: u64,
    /// Entries extracted.
    pub entries: Option<u64>,
    /// File bytes extracted.
    pub file_bytes: Option<u64>,
}

/// The policy in force.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyRef {
    /// `metadata.name`.
    pub name: String,
    /// SHA-256 of the policy file.
    pub sha256: String,
}

/// One request's event: what the server writes, and what a reader (tests, tools) reads back
/// through the same type. A reader takes a field an event lacks as empty (`policy suggest`
/// reads hand-trimmed logs); the server always writes every field but the optional ones.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct AuditEvent {
    /// Always `audit`: tells the event apart from log lines on a shared stream.
    pub log: String,
    /// Always [`SCHEMA`].
    pub schema: String,
    /// RFC 3339 UTC time the request ended.
    pub time: String,
    /// The request id (also in the request's log span).
    pub request_id: String,
    /// The request's OpenTelemetry trace, when it was exported.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
    /// `GenerateManifest`, `MatchRepository` or `GetParametersAnnouncement`.
    pub rpc: String,
    /// Argo CD application name.
    pub app: String,
    /// The application's Argo CD project (`ARGOCD_APP_PROJECT_NAME`, sent by Argo CD 3.0 and
    /// later with generate requests): what `spec.select` chooses by, and what `policy suggest`
    /// writes one proposal per.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    /// `appRelPath`.
    pub app_rel_path: String,
    /// Names of the request's environment variables (never values).
    pub env_names: Vec<String>,
    /// The archive.
    pub archive: ArchiveInfo,
    /// Leased UID.
    pub uid: Option<u32>,
    /// Leased GID.
    pub gid: Option<u32>,
    /// The request's cgroup.
    pub cgroup: Option<String>,
    /// Commands run, in order.
    pub commands: Vec<CommandRecord>,
    /// Peak memory of the whole request (cgroup).
    pub peak_memory_bytes: Option<u64>,
    /// OOM kills.
    pub oom_kills: Option<u64>,
    /// `ok` or `error`.
    pub outcome: String,
    /// gRPC status code name.
    pub code: String,
    /// The error as returned to the client (redacted), if any.
    pub error: Option<String>,
    /// The limit or denial that ended it.
    pub limit: Option<Limit>,
    /// Would-be seccomp denials (audit mode).
    pub seccomp_audit: Vec<SeccompEvent>,
    /// `network: allowList`: each connection through the egress proxy (destination, address,
    /// decision, reason, bytes each way, duration).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress: Vec<Connection>,
    /// Connections past the proxy's record limit (counted only).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub egress_unrecorded: u64,
    /// A failed request: what Landlock refused its commands (from the kernel's audit records,
    /// when the host enables audit), with the policy field that allows it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub landlock_denials: Vec<LandlockDenial>,
    /// A command failed while server variables were withheld: their names (never values).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub withheld_env: Vec<String>,
    /// Where the request's tree came from, when the tree cache runs: `hit`, `filled` or
    /// `uncached`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tree_cache: Option<TreeCacheUse>,
    /// Policy in force.
    pub policy: PolicyRef,
    /// Wall-clock duration.
    pub duration_ms: u64,
}

impl AuditEvent {
    /// The event on one line of a stream it shares with log lines (`"log":"audit"` tells it
    /// apart); `None` for any other line, for a reload's event ([`ReloadEvent`]), and for an
    /// event this build cannot read.
    pub fn from_line(line: &str) -> Option<Self> {
        if !line.contains("\"log\":\"audit\"") || ReloadEvent::from_line(line).is_some() {
            return None;
        }
        serde_json::from_str::<Self>(line)
            .ok()
            .filter(|e| e.log == "audit")
    }
}

/// What [`ReloadEvent::event`] always is.
pub const RELOAD: &str = "configReload";

/// One file of a configuration set, before and after a reload.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct FileChange {
    /// The file's path as the server was told it (the policy file, or the directory's entry).
    pub path: String,
    /// SHA-256 of the file in force before (`None`: it is new).
    pub old_sha256: Option<String>,
    /// SHA-256 of the file read now (`None`: it was removed).
    pub new_sha256: Option<String>,
}

/// One reload of the policies and `plugin.yaml` while serving: in the audit stream beside the
/// requests' events (`"event":"configReload"` tells it apart).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ReloadEvent {
    /// Always `audit`.
    pub log: String,
    /// Always [`SCHEMA`].
    pub schema: String,
    /// Always [`RELOAD`].
    pub event: String,
    /// RFC 3339 UTC time of the reload.
    pub time: String,
    /// What asked for it: `inotify`, `signal` (SIGHUP) or `periodic`.
    pub trigger: String,
    /// `accepted` (the new set is in force) or `refused` (the old one stays).
    pub result: String,
    /// Why it was refused, naming the file or field.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Every file of the set that changed, with its SHA-256 before and after.
    pub files: Vec<FileChange>,
    /// The policies in force after it (name and SHA-256 each, the default first).
    pub policies: Vec<PolicyRef>,
    /// SHA-256 of the `plugin.yaml` in force after it.
    pub plugin_sha256: String,
}

impl ReloadEvent {
    /// A reload's event on one line of the audit stream; `None` for any other line.
    pub fn from_line(line: &str) -> Option<Self> {
        if !line.contains(RELOAD) {
            return None;
        }
        serde_json::from_str::<Self>(line)
            .ok()
            .filter(|e| e.log == "audit" && e.event == RELOAD)
    }
}

/// The event as one JSON line, as the server writes it (without the log's own fields).
impl std::fmt::Display for AuditEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let line = serde_json::to_string(self).map_err(|_| std::fmt::Error)?;
        f.write_str(&line)
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use vocab::egress::Decision;

    /// Every field an event can hold, each with something to say (none skipped).
    fn full_event() -> AuditEvent {
        AuditEvent {
            trace_id: Some("t".into()),
            project: Some("p".into()),
            egress: vec![Connection {
                method: "CONNECT".into(),
                destination: "a:1".into(),
                address: None,
                decision: Decision::Allowed,
                reason: None,
                bytes_up: 0,
                bytes_down: 0,
                duration_ms: 0,
            }],
            egress_unrecorded: 1,
            landlock_denials: vec![LandlockDenial {
                blockers: "fs.read_file".into(),
                object: "/x".into(),
                allowed_by: None,
            }],
            withheld_env: vec!["X".into()],
            tree_cache: Some(TreeCacheUse::Hit),
            ..AuditEvent::default()
        }
    }

    /// docs/audit.md's table of the event's fields names each field of this struct once, and
    /// nothing else (mutant: a field added here and not documented, or a documented one
    /// renamed -> the sets differ).
    #[test]
    fn docs_audit_md_lists_every_field_once() {
        let json = serde_json::to_value(full_event()).expect("json");
        let mut fields: Vec<String> = json.as_object().expect("object").keys().cloned().collect();
        fields.sort();
        let doc = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/audit.md"),
        )
        .expect("docs/audit.md");
        let section = doc
            .split("\n## Audit events")
            .nth(1)
            .and_then(|s| s.split("\n## ").next())
            .expect("docs/audit.md has an `## Audit events` section");
        let mut documented: Vec<String> = section
            .lines()
            .filter(|l| l.starts_with("| `"))
            .flat_map(|l| {
                l.split('|')
                    .nth(1)
                    .unwrap_or_default()
                    .split(',')
                    .map(str::to_owned)
                    .collect::<Vec<_>>()
            })
            .map(|n| n.trim().trim_matches('`').trim_end_matches("[]").to_owned())
            .collect();
        let count = documented.len();
        documented.sort();
        documented.dedup();
        assert_eq!(
            documented.len(),
            count,
            "a field is documented twice: {documented:?}"
        );
        assert_eq!(documented, fields, "docs/audit.md's fields vs AuditEvent's");
    }

    /// A reader takes the event off a stream it shares with log lines, and nothing else.
    #[test]
    fn from_line_reads_events_only() {
        let line = serde_json::to_string(&full_event()).expect("json");
        assert!(
            line.contains("\"log\":\"\""),
            "a default event's log is empty: {line}"
        );
        let mut e = full_event();
        e.log = "audit".into();
        let line = serde_json::to_string(&e).expect("json");
        assert_eq!(AuditEvent::from_line(&line), Some(e));
        assert_eq!(
            AuditEvent::from_line(r#"{"level":"info","msg":"log:audit"}"#),
            None
        );
        assert_eq!(
            AuditEvent::from_line(r#"{"log":"audit","durationMs":"x"}"#),
            None
        );
        let trimmed = AuditEvent::from_line(r#"{"log":"audit","app":"a","durationMs":5}"#)
            .expect("a trimmed event");
        assert_eq!((trimmed.app.as_str(), trimmed.duration_ms), ("a", 5));
    }
}
