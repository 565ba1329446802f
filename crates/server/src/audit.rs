//! The audit log: one JSON line per request (schema `cmp-warden.audit/v1`, docs/audit.md) to
//! stderr beside the other logs (told apart by `"log":"audit"`) or to a file. Environment
//! values never appear (names only); error text is redacted before it is written.

use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use vocab::record::RunRecord;

use audit_event::{ArchiveInfo, AuditEvent, PolicyRef, ReloadEvent, SCHEMA};

/// Where events go.
#[derive(Debug, Clone)]
pub struct AuditSink(Arc<Sink>, Arc<Mutex<RefusalWindow>>);

/// Requests refused before authentication (a wrong token, an unknown endpoint) in the current
/// window: anyone who reaches a port can send them, so at most [`REFUSALS_AUDITED`] per
/// [`REFUSAL_WINDOW`] are audited one by one; the rest are counted and said in one warning
/// when the window turns over. (Metrics count every one.)
#[derive(Debug, Default)]
struct RefusalWindow {
    since: Option<std::time::Instant>,
    audited: u32,
    suppressed: u64,
}

/// Refusals before authentication audited one by one per window.
pub const REFUSALS_AUDITED: u32 = 50;
/// The window.
pub const REFUSAL_WINDOW: std::time::Duration = std::time::Duration::from_secs(10);

#[derive(Debug)]
enum Sink {
    Stderr,
    File(Mutex<std::fs::File>),
    /// Tests: collect in memory.
    Memory(Mutex<Vec<String>>),
}

impl Default for AuditSink {
    fn default() -> Self {
        Self::stderr()
    }
}

impl AuditSink {
    /// Standard error, interleaved with the logs.
    pub fn stderr() -> Self {
        Self(Arc::new(Sink::Stderr), Arc::default())
    }

    /// Append to `path` (created with mode 0600 if missing).
    pub fn file(path: &Path) -> std::io::Result<Self> {
        use std::os::unix::fs::OpenOptionsExt;
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(path)?;
        Ok(Self(Arc::new(Sink::File(Mutex::new(f))), Arc::default()))
    }

    /// In memory (tests).
    pub fn memory() -> Self {
        Self(Arc::new(Sink::Memory(Mutex::default())), Arc::default())
    }

    /// Events written so far (memory sink only).
    pub fn lines(&self) -> Vec<String> {
        match &*self.0 {
            Sink::Memory(v) => v.lock().unwrap_or_else(|e| e.into_inner()).clone(),
            _ => Vec::new(),
        }
    }

    /// Write the event of a request refused before authentication, within the window's
    /// budget; past it, count it (said in one warning when the window turns over).
    pub fn emit_refused(&self, event: &AuditEvent) {
        let write = {
            let mut w = self.1.lock().unwrap_or_else(|e| e.into_inner());
            if w.since.is_none_or(|t| t.elapsed() >= REFUSAL_WINDOW) {
                if w.suppressed > 0 {
                    tracing::warn!(
                        suppressed = w.suppressed,
                        window_s = REFUSAL_WINDOW.as_secs(),
                        "requests refused before authentication were not audited one by one past {REFUSALS_AUDITED} per window (counted in the metrics)"
                    );
                }
                *w = RefusalWindow {
                    since: Some(std::time::Instant::now()),
                    audited: 0,
                    suppressed: 0,
                };
            }
            if w.audited < REFUSALS_AUDITED {
                w.audited += 1;
                true
            } else {
                w.suppressed += 1;
                false
            }
        };
        if write {
            self.emit(event);
        }
    }

    /// Write one event as one line (a single write, so lines never interleave).
    pub fn emit(&self, event: &AuditEvent) {
        self.write(serde_json::to_string(event));
    }

    /// Write a reload's event, beside the requests' ([`ReloadEvent`]).
    pub fn emit_reload(&self, event: &ReloadEvent) {
        self.write(serde_json::to_string(event));
    }

    fn write(&self, line: serde_json::Result<String>) {
        let mut line = match line {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(error = %e, "audit event not serialisable");
                return;
            }
        };
        line.push('\n');
        let r = match &*self.0 {
            Sink::Stderr => std::io::stderr().lock().write_all(line.as_bytes()),
            Sink::File(f) => f
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .write_all(line.as_bytes()),
            Sink::Memory(v) => {
                v.lock().unwrap_or_else(|e| e.into_inner()).push(line);
                Ok(())
            }
        };
        if let Err(e) = r {
            tracing::error!(error = %e, "cannot write the audit log");
        }
    }
}

/// What the caller saw of a request (the service, or `render`).
#[derive(Debug, Clone, Default)]
pub struct Seen {
    /// Request id.
    pub request_id: String,
    /// The exported trace's ID.
    pub trace_id: Option<String>,
    /// Argo CD application name.
    pub app: String,
    /// `ARGOCD_APP_PROJECT_NAME`, when the request has it.
    pub project: Option<String>,
    /// `appRelPath`.
    pub app_rel_path: String,
    /// Names of the request's variables.
    pub env_names: Vec<String>,
    /// The archive as received.
    pub archive: ArchiveInfo,
    /// A limit only the caller knows of (its own deadline, an oversized stream).
    pub limit: Option<vocab::record::Limit>,
}

/// The policy `plan` was made from.
pub fn policy_ref(plan: &supervisor::Plan) -> PolicyRef {
    PolicyRef {
        name: plan.policy_name.clone(),
        sha256: plan.policy_sha256.clone(),
    }
}

/// The event of a finished request: what the caller saw, how it ended (`Err`: the status
/// returned to the client), and the runner's `record`.
pub fn finished(
    op: vocab::request::Operation,
    seen: Seen,
    result: Result<(), &tonic::Status>,
    elapsed: std::time::Duration,
    policy: PolicyRef,
    record: RunRecord,
) -> AuditEvent {
    with_record(
        AuditEvent {
            log: "audit".into(),
            schema: SCHEMA.into(),
            time: rfc3339_now(),
            request_id: seen.request_id,
            trace_id: seen.trace_id,
            rpc: op.rpc_name().into(),
            app: seen.app,
            project: seen.project,
            app_rel_path: seen.app_rel_path,
            env_names: seen.env_names,
            archive: seen.archive,
            uid: None,
            gid: None,
            cgroup: None,
            commands: Vec::new(),
            peak_memory_bytes: None,
            oom_kills: None,
            outcome: if result.is_ok() { "ok" } else { "error" }.into(),
            code: format!(
                "{:?}",
                result.map_or_else(|s| s.code(), |()| tonic::Code::Ok)
            ),
            // Already redacted where a command's stderr went into it; once more for text a
            // tool put into, e.g., a manifest-parsing error.
            error: result
                .err()
                .map(|s| supervisor::redact::redact(s.message(), &[])),
            limit: seen.limit,
            seccomp_audit: Vec::new(),
            egress: Vec::new(),
            egress_unrecorded: 0,
            landlock_denials: Vec::new(),
            withheld_env: Vec::new(),
            tree_cache: None,
            policy,
            duration_ms: elapsed.as_millis() as u64,
        },
        record,
    )
}

/// Fill the runner's part from `rec`.
fn with_record(mut e: AuditEvent, rec: RunRecord) -> AuditEvent {
    e.uid = rec.uid;
    e.gid = rec.gid;
    e.cgroup = rec.cgroup;
    e.commands = rec.commands;
    e.peak_memory_bytes = rec.peak_memory_bytes;
    e.oom_kills = rec.oom_kills;
    if e.limit.is_none() {
        e.limit = rec.limit;
    }
    e.seccomp_audit = rec.seccomp_audit;
    e.egress = rec.egress;
    e.egress_unrecorded = rec.egress_unrecorded;
    e.landlock_denials = rec.landlock_denials;
    e.withheld_env = rec.withheld_env;
    e.tree_cache = rec.tree_cache;
    if let Some(a) = rec.archive {
        e.archive.entries = Some(a.entries);
        e.archive.file_bytes = Some(a.file_bytes);
    }
    e
}

/// `now` as RFC 3339 UTC with milliseconds.
pub fn rfc3339_now() -> String {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    rfc3339(d.as_secs() as i64, d.subsec_millis())
}

/// Seconds since the epoch → `YYYY-MM-DDTHH:MM:SS.mmmZ` (proleptic Gregorian).
pub fn rfc3339(secs: i64, millis: u32) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil-from-days (Howard Hinnant's algorithm, restated).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The event as log pipelines read it: field names, order, and how each typed value is
    /// written. A change here is a schema change (bump `SCHEMA`).
    #[test]
    fn the_event_format_is_pinned() {
        use vocab::record::{CommandRecord, Limit, SeccompAction, SeccompEvent};
        let record = RunRecord {
            uid: Some(20001),
            gid: Some(20001),
            cgroup: Some("j20001-7-3".into()),
            archive: Some(vocab::record::ArchiveRecord {
                entries: 4,
                file_bytes: 321,
                ..Default::default()
            }),
            commands: vec![CommandRecord {
                phase: vocab::record::Phase::Generate,
                argv: vec!["sh".into(), "-c".into(), "yes".into()],
                exit_code: None,
                signal: Some("SIGKILL".into()),
                duration_ms: 1500,
                peak_rss_bytes: Some(4096),
                stdout_bytes: 1024,
                stderr_bytes: 0,
                ended_by: Some(Limit::Output),
                ..Default::default()
            }],
            peak_memory_bytes: Some(8192),
            oom_kills: Some(0),
            limit: None,
            seccomp_audit: vec![SeccompEvent {
                syscall: "unshare".into(),
                action: SeccompAction::Denied,
                count: 2,
                comm: "sh".into(),
            }],
            egress: vec![vocab::egress::Connection {
                method: "CONNECT".into(),
                destination: "vault.example:8200".into(),
                address: Some("10.1.2.3:8200".parse().expect("addr")),
                decision: vocab::egress::Decision::Allowed,
                reason: None,
                bytes_up: 517,
                bytes_down: 4100,
                duration_ms: 35,
            }],
            egress_unrecorded: 3,
            landlock_denials: vec![vocab::record::LandlockDenial {
                blockers: "fs.read_file".into(),
                object: "/opt/secret".into(),
                allowed_by: Some("spec.filesystem.readOnly".into()),
            }],
            withheld_env: vec!["VAULT_ADDR".into()],
            tree_cache: None,
        };
        let status = tonic::Status::resource_exhausted("stdout exceeds 1024 bytes");
        let mut e = finished(
            vocab::request::Operation::Generate,
            Seen {
                request_id: "r-1".into(),
                trace_id: None,
                app: "guestbook".into(),
                project: None,
                app_rel_path: "apps/web".into(),
                env_names: vec!["ARGOCD_APP_NAME".into()],
                archive: ArchiveInfo {
                    sha256: Some("ab".into()),
                    bytes: 99,
                    ..Default::default()
                },
                limit: None,
            },
            Err(&status),
            std::time::Duration::from_millis(1600),
            PolicyRef {
                name: "default".into(),
                sha256: "cd".into(),
            },
            record,
        );
        e.time = "2026-11-23T01:01:01.999Z".into();
        e.limit = Some(Limit::Output);
        assert_eq!(
            serde_json::to_string(&e).expect("json"),
            PINNED_EVENT,
            "the audit event's format changed"
        );
        // Read back through the same type, field for field (mutant: a field the reader does
        // not know, or names differently -> not equal).
        let back: AuditEvent = serde_json::from_str(PINNED_EVENT).expect("read back");
        assert_eq!(back, e);
        // An event without the fields written only when they have something to say.
        let lean: AuditEvent = serde_json::from_str(
            r#"{"log":"audit","schema":"cmp-warden.audit/v1","time":"t","requestId":"r","rpc":"MatchRepository","app":"a","appRelPath":".","envNames":[],"archive":{"sha256":null,"bytes":0,"entries":null,"fileBytes":null},"uid":null,"gid":null,"cgroup":null,"commands":[],"peakMemoryBytes":null,"oomKills":null,"outcome":"ok","code":"Ok","error":null,"limit":null,"seccompAudit":[],"policy":{"name":"default","sha256":"cd"},"durationMs":1}"#,
        )
        .expect("a lean event");
        assert!(
            lean.egress.is_empty() && lean.withheld_env.is_empty() && lean.tree_cache.is_none()
        );
    }

    const PINNED_EVENT: &str = r#"{"log":"audit","schema":"cmp-warden.audit/v1","time":"2026-11-23T01:01:01.999Z","requestId":"r-1","rpc":"GenerateManifest","app":"guestbook","appRelPath":"apps/web","envNames":["ARGOCD_APP_NAME"],"archive":{"sha256":"ab","bytes":99,"entries":4,"fileBytes":321},"uid":20001,"gid":20001,"cgroup":"j20001-7-3","commands":[{"phase":"generate","argv":["sh","-c","yes"],"exitCode":null,"signal":"SIGKILL","durationMs":1500,"peakRssBytes":4096,"stdoutBytes":1024,"stderrBytes":0,"endedBy":"output"}],"peakMemoryBytes":8192,"oomKills":0,"outcome":"error","code":"ResourceExhausted","error":"stdout exceeds 1024 bytes","limit":"output","seccompAudit":[{"syscall":"unshare","action":"denied","count":2,"comm":"sh"}],"egress":[{"method":"CONNECT","destination":"vault.example:8200","address":"10.1.2.3:8200","decision":"allowed","bytesUp":517,"bytesDown":4100,"durationMs":35}],"egressUnrecorded":3,"landlockDenials":[{"blockers":"fs.read_file","object":"/opt/secret","allowedBy":"spec.filesystem.readOnly"}],"withheldEnv":["VAULT_ADDR"],"policy":{"name":"default","sha256":"cd"},"durationMs":1600}"#;

    #[test]
    fn rfc3339_dates() {
        assert_eq!(rfc3339(0, 0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400, 5), "2000-02-29T00:00:00.005Z");
        assert_eq!(
            rfc3339(1_795_392_000 + 3661, 999),
            "2026-11-23T01:01:01.999Z"
        );
    }
}
