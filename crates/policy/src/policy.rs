//! The sandbox policy file: raw serde types (unknown fields are errors), one validation pass,
//! and the validated [`Policy`] the rest of the system uses.

use std::path::{Component, Path, PathBuf};
use vocab::egress;

use serde::{Deserialize, Serialize};

use crate::choices::Namespace;
pub use crate::choices::{
    LandlockFeature, LandlockRequirement, NetworkMode, Protection, SeccompMode,
};
use crate::error::invalid;
pub use crate::error::{API_VERSION, PolicyError};
use crate::quantity::parse_quantity;
pub(crate) use crate::raw::RawQty;
use crate::raw::{
    RawArchive, RawCache, RawEnv, RawFs, RawLandlock, RawLimits, RawNetwork, RawPolicy, RawUidRange,
};
use plugin::locate;

/// The embedded default policy (`policies/default.yaml`).
pub const DEFAULT_POLICY_YAML: &str = include_str!("../../../policies/default.yaml");

/// Resource limits for one request, validated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Limits {
    /// Wall clock per request.
    pub wall_seconds: u64,
    /// Memory (cgroup).
    pub memory_bytes: u64,
    /// Processes (cgroup pids, and RLIMIT_NPROC per unique UID).
    pub pids: u64,
    /// CPU quota in millicores.
    pub cpu_millis: u64,
    /// stdout and stderr budget per command.
    pub output_bytes: u64,
    /// RLIMIT_NOFILE.
    pub open_files: u64,
    /// RLIMIT_FSIZE.
    pub file_size_bytes: u64,
    /// The request tree plus what commands write (the size of its private tmpfs).
    pub disk_bytes: u64,
    /// RLIMIT_DATA per process (default: the memory limit).
    pub data_bytes: u64,
    /// RLIMIT_AS per process (default: 64 GiB; Go and V8 reserve large ranges).
    pub address_space_bytes: u64,
}

/// Namespaces the jail creates per request (best effort unless `namespaces` is required).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Namespaces {
    /// Mount namespace with the request's tmpfs (`diskBytes`) and a private `/tmp`.
    pub mount: bool,
    /// PID namespace (and a private `/proc`).
    pub pid: bool,
    /// Network namespace with only loopback (only with `network: none`).
    pub net: bool,
    /// IPC namespace.
    pub ipc: bool,
    /// UTS namespace.
    pub uts: bool,
    /// cgroup namespace.
    pub cgroup: bool,
}

impl Namespaces {
    /// Whether any namespace is asked for.
    pub fn any(&self) -> bool {
        self.mount || self.pid || self.net || self.ipc || self.uts || self.cgroup
    }
}

/// Archive limits, validated (mapped onto `archive::Limits` by the caller).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ArchiveLimits {
    /// Compressed bytes.
    pub compressed_bytes: u64,
    /// Decompressed tar bytes.
    pub extracted_bytes: u64,
    /// One file.
    pub file_bytes: u64,
    /// Entries.
    pub entries: u64,
    /// Symlinks.
    pub symlinks: u64,
    /// Path depth.
    pub path_depth: u64,
    /// Decompressed:compressed ratio.
    pub max_ratio: u64,
    /// Extraction wall clock.
    pub wall_seconds: u64,
    /// Refuse what Argo CD accepts but a reviewer may not want: names with `\` or control
    /// bytes, absolute link targets.
    pub strict_names: bool,
}

/// A validated policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Policy {
    /// `metadata.name`.
    pub name: String,
    /// Protections whose absence stops start-up.
    pub require: Vec<Protection>,
    /// Namespaces per request.
    pub namespaces: Namespaces,
    /// First leased UID/GID.
    pub uid_first: u32,
    /// How many UIDs may be leased.
    pub uid_count: u32,
    /// Read-only paths beyond the request tree.
    pub read_only: Vec<PathBuf>,
    /// Read-write paths beyond the request tree.
    pub read_write: Vec<PathBuf>,
    /// Network mode.
    pub network: NetworkMode,
    /// `spec.network.loopback`: commands may use inet sockets on the jail's own loopback (its
    /// network namespace, which has no other device, is the fence).
    pub network_loopback: bool,
    /// `allowList` mode: the destinations (and whether the list only audits).
    pub egress: egress::AllowList,
    /// `allowList` mode: connections a request may hold open at once.
    pub egress_max_connections: usize,
    /// Seccomp profile, resolved against the policy file's directory (or `policies/`).
    pub seccomp_profile: PathBuf,
    /// Seccomp mode.
    pub seccomp_mode: SeccompMode,
    /// The profile itself, loaded and validated with the policy.
    pub seccomp: crate::seccomp::SeccompProfile,
    /// Request limits.
    pub limits: Limits,
    /// Archive limits.
    pub archive: ArchiveLimits,
    /// Names of the server's environment variables passed to commands (`PREFIX_*` globs
    /// allowed); nothing else of the server's environment reaches them.
    pub env_pass: Vec<String>,
    /// What Landlock must provide (when `landlock` is required).
    pub landlock: LandlockRequirement,
    /// The tree cache (`spec.cache`).
    pub cache: CachePolicy,
    /// SHA-256 of the policy text, for the audit log.
    pub sha256: String,
    /// `spec.select`: the requests this policy is for (a policy directory's selected
    /// policies); `None` for the default.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub select: Option<crate::select::Select>,
}

/// `spec.cache`: extracted trees kept, sealed, for requests with the same archive.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CachePolicy {
    /// On (default) or off.
    pub enabled: bool,
    /// Bytes of sealed trees kept (least recently used ones are evicted beyond it).
    pub bytes: u64,
    /// The identity that owns the trees: never leased, never runs a command (default: the
    /// UID just above `uidRange`).
    pub uid: u32,
    /// Archives smaller than this (the `.tar.gz` size the client states) are extracted in
    /// their request's own jail: for them a fill costs more than hits save.
    pub min_archive_bytes: u64,
}

impl PolicyError {
    /// The same error with the YAML line of its field in `text`, when it names one.
    pub(crate) fn located(self, text: &str) -> Self {
        match self {
            PolicyError::Invalid {
                field,
                why,
                line: None,
            } => PolicyError::Invalid {
                field,
                why,
                line: locate::yaml_line(text, &locate::parse_dotted(field)),
            },
            other => other,
        }
    }
}

/// One YAML document into a strict raw type (the project's one YAML reader, then serde with
/// `deny_unknown_fields`); `what` prefixes serde's message.
pub(crate) fn from_yaml<T: serde::de::DeserializeOwned>(
    text: &str,
    what: &str,
) -> Result<T, PolicyError> {
    let node = plugin::yaml::parse_one(text).map_err(|e| PolicyError::Parse(e.to_string()))?;
    let node = node.ok_or_else(|| PolicyError::Parse("empty document".into()))?;
    let json =
        plugin::json::Json::from_yaml(&node).map_err(|e| PolicyError::Parse(e.to_string()))?;
    // Pretty JSON (one member per line), so serde's error line names the member; the message
    // then gives the user's YAML line and the field path instead of a JSON position.
    let value: serde_json::Value = serde_json::from_str(&json.to_go_string())
        .map_err(|e| PolicyError::Parse(format!("{what}{e}")))?;
    let pretty = serde_json::to_string_pretty(&value)
        .map_err(|e| PolicyError::Parse(format!("{what}{e}")))?;
    serde_json::from_str(&pretty).map_err(|e| {
        let path = locate::json_path_at(&pretty, e.line());
        let mut msg = e.to_string();
        if let Some(cut) = msg.rfind(" at line ") {
            msg.truncate(cut);
        }
        let field = locate::dotted(&path);
        let at = match (locate::yaml_line(text, &path), field.is_empty()) {
            (Some(l), false) => format!("line {l}, {field}: "),
            (Some(l), true) => format!("line {l}: "),
            (None, false) => format!("{field}: "),
            (None, true) => String::new(),
        };
        PolicyError::Parse(format!("{what}{at}{msg}"))
    })
}

pub(crate) fn qty(v: &RawQty, field: &'static str, min: u64) -> Result<u64, PolicyError> {
    let n = match v {
        RawQty::Num(n) => *n,
        RawQty::Text(s) => parse_quantity(s).map_err(|e| invalid(field, e.to_string()))?,
    };
    if n < min {
        return Err(invalid(field, format!("must be at least {min}, got {n}")));
    }
    Ok(n)
}

/// Whether `p` is a path a policy's `spec.filesystem` lists may name (absolute, normalised).
pub fn is_policy_path(p: &str) -> bool {
    abs_path(p, "spec.filesystem").is_ok()
}

fn abs_path(p: &str, field: &'static str) -> Result<PathBuf, PolicyError> {
    let path = Path::new(p);
    if !path.is_absolute() {
        return Err(invalid(field, format!("{p:?} is not absolute")));
    }
    // By the text: `Path::components` drops a `.` inside a path, so `/opt/./x` would pass.
    if p.split('/').any(|c| matches!(c, "." | "..")) || p.contains("//") {
        return Err(invalid(field, format!("{p:?} is not a normalised path")));
    }
    Ok(path.to_path_buf())
}

impl Policy {
    /// The server environment entries the policy passes to commands.
    pub fn passed_env(
        &self,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Vec<(String, String)> {
        env.into_iter().filter(|(k, _)| self.passes(k)).collect()
    }

    /// Whether `spec.env.pass` passes the server variable `name` (a name, or a `NAME_*`
    /// pattern).
    pub fn passes(&self, name: &str) -> bool {
        self.env_pass.iter().any(|p| match p.strip_suffix('*') {
            Some(prefix) => name.starts_with(prefix),
            None => name == p,
        })
    }

    /// Names of the server's variables `spec.env.pass` keeps from commands, sorted, leaving
    /// out what every process or pod has and no plugin is configured by (the shell's own
    /// variables, Kubernetes service links).
    pub fn withheld_env(&self, env: impl IntoIterator<Item = (String, String)>) -> Vec<String> {
        const GENERIC: &[&str] = &[
            "HOME",
            "PWD",
            "OLDPWD",
            "SHLVL",
            "_",
            "TERM",
            "USER",
            "LOGNAME",
            "SHELL",
            "HOSTNAME",
            "MAIL",
            "LS_COLORS",
            "SSH_CLIENT",
            "SSH_CONNECTION",
            "SSH_TTY",
            "XDG_SESSION_ID",
            "XDG_RUNTIME_DIR",
            "XDG_SESSION_TYPE",
            "XDG_SESSION_CLASS",
            "MOTD_SHOWN",
        ];
        // The server's own configuration (Argo CD's sidecar variables, ours).
        let own = |k: &str| {
            k.starts_with("ARGOCD_CMP_")
                || k.starts_with("CMP_WARDEN_")
                || matches!(k, "ARGOCD_PLUGINSOCKFILEPATH" | "ARGOCD_EXEC_TIMEOUT")
        };
        let service_link = |k: &str| {
            k.ends_with("_SERVICE_HOST")
                || k.contains("_SERVICE_PORT")
                || (k.contains("_PORT_")
                    && (k.ends_with("_TCP") || k.contains("_TCP_") || k.contains("_UDP")))
                || k.ends_with("_PORT")
        };
        let mut names: Vec<String> = env
            .into_iter()
            .map(|(k, _)| k)
            .filter(|k| !GENERIC.contains(&k.as_str()) && !service_link(k) && !own(k))
            .filter(|k| self.passed_env([(k.clone(), String::new())]).is_empty())
            .collect();
        names.sort();
        names.dedup();
        names
    }

    /// The embedded default.
    pub fn default_policy() -> Result<Policy, PolicyError> {
        Self::parse(DEFAULT_POLICY_YAML, None)
    }

    /// What a reviewer should look at in a valid policy (each names its field): cidr entries
    /// that cover loopback, link-local or unspecified addresses without `internal: true`.
    pub fn warnings(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .env_pass
            .iter()
            .filter(|n| JAIL_SETS.contains(&n.as_str()))
            .map(|n| {
                format!(
                    "spec.env.pass: {n} is set by the jail (the request's own home and /tmp, inside its tree), so the sidecar's {n} is never passed; a file a command reads from the sidecar's home belongs in the image under a spec.filesystem.readOnly path"
                )
            })
            .collect();
        if self.network == NetworkMode::AllowList {
            out.extend(self.egress.warnings());
        }
        out
    }

    /// Read and validate a policy file (its seccomp profile is resolved beside it).
    pub fn load(path: &Path) -> Result<Policy, PolicyError> {
        let text = read_bounded(path)
            .map_err(|e| PolicyError::Parse(format!("cannot read {}: {e}", path.display())))?;
        let dir = path.parent().unwrap_or(Path::new("."));
        Self::parse(&text, Some(dir))
    }

    /// Parse and validate policy text. `dir` is the policy file's directory (for the seccomp
    /// profile path); `None` for the embedded default (resolved against `policies/`).
    pub fn parse(text: &str, dir: Option<&Path>) -> Result<Policy, PolicyError> {
        let raw: RawPolicy = from_yaml(text, "")?;
        if raw.spec.select.is_some() {
            return Err(invalid(
                "spec.select",
                "a single policy file is every request's policy: put a selected policy in a policy directory (--policy DIR) beside the default, which has no spec.select",
            )
            .located(text));
        }
        Self::validate(raw, text, dir, None).map_err(|e| e.located(text))
    }

    /// One pass over the raw file: each named check below validates one part and returns it
    /// in its final type. `default` is the policy directory's default when this is one of its
    /// selected policies: those take the node-wide fields from it and may not set them.
    fn validate(
        raw: RawPolicy,
        text: &str,
        dir: Option<&Path>,
        default: Option<&Policy>,
    ) -> Result<Policy, PolicyError> {
        check_kind(&raw)?;
        let s = raw.spec;
        let node_wide = check_node_wide(&s, default)?;
        let require = match &node_wide {
            Some(d) => d.require.clone(),
            None => check_require(s.require.as_deref().unwrap_or_default())?,
        };
        let (uid_first, uid_count) = match (&node_wide, &s.uid_range) {
            (Some(d), _) => (d.uid_first, d.uid_count),
            (None, Some(r)) => check_uid_range(r)?,
            (None, None) => unreachable!("check_node_wide: the default has spec.uidRange"),
        };
        let (read_only, read_write) = check_filesystem(&s.filesystem)?;
        let env_pass = check_env_pass(&s.env)?;
        let limits = check_limits(&s.limits)?;
        let namespaces = match &node_wide {
            Some(d) => d.namespaces,
            None => check_namespaces(s.namespaces.as_deref(), &require)?,
        };
        let archive = check_archive(&s.archive)?;
        let (egress, egress_max_connections) = check_network(&s.network)?;
        check_loopback(&s.network, &namespaces)?;
        let (seccomp_profile, seccomp) = load_seccomp_profile(&s.seccomp.profile, dir)?;
        let landlock = check_landlock(s.landlock.as_ref(), &require)?;
        let cache = match &node_wide {
            Some(d) => d.cache.clone(),
            None => check_cache(s.cache.as_ref(), uid_first, uid_count)?,
        };
        if let Some(select) = &s.select {
            select.check()?;
        }
        Ok(Policy {
            name: raw.metadata.name,
            require,
            namespaces,
            uid_first,
            uid_count,
            read_only,
            read_write,
            network: s.network.mode,
            network_loopback: s.network.loopback,
            egress,
            egress_max_connections,
            seccomp_profile,
            seccomp_mode: s.seccomp.mode,
            seccomp,
            limits,
            archive,
            env_pass,
            landlock,
            cache,
            sha256: sha256_hex(text),
            select: s.select,
        })
    }
}

/// What only the default policy sets, because it holds for the whole node: the protections
/// start-up requires, the leased UID range, the namespaces the start-up probe checks, and the
/// tree cache. Returns the default a selected policy takes them from.
fn check_node_wide<'a>(
    s: &crate::raw::RawSpec,
    default: Option<&'a Policy>,
) -> Result<Option<&'a Policy>, PolicyError> {
    let Some(default) = default.filter(|_| s.select.is_some()) else {
        for (field, missing) in [
            ("spec.require", s.require.is_none()),
            ("spec.uidRange", s.uid_range.is_none()),
        ] {
            if missing {
                return Err(invalid(
                    field,
                    "is required (the default policy, the one without spec.select, sets it for the whole node)",
                ));
            }
        }
        return Ok(None);
    };
    for (field, set) in [
        ("spec.require", s.require.is_some()),
        ("spec.uidRange", s.uid_range.is_some()),
        ("spec.namespaces", s.namespaces.is_some()),
        ("spec.cache", s.cache.is_some()),
    ] {
        if set {
            return Err(invalid(
                field,
                format!(
                    "is node-wide: a policy with spec.select takes it from the default policy ({:?}); remove it here",
                    default.name
                ),
            ));
        }
    }
    Ok(Some(default))
}

/// The policies a server runs: one default, and the selected ones (`spec.select`), each
/// request under the most specific one that selects it (`--policy DIR`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicySet {
    /// The default first, then the selected ones in file-name order.
    policies: Vec<Policy>,
    /// A directory's entries that are not policies, each with why (start-up and `policy
    /// check` name them: a policy under another name is never silently dropped).
    skipped: Vec<String>,
    /// The file each policy was read from, in the same order (empty for one policy).
    sources: Vec<String>,
}

/// Variables every jail sets for its commands, whatever `spec.env.pass` says.
const JAIL_SETS: &[&str] = &["HOME", "TMPDIR"];

/// Whether a directory entry named `name` is a policy file: `*.yaml` or `*.yml`, in any case
/// (Kubernetes users write both); not hidden.
pub fn is_policy_file_name(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    !name.starts_with('.') && (lower.ends_with(".yaml") || lower.ends_with(".yml"))
}

impl PolicySet {
    /// One policy for every request.
    pub fn single(policy: Policy) -> PolicySet {
        PolicySet {
            policies: vec![policy],
            skipped: Vec::new(),
            sources: Vec::new(),
        }
    }

    /// A policy file, or a directory of them: every `*.yaml` and `*.yml` file (any case).
    /// Everything else is skipped and named in [`Self::skipped`], except the entries of a
    /// Kubernetes ConfigMap volume's own layout (`..data`, `..2026_11_27_…`), which start
    /// with `..`.
    pub fn load(path: &Path) -> Result<PolicySet, PolicyError> {
        if !path.is_dir() {
            return Policy::load(path).map(PolicySet::single);
        }
        let entries = std::fs::read_dir(path)
            .map_err(|e| PolicyError::Parse(format!("cannot read {}: {e}", path.display())))?;
        let canonical = std::fs::canonicalize(path)
            .map_err(|e| PolicyError::Parse(format!("cannot read {}: {e}", path.display())))?;
        let mut files = Vec::new();
        let mut skipped = Vec::new();
        for entry in entries.filter_map(Result::ok) {
            let p = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with("..") {
                continue;
            }
            if is_policy_file_name(&name) && !stays_inside(&p, &canonical) {
                skipped.push(format!(
                    "{name}: a symbolic link out of the directory (policies are read from it alone)"
                ));
                continue;
            }
            // Followed: a ConfigMap's files are symbolic links into `..data`.
            let meta = std::fs::metadata(&p);
            let is_file = meta.as_ref().is_ok_and(|m| m.is_file());
            match (is_policy_file_name(&name), is_file) {
                (true, true) => files.push(p),
                (true, false) => skipped.push(format!("{name}: not a regular file")),
                // Directories (`seccomp/` holds the profiles) are not policies by layout.
                (false, _) if meta.is_ok_and(|m| m.is_dir()) => {}
                (false, _) if name.starts_with('.') => {
                    skipped.push(format!("{name}: hidden (policies are *.yaml or *.yml)"))
                }
                (false, _) => skipped.push(format!("{name}: not *.yaml or *.yml")),
            }
        }
        files.sort();
        skipped.sort();
        if files.len() > MAX_POLICIES {
            return Err(PolicyError::Set {
                dir: path.display().to_string(),
                why: format!(
                    "{} policy files, more than the {MAX_POLICIES} a directory may hold",
                    files.len()
                ),
            });
        }
        let mut texts = Vec::new();
        for f in files {
            let text = read_bounded(&f)
                .map_err(|e| PolicyError::Parse(format!("cannot read {}: {e}", f.display())))?;
            texts.push((f.display().to_string(), text));
        }
        let mut set = Self::from_texts(&path.display().to_string(), &texts, Some(path))?;
        set.skipped = skipped;
        Ok(set)
    }

    /// The entries of a policy directory that are not policies, each with why.
    pub fn skipped(&self) -> &[String] {
        &self.skipped
    }

    /// The file policy `i` of [`Self::policies`] was read from (a directory's sets only).
    pub fn source(&self, i: usize) -> Option<&str> {
        self.sources.get(i).map(String::as_str)
    }

    /// The set `texts` (file name, text) make; `dir` resolves their seccomp profiles.
    pub fn from_texts(
        dir_name: &str,
        texts: &[(String, String)],
        dir: Option<&Path>,
    ) -> Result<PolicySet, PolicyError> {
        let set_error = |why: String| PolicyError::Set {
            dir: dir_name.to_owned(),
            why,
        };
        let in_file = |file: &str, e: PolicyError| PolicyError::InFile {
            file: file.to_owned(),
            error: Box::new(e),
        };
        let mut raws = Vec::new();
        for (file, text) in texts {
            let raw: RawPolicy = from_yaml(text, "").map_err(|e| in_file(file, e))?;
            raws.push((file, text, raw));
        }
        let defaults: Vec<&str> = raws
            .iter()
            .filter(|(_, _, r)| r.spec.select.is_none())
            .map(|(f, _, _)| f.as_str())
            .collect();
        if defaults.len() != 1 {
            return Err(set_error(format!(
                "needs exactly one default policy (one without spec.select); found {}: {}",
                defaults.len(),
                if defaults.is_empty() {
                    "none".to_owned()
                } else {
                    defaults.join(", ")
                }
            )));
        }
        let at = raws
            .iter()
            .position(|(_, _, r)| r.spec.select.is_none())
            .unwrap_or_default();
        let (file, text, raw) = raws.remove(at);
        let default =
            Policy::validate(raw, text, dir, None).map_err(|e| in_file(file, e.located(text)))?;
        let mut policies = vec![default];
        let mut files = vec![file.as_str()];
        for (file, text, raw) in raws {
            let p = Policy::validate(raw, text, dir, Some(&policies[0]))
                .map_err(|e| in_file(file, e.located(text)))?;
            if let Some(i) = policies.iter().position(|q| q.name == p.name) {
                return Err(set_error(format!(
                    "metadata.name {:?} is used by {} and {file}: each policy needs its own (audit events and metrics name it)",
                    p.name, files[i]
                )));
            }
            for (q, qfile) in policies.iter().zip(&files).skip(1) {
                if let (Some(a), Some(b)) = (&q.select, &p.select)
                    && a.may_tie(b)
                {
                    return Err(set_error(format!(
                        "{qfile} ({}) and {file} ({}) can select the same request equally (the same lists given, sharing a pattern): make one more specific, or merge them",
                        q.name, p.name
                    )));
                }
            }
            policies.push(p);
            files.push(file);
        }
        Ok(PolicySet {
            policies,
            skipped: Vec::new(),
            sources: files.iter().map(|f| (*f).to_owned()).collect(),
        })
    }

    /// The same set with `f` applied to every policy (`doctor` drops the requirements to
    /// show what exists).
    pub fn map(&self, f: impl Fn(&mut Policy)) -> PolicySet {
        let mut set = self.clone();
        set.policies.iter_mut().for_each(f);
        set
    }

    /// The default policy (for requests no policy selects).
    pub fn default_policy(&self) -> &Policy {
        &self.policies[0]
    }

    /// Every policy, the default first.
    pub fn policies(&self) -> &[Policy] {
        &self.policies
    }

    /// The index in [`Self::policies`] of the policy `id` runs under: the most specific one
    /// that selects it, else the default (0).
    pub fn select(&self, id: &crate::select::Identity) -> usize {
        crate::select::most_specific(self.policies.iter().map(|p| p.select.as_ref()), id)
    }
}

/// The tree cache's identity unless `spec.cache.uid` says otherwise (or the range holds it).
pub const DEFAULT_CACHE_UID: u32 = 65535;

/// `spec.cache.minArchiveBytes` unless given: below it a hit saves less than a fill costs
/// (BENCHMARKS.md, "Small archives").
pub const DEFAULT_CACHE_MIN_ARCHIVE_BYTES: u64 = 8 << 10;

/// `spec.cache`: on unless disabled, 512 MiB, its identity outside the UID range.
fn check_cache(
    raw: Option<&RawCache>,
    uid_first: u32,
    uid_count: u32,
) -> Result<CachePolicy, PolicyError> {
    let raw_default = RawCache::default();
    let raw = raw.unwrap_or(&raw_default);
    let bytes = match &raw.bytes {
        Some(q) => qty(q, "spec.cache.bytes", 1 << 20)?,
        None => 512 << 20,
    };
    // By default 65535: above the ranges operators give instances (so never inside the next
    // instance's range, as first + count would be), within a user-namespaced pod's 0..65535.
    let uid = match raw.uid {
        Some(u) => u,
        None if !(uid_first..uid_first.saturating_add(uid_count)).contains(&DEFAULT_CACHE_UID) => {
            DEFAULT_CACHE_UID
        }
        None => uid_first.checked_add(uid_count).ok_or_else(|| {
            invalid(
                "spec.cache.uid",
                "no UID above spec.uidRange: give one outside it",
            )
        })?,
    };
    if (uid_first..uid_first.saturating_add(uid_count)).contains(&uid) || uid == 0 {
        return Err(invalid(
            "spec.cache.uid",
            format!(
                "{uid} must be outside spec.uidRange ({uid_first}+{uid_count}) and not 0: the trees' owner never runs a command"
            ),
        ));
    }
    // As for spec.uidRange: no system ID (an image's own users live there), no overflow ID
    // (what every unmapped ID shows as in a user namespace), room below 2^31 for the 15 a
    // second instance may take above it.
    let why = if uid < 1000 {
        Some("is a system ID (below 1000)")
    } else if (uid..uid.saturating_add(16)).contains(&65534) {
        Some(
            "is, or has within the 15 IDs a second instance may take above it, 65534 (nobody/overflow id)",
        )
    } else if u64::from(uid) + 16 > u64::from(u32::MAX >> 1) {
        Some("leaves no room below 2^31-1 for the 15 IDs a second instance may take above it")
    } else {
        None
    };
    if let Some(why) = why {
        let given = if raw.uid.is_some() {
            "given"
        } else {
            "by default spec.uidRange.first + count, the range holding 65535"
        };
        // The first ID above the range, unless that is what ran into 65534.
        let end = uid_first.saturating_add(uid_count);
        let suggest = if (end..end.saturating_add(16)).contains(&65534) {
            65535
        } else {
            end
        };
        return Err(invalid(
            "spec.cache.uid",
            format!("{uid} ({given}) {why}: set spec.cache.uid to a free ID such as {suggest}"),
        ));
    }
    let min_archive_bytes = match &raw.min_archive_bytes {
        Some(q) => qty(q, "spec.cache.minArchiveBytes", 0)?,
        None => DEFAULT_CACHE_MIN_ARCHIVE_BYTES,
    };
    Ok(CachePolicy {
        enabled: raw.enabled.unwrap_or(true),
        bytes,
        uid,
        min_archive_bytes,
    })
}

/// `apiVersion`, `kind` and `metadata.name`.
fn check_kind(raw: &RawPolicy) -> Result<(), PolicyError> {
    if raw.api_version != API_VERSION {
        return Err(invalid(
            "apiVersion",
            format!("must be {API_VERSION}, got {:?}", raw.api_version),
        ));
    }
    if raw.kind != "SandboxPolicy" {
        return Err(invalid(
            "kind",
            format!("must be SandboxPolicy, got {:?}", raw.kind),
        ));
    }
    if raw.metadata.name.is_empty() {
        return Err(invalid("metadata.name", "must be non-empty"));
    }
    Ok(())
}

/// `spec.require`: each protection at most once; returned sorted.
fn check_require(raw: &[Protection]) -> Result<Vec<Protection>, PolicyError> {
    let mut require = raw.to_vec();
    require.sort();
    if require.windows(2).any(|w| w[0] == w[1]) {
        return Err(invalid("spec.require", "lists a protection twice"));
    }
    Ok(require)
}

/// `spec.landlock`: an ABI from 1 to the newest this build knows, each feature once, and only
/// with `landlock` required (a requirement nothing enforces would be a false promise).
fn check_landlock(
    raw: Option<&RawLandlock>,
    require: &[Protection],
) -> Result<LandlockRequirement, PolicyError> {
    let Some(raw) = raw else {
        return Ok(LandlockRequirement {
            min_abi: 1,
            features: Vec::new(),
        });
    };
    if !require.contains(&Protection::Landlock) {
        return Err(invalid(
            "spec.landlock",
            "needs landlock in spec.require (it says what a required Landlock must provide)",
        ));
    }
    let min_abi = raw.min_abi.unwrap_or(1);
    if !(1..=7).contains(&min_abi) {
        return Err(invalid(
            "spec.landlock.minAbi",
            format!("must be between 1 and 7, got {min_abi}"),
        ));
    }
    let mut features = raw.features.clone();
    features.sort();
    if features.windows(2).any(|w| w[0] == w[1]) {
        return Err(invalid("spec.landlock.features", "lists a feature twice"));
    }
    Ok(LandlockRequirement { min_abi, features })
}

/// `spec.uidRange`: above the system IDs, below 2^31, without the overflow ID.
fn check_uid_range(r: &RawUidRange) -> Result<(u32, u32), PolicyError> {
    let (first, count) = (r.first, r.count);
    if first < 1000 {
        return Err(invalid(
            "spec.uidRange.first",
            format!("must be >= 1000 (system ids), got {first}"),
        ));
    }
    if count == 0 {
        return Err(invalid("spec.uidRange.count", "must be at least 1"));
    }
    if u64::from(first) + u64::from(count) > u64::from(u32::MAX >> 1) {
        return Err(invalid("spec.uidRange", "range ends above 2^31-1"));
    }
    if (u64::from(first)..u64::from(first) + u64::from(count)).contains(&65534) {
        return Err(invalid(
            "spec.uidRange",
            "must not contain 65534 (nobody/overflow id)",
        ));
    }
    Ok((first, count))
}

/// `spec.filesystem`: absolute, normalised paths; `/` never writable.
fn check_filesystem(fs: &RawFs) -> Result<(Vec<PathBuf>, Vec<PathBuf>), PolicyError> {
    let read_only = fs
        .read_only
        .iter()
        .map(|p| abs_path(p, "spec.filesystem.readOnly"))
        .collect::<Result<Vec<_>, _>>()?;
    let read_write = fs
        .read_write
        .iter()
        .map(|p| abs_path(p, "spec.filesystem.readWrite"))
        .collect::<Result<Vec<_>, _>>()?;
    if read_write.iter().any(|p| p == Path::new("/")) {
        return Err(invalid("spec.filesystem.readWrite", "must not contain /"));
    }
    Ok((read_only, read_write))
}

/// `spec.env.pass`: variable names or `NAME_*` prefixes.
/// Whether `n` can be an `env.pass` entry as written: letters, digits and `_` (a variable
/// name; with a trailing `*`, a prefix).
pub fn is_env_name(n: &str) -> bool {
    let stem = n.strip_suffix('*').unwrap_or(n);
    !stem.is_empty() && stem.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Whether `text` names the variable `var` as a word of its own, not inside a longer name (a
/// tool's "VAULT_TOKEN is not set" names VAULT_TOKEN; "MY_VAULT_TOKEN_FILE" does not).
pub fn names_var(text: &str, var: &str) -> bool {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    text.match_indices(var).any(|(i, _)| {
        !text[..i].chars().next_back().is_some_and(word)
            && !text[i + var.len()..].chars().next().is_some_and(word)
    })
}

fn check_env_pass(env: &RawEnv) -> Result<Vec<String>, PolicyError> {
    for n in &env.pass {
        if !is_env_name(n) {
            return Err(invalid(
                "spec.env.pass",
                format!("{n:?} is not a variable name or NAME_* prefix"),
            ));
        }
    }
    Ok(env.pass.clone())
}

/// `spec.network.loopback`: only where the jail's network namespace is asked for (it is what
/// keeps inet sockets on the loopback), and not with `egress` (which has the host's network).
fn check_loopback(n: &RawNetwork, namespaces: &Namespaces) -> Result<(), PolicyError> {
    if !n.loopback {
        return Ok(());
    }
    if n.mode == NetworkMode::Egress {
        return Err(invalid(
            "spec.network.loopback",
            "applies to mode none or allowList (egress already reaches every address)",
        ));
    }
    if !namespaces.net {
        return Err(invalid(
            "spec.network.loopback",
            "needs net in spec.namespaces: the jail's own network namespace, which has only a loopback device, is what keeps its inet sockets there",
        ));
    }
    Ok(())
}

/// `spec.network`: `allow`, `audit` and `maxConnections` only with `allowList`, which needs at
/// least one entry (or `audit`); each entry names exactly one host pattern or CIDR and at least
/// one port. (What keeps the proxy the jail's only way out — its own network namespace, or
/// Landlock's TCP rules without one — is the jail's to check: it depends on the node.)
fn check_network(n: &RawNetwork) -> Result<(egress::AllowList, usize), PolicyError> {
    if n.mode != NetworkMode::AllowList {
        if !n.allow.is_empty()
            || n.audit
            || n.max_connections.is_some()
            || !n.hosts.is_empty()
            || n.search_domains
        {
            return Err(invalid(
                "spec.network",
                "allow, audit, hosts, maxConnections and searchDomains apply only to mode: allowList",
            ));
        }
        return Ok((egress::AllowList::default(), 0));
    }
    if n.allow.is_empty() && !n.audit {
        return Err(invalid(
            "spec.network.allow",
            "lists no destination (use mode: none, or audit: true to record what a plugin reaches)",
        ));
    }
    let mut rules = Vec::new();
    for d in &n.allow {
        let target = match (&d.host, &d.cidr) {
            (Some(h), None) => egress::Target::Host(
                egress::HostPattern::parse(h)
                    .map_err(|e| invalid("spec.network.allow[].host", e.to_string()))?,
            ),
            (None, Some(c)) => egress::Target::Cidr(
                egress::Cidr::parse(c)
                    .map_err(|e| invalid("spec.network.allow[].cidr", e.to_string()))?,
            ),
            _ => {
                return Err(invalid(
                    "spec.network.allow[]",
                    "each entry names exactly one of host or cidr",
                ));
            }
        };
        if d.ports.is_empty() || d.ports.contains(&0) {
            return Err(invalid(
                "spec.network.allow[].ports",
                "each entry lists at least one port, from 1 to 65535",
            ));
        }
        rules.push(egress::Rule {
            target,
            ports: d.ports.clone(),
            internal: d.internal,
        });
    }
    let mut hosts = Vec::new();
    for (name, addresses) in &n.hosts {
        let bad = |why: String| invalid("spec.network.hosts", why);
        let pattern = egress::HostPattern::parse(name).map_err(|e| bad(e.to_string()))?;
        if name.starts_with("*.") || addresses.is_empty() {
            return Err(bad(format!(
                "{name:?}: an exact name with at least one address"
            )));
        }
        let ips = addresses
            .iter()
            .map(|a| {
                a.parse::<std::net::IpAddr>()
                    .map_err(|_| bad(format!("{name:?}: {a:?} is not an IP address")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        hosts.push((pattern.to_string(), ips));
    }
    let max = n.max_connections.unwrap_or(100);
    if !(1..=1000).contains(&max) {
        return Err(invalid(
            "spec.network.maxConnections",
            format!("{max} is outside 1..=1000"),
        ));
    }
    Ok((
        egress::AllowList {
            rules,
            audit: n.audit,
            hosts,
            search_domains: n.search_domains,
        },
        max as usize,
    ))
}

/// `spec.limits`: each quantity at or above its floor; `dataBytes` defaults to the memory
/// limit, `addressSpaceBytes` to 64 GiB.
fn check_limits(l: &RawLimits) -> Result<Limits, PolicyError> {
    let memory_bytes = qty(&l.memory_bytes, "spec.limits.memoryBytes", 16 << 20)?;
    Ok(Limits {
        wall_seconds: qty(&l.wall_seconds, "spec.limits.wallSeconds", 1)?,
        memory_bytes,
        pids: qty(&l.pids, "spec.limits.pids", 8)?,
        cpu_millis: qty(&l.cpu_millis, "spec.limits.cpuMillis", 10)?,
        output_bytes: qty(&l.output_bytes, "spec.limits.outputBytes", 1024)?,
        open_files: qty(&l.open_files, "spec.limits.openFiles", 64)?,
        file_size_bytes: qty(&l.file_size_bytes, "spec.limits.fileSizeBytes", 1 << 20)?,
        disk_bytes: qty(&l.disk_bytes, "spec.limits.diskBytes", 1 << 20)?,
        data_bytes: match &l.data_bytes {
            Some(q) => qty(q, "spec.limits.dataBytes", 16 << 20)?,
            None => memory_bytes,
        },
        address_space_bytes: match &l.address_space_bytes {
            Some(q) => qty(q, "spec.limits.addressSpaceBytes", 256 << 20)?,
            None => 64 << 30,
        },
    })
}

/// `spec.namespaces`: all when absent; each at most once; not empty when required.
fn check_namespaces(
    list: Option<&[Namespace]>,
    require: &[Protection],
) -> Result<Namespaces, PolicyError> {
    let namespaces = match list {
        None => Namespaces {
            mount: true,
            pid: true,
            net: true,
            ipc: true,
            uts: true,
            cgroup: true,
        },
        Some(list) => {
            if list.contains(&Namespace::User) {
                return Err(invalid(
                    "spec.namespaces",
                    "lists `user`, which is not a choice: the user namespace is created whenever \
                     any other is; list only mount, pid, net, ipc, uts and cgroup",
                ));
            }
            let mut sorted = list.to_vec();
            sorted.sort_by_key(|n| *n as u8);
            if sorted.windows(2).any(|w| w[0] == w[1]) {
                return Err(invalid("spec.namespaces", "lists a namespace twice"));
            }
            let has = |n| list.contains(&n);
            Namespaces {
                mount: has(Namespace::Mount),
                pid: has(Namespace::Pid),
                net: has(Namespace::Net),
                ipc: has(Namespace::Ipc),
                uts: has(Namespace::Uts),
                cgroup: has(Namespace::Cgroup),
            }
        }
    };
    if require.contains(&Protection::Namespaces) && !namespaces.any() {
        return Err(invalid(
            "spec.require",
            "requires namespaces but spec.namespaces lists none",
        ));
    }
    Ok(namespaces)
}

/// `spec.archive`: each limit at or above its floor.
fn check_archive(a: &RawArchive) -> Result<ArchiveLimits, PolicyError> {
    Ok(ArchiveLimits {
        compressed_bytes: qty(&a.compressed_bytes, "spec.archive.compressedBytes", 1024)?,
        extracted_bytes: qty(&a.extracted_bytes, "spec.archive.extractedBytes", 1024)?,
        file_bytes: qty(&a.file_bytes, "spec.archive.fileBytes", 1)?,
        entries: qty(&a.entries, "spec.archive.entries", 1)?,
        symlinks: qty(&a.symlinks, "spec.archive.symlinks", 0)?,
        path_depth: qty(&a.path_depth, "spec.archive.pathDepth", 1)?,
        max_ratio: qty(&a.max_ratio, "spec.archive.maxRatio", 2)?,
        wall_seconds: qty(&a.wall_seconds, "spec.archive.wallSeconds", 1)?,
        strict_names: a.strict_names,
    })
}

/// `spec.seccomp.profile`: a relative path without `..`, read from beside the policy file (the
/// pair is reviewed and mounted together); the embedded policy uses the embedded profile.
fn load_seccomp_profile(
    profile: &str,
    dir: Option<&Path>,
) -> Result<(PathBuf, crate::seccomp::SeccompProfile), PolicyError> {
    let path = Path::new(profile);
    if profile.is_empty()
        || path.is_absolute()
        || path.components().any(|c| matches!(c, Component::ParentDir))
    {
        return Err(invalid(
            "spec.seccomp.profile",
            "must be a relative path without '..'",
        ));
    }
    let base = dir
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("policies"));
    let loaded = match dir {
        None if profile == "seccomp/default.json" => {
            crate::seccomp::SeccompProfile::default_profile()?
        }
        None => {
            return Err(invalid(
                "spec.seccomp.profile",
                "the embedded policy can only use seccomp/default.json",
            ));
        }
        Some(d) => {
            let file = d.join(path);
            let text = read_bounded(&file).map_err(|e| {
                invalid(
                    "spec.seccomp.profile",
                    format!("cannot read {}: {e}", file.display()),
                )
            })?;
            crate::seccomp::SeccompProfile::parse(&text)?
        }
    };
    Ok((base.join(path), loaded))
}

/// The most a policy file or a seccomp profile may hold (the shipped ones are a few KiB).
pub const MAX_FILE_BYTES: u64 = 1 << 20;

/// The most policy files a policy directory may hold.
pub const MAX_POLICIES: usize = 256;

/// `path`'s text, when it is a regular file (followed through links) of at most
/// [`MAX_FILE_BYTES`]: a FIFO, a device (`/dev/zero` named `*.yaml`) or a huge file is refused
/// before a byte is read, so a misplaced file can neither block nor fill the server's memory.
pub fn read_bounded(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let meta = std::fs::metadata(path)?;
    if !meta.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    // One bound, on what is read (a file may grow after a stat): at most one byte past it.
    let mut text = String::new();
    std::fs::File::open(path)?
        .take(MAX_FILE_BYTES + 1)
        .read_to_string(&mut text)?;
    if text.len() as u64 > MAX_FILE_BYTES {
        return Err(std::io::Error::other(format!(
            "more than the {MAX_FILE_BYTES} bytes a policy file or seccomp profile may hold"
        )));
    }
    Ok(text)
}

/// Whether directory entry `p` (of `dir`, canonical) stays inside it when followed: a link
/// into the directory (a ConfigMap's `name → ..data/name`) does, one to another place of the
/// file system does not, and is never read as a policy.
fn stays_inside(p: &Path, dir: &Path) -> bool {
    match std::fs::symlink_metadata(p) {
        Ok(m) if m.file_type().is_symlink() => {
            std::fs::canonicalize(p).is_ok_and(|t| t.starts_with(dir))
        }
        Ok(_) => true,
        Err(_) => false,
    }
}

fn sha256_hex(text: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(text.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_policy_validates() {
        let p = Policy::default_policy().expect("default policy");
        assert_eq!(p.name, "default");
        assert_eq!(
            p.require,
            [
                Protection::UniqueUid,
                Protection::NoNewPrivs,
                Protection::Landlock,
                Protection::Seccomp
            ]
        );
        assert_eq!(p.limits.memory_bytes, 1 << 30);
        assert_eq!(p.limits.output_bytes, 64 << 20);
        assert_eq!(p.archive.compressed_bytes, 100 << 20);
        assert_eq!(p.network, NetworkMode::None);
        assert_eq!(
            p.seccomp_profile,
            Path::new("policies/seccomp/default.json")
        );
    }

    /// The default policy without the `net` namespace, with `network` as its network line.
    fn without_net(network: &str) -> String {
        DEFAULT_POLICY_YAML
            .replacen(
                "namespaces: [mount, pid, net, ipc, uts, cgroup]",
                "namespaces: [mount, pid]",
                1,
            )
            .replacen("network: {mode: none}", network, 1)
    }

    fn with(from: &str, to: &str) -> Result<Policy, PolicyError> {
        assert!(DEFAULT_POLICY_YAML.contains(from), "fixture: {from}");
        Policy::parse(&DEFAULT_POLICY_YAML.replacen(from, to, 1), None)
    }

    /// `env.pass: [HOME]` is accepted (an existing policy keeps working) but changes nothing:
    /// the jail sets HOME and TMPDIR. The reviewer is told so (mutant: no such warning).
    #[test]
    fn passing_what_the_jail_sets_is_named_in_a_warning() {
        assert!(
            Policy::default_policy()
                .expect("default")
                .warnings()
                .is_empty()
        );
        let p = with(
            "pass: [PATH, LANG, LC_ALL, TZ]",
            "pass: [PATH, LANG, LC_ALL, TZ, HOME, TMPDIR]",
        )
        .expect("accepted");
        let w = p.warnings();
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(
            w[0].starts_with("spec.env.pass: HOME is set by the jail")
                && w[1].starts_with("spec.env.pass: TMPDIR is set by the jail"),
            "{w:?}"
        );
    }

    #[test]
    fn malformed_policies_are_refused_with_clear_messages() {
        let e = |r: Result<Policy, PolicyError>| r.expect_err("must be refused").to_string();
        assert!(
            e(with(
                "network: {mode: none}",
                "network: {mode: none, extra: 1}"
            ))
            .contains("unknown field `extra`")
        );
        assert!(
            e(with("network: {mode: none}", "network: {mode: sometimes}"))
                .contains("unknown variant `sometimes`")
        );
        assert!(
            e(with(
                "require: [uniqueUid,",
                "require: [uniqueUid, uniqueUid,"
            ))
            .contains("spec.require: lists a protection twice")
        );
        assert!(
            e(with("first: 20000", "first: 0")).contains("spec.uidRange.first: must be >= 1000")
        );
        assert!(e(with("count: 40000", "count: 60000")).contains("must not contain 65534"));
        // The cache's identity: 65535 by default, so never the first ID of the next range
        // an operator gives another instance; not the overflow ID (nor within the 15 a second
        // instance may take above it), not a system ID; the message says what to set.
        let default = with("count: 40000", "count: 45530").expect("65535 outside the range");
        assert_eq!(default.cache.uid, 65535);
        assert_eq!(
            default.cache.min_archive_bytes,
            DEFAULT_CACHE_MIN_ARCHIVE_BYTES
        );
        let every = with(
            "cache: {enabled: true, bytes: 512Mi}",
            "cache: {enabled: true, bytes: 512Mi, minArchiveBytes: 0}",
        )
        .expect("policy");
        assert_eq!(every.cache.min_archive_bytes, 0);
        assert!(
            e(with(
                "cache: {enabled: true, bytes: 512Mi}",
                "cache: {enabled: true, bytes: 512Mi, minArchiveBytes: lots}",
            ))
            .contains("spec.cache.minArchiveBytes")
        );
        let near_nobody = e(with(
            "cache: {enabled: true, bytes: 512Mi}",
            "cache: {enabled: true, bytes: 512Mi, uid: 65530}",
        ));
        assert!(
            near_nobody.contains("spec.cache.uid: 65530 (given)")
                && near_nobody.contains("65534 (nobody/overflow id)")
                && near_nobody.contains("set spec.cache.uid to a free ID such as 60000"),
            "{near_nobody}"
        );
        // A range holding 65535: the first ID above it.
        let above = with("first: 20000", "first: 65535").expect("policy");
        assert_eq!(above.cache.uid, 65535 + 40000);
        assert!(
            e(with(
                "cache: {enabled: true, bytes: 512Mi}",
                "cache: {enabled: true, bytes: 512Mi, uid: 999}"
            ))
            .contains("spec.cache.uid: 999 (given) is a system ID")
        );
        assert!(
            with(
                "cache: {enabled: true, bytes: 512Mi}",
                "cache: {enabled: true, bytes: 512Mi, uid: 65535}"
            )
            .is_ok()
        );
        assert!(
            e(with("memoryBytes: 1Gi", "memoryBytes: lots"))
                .contains("spec.limits.memoryBytes: invalid quantity 'lots'")
        );
        assert!(e(with("pids: 512", "pids: 2")).contains("spec.limits.pids: must be at least 8"));
        assert!(
            e(with("readWrite: [/dev/null,", "readWrite: [tmp,"))
                .contains("spec.filesystem.readWrite: \"tmp\" is not absolute")
        );
        assert!(e(with("readWrite: [/dev/null,", "readWrite: [/,")).contains("must not contain /"));
        assert!(
            e(with("profile: seccomp/default.json", "profile: ../x.json"))
                .contains("spec.seccomp.profile")
        );
        assert!(
            e(with("kind: SandboxPolicy", "kind: Policy")).contains("kind: must be SandboxPolicy")
        );
        assert!(
            e(with("apiVersion: cmp-warden.io/v1alpha1", "apiVersion: v1"))
                .contains("apiVersion: must be")
        );
        assert!(e(Policy::parse("", None)).contains("empty document"));
        assert!(e(Policy::parse("a: [", None)).starts_with("policy: yaml:"));
    }

    #[test]
    fn allow_lists_parse_and_refuse_what_they_cannot_mean() {
        let p = with(
            "network: {mode: none}",
            "network: {mode: allowList, allow: [{host: vault.example, ports: [8200]}, {host: '*.charts.example', ports: [443, 8443]}, {cidr: 10.0.0.0/8, ports: [443]}, {host: localhost, ports: [9000], internal: true}], maxConnections: 20, hosts: {vault.example: [10.1.2.3, 'fd00::1']}}",
        )
        .expect("allow list");
        assert_eq!(p.network, NetworkMode::AllowList);
        assert_eq!(p.egress.rules.len(), 4);
        assert_eq!(p.egress_max_connections, 20);
        assert!(p.egress.rules[3].internal && !p.egress.audit);
        // What `policy suggest` writes reads back as the same list.
        let back = Policy::parse(&crate::emit::to_yaml(&p, "seccomp/default.json", &[]), None)
            .expect("round trip");
        assert_eq!((back.egress, back.egress_max_connections), (p.egress, 20));

        let e = |to: &str| {
            with("network: {mode: none}", to)
                .expect_err("must be refused")
                .to_string()
        };
        for (to, why) in [
            (
                "network: {mode: none, allow: [{host: a.example, ports: [1]}]}",
                "apply only to mode: allowList",
            ),
            ("network: {mode: allowList}", "lists no destination"),
            (
                "network: {mode: allowList, allow: [{host: a.example, cidr: 10.0.0.0/8, ports: [1]}]}",
                "exactly one of host or cidr",
            ),
            (
                "network: {mode: allowList, allow: [{host: a.example, ports: []}]}",
                "at least one port",
            ),
            (
                "network: {mode: allowList, allow: [{host: 'http://a.example', ports: [1]}]}",
                "spec.network.allow[].host: bad host pattern",
            ),
            (
                "network: {mode: allowList, allow: [{cidr: 10.0.0.0/40, ports: [1]}]}",
                "spec.network.allow[].cidr",
            ),
            (
                "network: {mode: none, searchDomains: true}",
                "apply only to mode: allowList",
            ),
            (
                "network: {mode: allowList, allow: [{host: a.example, ports: [1]}], maxConnections: 0}",
                "outside 1..=1000",
            ),
        ] {
            assert!(e(to).contains(why), "{to}: {}", e(to));
        }
        // Without `net` the proxy stays the only way out through Landlock's TCP rules, which
        // the jail then requires (a kernel without them is refused when a jail confines).
        let no_net = without_net("network: {mode: allowList, audit: true}");
        assert!(Policy::parse(&no_net, None).is_ok());
        // The user namespace comes with any other; naming it, or one twice, is refused.
        for (list, why) in [
            ("[user, mount]", "lists `user`, which is not a choice"),
            ("[mount, mount]", "lists a namespace twice"),
            ("[mount, time]", "unknown variant `time`"),
        ] {
            let text = DEFAULT_POLICY_YAML.replacen(
                "namespaces: [mount, pid, net, ipc, uts, cgroup]",
                &format!("namespaces: {list}"),
                1,
            );
            let err = Policy::parse(&text, None).expect_err(list).to_string();
            assert!(
                err.contains("spec.namespaces") && err.contains(why),
                "{list}: {err}"
            );
        }
    }

    /// `network.loopback` is read, written back by `policy suggest`, and refused where nothing
    /// would keep its sockets on the loopback (no `net` namespace) or where it means nothing
    /// (`egress`). Mutant: no `net` check → the second case parses.
    #[test]
    fn loopback_needs_the_network_namespace_and_not_egress() {
        let p = with(
            "network: {mode: none}",
            "network: {mode: none, loopback: true}",
        )
        .expect("loopback");
        assert!(p.network_loopback && p.network == NetworkMode::None);
        let back = Policy::parse(&crate::emit::to_yaml(&p, "seccomp/default.json", &[]), None)
            .expect("round trip");
        assert!(back.network_loopback);
        let no_net = without_net("network: {mode: none, loopback: true}");
        let err = Policy::parse(&no_net, None)
            .expect_err("no net")
            .to_string();
        assert!(
            err.contains("spec.network.loopback") && err.contains("needs net in spec.namespaces"),
            "{err}"
        );
        let err = with(
            "network: {mode: none}",
            "network: {mode: egress, loopback: true}",
        )
        .expect_err("egress")
        .to_string();
        assert!(err.contains("applies to mode none or allowList"), "{err}");
    }

    /// The default policy passing `PATH` and `VAULT_*`.
    fn passing_path_and_vault() -> Policy {
        with("pass: [PATH, LANG, LC_ALL, TZ]", "pass: [PATH, VAULT_*]").expect("policy")
    }

    /// What `passing_path_and_vault` withholds of a server environment with these names.
    fn withheld(names: &[&str]) -> Vec<String> {
        passing_path_and_vault()
            .withheld_env(names.iter().map(|k| ((*k).to_owned(), "value".to_owned())))
    }

    #[test]
    fn withheld_variables_are_named_without_the_noise() {
        let env = [
            "PATH",
            "VAULT_ADDR",
            "AVP_TYPE",
            "HOME",
            "KUBERNETES_SERVICE_HOST",
            "KUBERNETES_PORT_443_TCP",
            "ARGOCD_REPO_SERVER_PORT",
            "HELM_CACHE_HOME",
        ];
        assert_eq!(withheld(&env), ["AVP_TYPE", "HELM_CACHE_HOME"]);
    }

    /// What is left out of the withheld list is each kind of noise by its own shape; a name
    /// merely resembling one (a `_PORT_` that is no service link, a prefix without its
    /// underscore) is still named, and `NAME_*` passes by prefix, a plain name only whole.
    #[test]
    fn each_kind_of_noise_is_left_out_by_its_own_shape() {
        let env = [
            // Noise: the shell's, the server's own, Kubernetes service links.
            "SHLVL",
            "ARGOCD_CMP_SERVER_LISTEN",
            "CMP_WARDEN_POLICY",
            "ARGOCD_PLUGINSOCKFILEPATH",
            "ARGOCD_EXEC_TIMEOUT",
            "WEB_SERVICE_PORT_HTTP",
            "WEB_PORT_443_TCP_ADDR",
            "DNS_PORT_53_UDP_PROTO",
            "DNS_PORT",
            // Named.
            "MY_PORT_NUMBER",
            "ARGOCD_CMPX",
            "CMP_WARDENX",
            "PATHX",
            "VAULTX",
        ];
        assert_eq!(
            withheld(&env),
            [
                "ARGOCD_CMPX",
                "CMP_WARDENX",
                "MY_PORT_NUMBER",
                "PATHX",
                "VAULTX"
            ]
        );
        let p = passing_path_and_vault();
        assert!(p.passes("VAULT_TOKEN") && p.passes("PATH"));
        assert!(!p.passes("VAULT") && !p.passes("PATH_X") && !p.passes("XPATH"));
    }

    /// `spec.uidRange`'s bounds, each at its edge: 1000 is the first non-system ID, the range
    /// may end at 2^31-1 and not one past it.
    #[test]
    fn uid_ranges_at_their_edges() {
        let r = |first, count| check_uid_range(&RawUidRange { first, count });
        assert!(r(999, 1).is_err());
        assert_eq!(r(1000, 1).expect("first non-system ID"), (1000, 1));
        let top = u32::MAX >> 1;
        assert!(r(100_000, top - 100_000).is_ok(), "ends at 2^31-1");
        assert!(r(100_000, top - 100_000 + 1).is_err(), "one past 2^31-1");
        assert!(r(top - 10, 5).is_ok());
        assert!(r(65534, 1).is_err() && r(65535, 1).is_ok() && r(65000, 534).is_ok());
    }

    /// `spec.cache`: its defaults (on, 512 MiB, UID 65535, 8 KiB archives), the UID above a
    /// range that holds 65535, and each refused UID at its edge.
    #[test]
    fn the_cache_defaults_and_its_uid_edges() {
        let c = check_cache(None, 20000, 100).expect("defaults");
        assert_eq!(
            (c.enabled, c.bytes, c.uid, c.min_archive_bytes),
            (true, 512 << 20, 65535, 8192)
        );
        assert_eq!(check_cache(None, 60000, 10000).expect("above").uid, 70000);
        let with_uid = |uid| {
            check_cache(
                Some(&RawCache {
                    uid: Some(uid),
                    ..RawCache::default()
                }),
                20000,
                100,
            )
        };
        assert!(with_uid(0).is_err(), "0");
        assert!(with_uid(999).is_err() && with_uid(1000).is_ok());
        assert!(with_uid(20099).is_err() && with_uid(20100).is_ok());
        assert!(
            with_uid(65519).is_err()
                && with_uid(65534).is_err()
                && with_uid(65518).is_ok()
                && with_uid(65535).is_ok()
        );
        let top = u32::MAX >> 1;
        assert!(with_uid(top - 16).is_ok() && with_uid(top - 15).is_err());
        let small = RawCache {
            bytes: Some(RawQty::Num((1 << 20) - 1)),
            ..RawCache::default()
        };
        assert!(check_cache(Some(&small), 20000, 100).is_err());
        let one_mib = RawCache {
            bytes: Some(RawQty::Num(1 << 20)),
            ..RawCache::default()
        };
        assert_eq!(
            check_cache(Some(&one_mib), 20000, 100)
                .expect("1 MiB")
                .bytes,
            1 << 20
        );
    }

    /// `spec.landlock`: only with landlock required, an ABI from 1 to 7, each feature once.
    #[test]
    fn landlock_requirements_are_checked() {
        let none = check_landlock(None, &[]).expect("none");
        assert_eq!((none.min_abi, none.features.len()), (1, 0));
        let req = [Protection::Landlock];
        let abi = |min_abi| RawLandlock {
            min_abi: Some(min_abi),
            features: Vec::new(),
        };
        assert!(check_landlock(Some(&abi(3)), &[]).is_err(), "not required");
        assert!(check_landlock(Some(&abi(0)), &req).is_err());
        assert!(check_landlock(Some(&abi(8)), &req).is_err());
        assert_eq!(check_landlock(Some(&abi(1)), &req).expect("1").min_abi, 1);
        assert_eq!(check_landlock(Some(&abi(7)), &req).expect("7").min_abi, 7);
        let twice = RawLandlock {
            min_abi: None,
            features: vec![LandlockFeature::Refer, LandlockFeature::Refer],
        };
        assert!(check_landlock(Some(&twice), &req).is_err());
        let two = RawLandlock {
            min_abi: None,
            features: vec![LandlockFeature::Refer, LandlockFeature::Filesystem],
        };
        assert_eq!(
            check_landlock(Some(&two), &req).expect("two").features,
            [LandlockFeature::Filesystem, LandlockFeature::Refer]
        );
    }

    /// A variable is named by a message only as a word of its own.
    #[test]
    fn a_variable_is_named_only_as_a_word_of_its_own() {
        for text in [
            "VAULT_TOKEN",
            "VAULT_TOKEN is not set",
            "missing (VAULT_TOKEN)",
            "MY_VAULT_TOKEN_FILE, and VAULT_TOKEN",
        ] {
            assert!(names_var(text, "VAULT_TOKEN"), "{text}");
        }
        for text in [
            "MY_VAULT_TOKEN_FILE",
            "XVAULT_TOKEN",
            "VAULT_TOKEN1",
            "X_VAULT_TOKEN",
            "",
        ] {
            assert!(!names_var(text, "VAULT_TOKEN"), "{text}");
        }
        for n in ["A_1", "A_*", "PATH", "_X"] {
            assert!(is_env_name(n), "{n}");
        }
        for n in ["", "*", "A-B", "A*B", "A B", "A.*"] {
            assert!(!is_env_name(n), "{n}");
        }
    }

    /// Each allowList-only field alone, under mode none, is refused by name.
    #[test]
    fn each_allow_list_field_needs_mode_allow_list() {
        for extra in [
            "allow: [{host: a.example, ports: [1]}]",
            "audit: true",
            "maxConnections: 3",
            "hosts: {a.example: [10.1.2.3]}",
            "searchDomains: true",
        ] {
            let net = format!("network: {{mode: none, {extra}}}");
            let err = with("network: {mode: none}", &net)
                .expect_err(&net)
                .to_string();
            assert!(
                err.contains("apply only to mode: allowList"),
                "{net}: {err}"
            );
        }
        assert!(with("network: {mode: none}", "network: {mode: none}").is_ok());
    }

    /// Each byte limit's floor holds at its edge, and the defaults of the two optional ones
    /// (dataBytes: the memory limit; addressSpaceBytes: 64 GiB).
    #[test]
    fn byte_limits_hold_at_their_floors() {
        let limits = |edit: (&str, u64)| {
            let mut fields = vec![
                ("wallSeconds", 1u64),
                ("memoryBytes", 16 << 20),
                ("pids", 8),
                ("cpuMillis", 10),
                ("outputBytes", 1024),
                ("openFiles", 64),
                ("fileSizeBytes", 1 << 20),
                ("diskBytes", 1 << 20),
            ];
            match fields.iter_mut().find(|(k, _)| *k == edit.0) {
                Some(f) => f.1 = edit.1,
                None => fields.push(edit),
            }
            let text: Vec<String> = fields.iter().map(|(k, v)| format!("{k}: {v}")).collect();
            let raw: RawLimits = from_yaml(&format!("{{{}}}", text.join(", ")), "").expect("yaml");
            check_limits(&raw)
        };
        let at_floor = limits(("memoryBytes", 16 << 20)).expect("floors");
        assert_eq!(at_floor.data_bytes, 16 << 20);
        assert_eq!(at_floor.address_space_bytes, 64 << 30);
        for (field, floor) in [
            ("memoryBytes", 16u64 << 20),
            ("fileSizeBytes", 1 << 20),
            ("diskBytes", 1 << 20),
            ("dataBytes", 16 << 20),
            ("addressSpaceBytes", 256 << 20),
        ] {
            assert!(limits((field, floor)).is_ok(), "{field} at {floor}");
            let err = limits((field, floor - 1)).expect_err(field).to_string();
            assert!(
                err.contains(&format!("must be at least {floor}")),
                "{field}: {err}"
            );
        }
    }

    /// A file of exactly MAX_FILE_BYTES is read whole; one byte more is refused by its size.
    #[test]
    fn files_are_read_whole_up_to_their_bound() {
        let dir = std::env::temp_dir().join(format!("cmpw-policy-bound-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("p.yaml");
        std::fs::write(&f, "x".repeat(MAX_FILE_BYTES as usize)).unwrap();
        let read = read_bounded(&f).map(|t| t.len());
        std::fs::write(&f, "x".repeat(MAX_FILE_BYTES as usize + 1)).unwrap();
        let over = read_bounded(&f).map(|t| t.len());
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(read.expect("at the bound"), MAX_FILE_BYTES as usize);
        let err = over.expect_err("past the bound").to_string();
        assert!(
            err.contains(&format!(
                "more than the {MAX_FILE_BYTES} bytes a policy file"
            )),
            "{err}"
        );
    }

    /// Namespaces required need one listed; listed without the requirement, or none without
    /// it, is fine. A pinned host is an exact name with an address. A profile path is
    /// relative, without `..`, and the embedded policy has only the default profile.
    #[test]
    fn namespaces_hosts_and_profile_paths_are_checked() {
        let req = "require: [uniqueUid, noNewPrivs, landlock, seccomp]";
        let ns = "namespaces: [mount, pid, net, ipc, uts, cgroup]";
        let both = |r: &str, n: &str| {
            Policy::parse(
                &DEFAULT_POLICY_YAML.replacen(req, r, 1).replacen(ns, n, 1),
                None,
            )
        };
        let required = "require: [uniqueUid, noNewPrivs, landlock, seccomp, namespaces]";
        assert!(both(required, "namespaces: []").is_err());
        assert!(both(required, ns).is_ok());
        assert!(both(req, "namespaces: []").is_ok());
        let net = "network: {mode: none}";
        for hosts in ["{a.example: []}", "{'*.a.example': [10.1.2.3]}"] {
            let n = format!(
                "network: {{mode: allowList, allow: [{{host: a.example, ports: [443]}}], hosts: {hosts}}}"
            );
            let err = with(net, &n).expect_err(hosts).to_string();
            assert!(
                err.contains("an exact name with at least one address"),
                "{err}"
            );
        }
        let profile = "profile: seccomp/default.json";
        for p in [
            "profile: ''",
            "profile: /etc/seccomp.json",
            "profile: ../seccomp/x.json",
        ] {
            let err = with(profile, p).expect_err(p).to_string();
            assert!(
                err.contains("must be a relative path without '..'"),
                "{p}: {err}"
            );
        }
        let err = with(profile, "profile: seccomp/other.json")
            .expect_err("embedded")
            .to_string();
        assert!(
            err.contains("the embedded policy can only use seccomp/default.json"),
            "{err}"
        );
    }

    /// Under allowList, the allow list's own warnings (a cidr covering loopback without
    /// `internal: true`) are the policy's.
    #[test]
    fn an_allow_lists_warnings_are_the_policys() {
        assert!(
            Policy::default_policy()
                .expect("default")
                .warnings()
                .is_empty()
        );
        let p = with(
            "network: {mode: none}",
            "network: {mode: allowList, allow: [{cidr: 127.0.0.0/8, ports: [80]}]}",
        )
        .expect("policy");
        assert!(!p.warnings().is_empty(), "{:?}", p.warnings());
    }

    #[test]
    fn any_namespace_is_some_and_none_is_none() {
        let none = Namespaces::default();
        assert!(!none.any());
        let each = [
            Namespaces {
                mount: true,
                ..none
            },
            Namespaces { pid: true, ..none },
            Namespaces { net: true, ..none },
            Namespaces { ipc: true, ..none },
            Namespaces { uts: true, ..none },
            Namespaces {
                cgroup: true,
                ..none
            },
        ];
        for n in each {
            assert!(n.any(), "{n:?}");
        }
    }

    #[test]
    fn policy_files_are_yaml_in_any_case_and_not_hidden() {
        for name in ["a.yaml", "a.yml", "A.YAML", "b.Yml"] {
            assert!(is_policy_file_name(name), "{name}");
        }
        for name in [".a.yaml", ".a.yml", "a.json", "a.yaml.bak", "yaml"] {
            assert!(!is_policy_file_name(name), "{name}");
        }
    }

    #[test]
    fn policy_paths_are_absolute_and_normalised() {
        assert!(is_policy_path("/opt/tools"));
        for p in [
            "opt/tools",
            "/opt/./tools",
            "/opt/../etc",
            "/opt//tools",
            "./x",
        ] {
            assert!(!is_policy_path(p), "{p}");
        }
    }
}

#[cfg(test)]
mod set_tests {
    use super::*;
    use crate::select::{APP_VAR, Identity, PROJECT_VAR};

    /// The default policy's text made a selected one: `name`, `select`, without the
    /// node-wide fields, with `edits` applied.
    fn selected(name: &str, select: &str, edits: &[(&str, &str)]) -> String {
        let mut t = testkit::selected_policy(DEFAULT_POLICY_YAML, name, select);
        for (from, to) in edits {
            assert!(t.contains(from), "{from}");
            t = t.replacen(from, to, 1);
        }
        t
    }

    fn set(files: &[(&str, String)]) -> Result<PolicySet, PolicyError> {
        let texts: Vec<(String, String)> = files
            .iter()
            .map(|(f, t)| (f.to_string(), t.clone()))
            .collect();
        PolicySet::from_texts("policies", &texts, None)
    }

    /// A policy directory loads `*.yaml` and `*.yml` in any case, and names every other entry
    /// it skips (a policy saved as `team-a.yml` once fell to the default unnoticed), except a
    /// ConfigMap volume's own `..` entries.
    #[test]
    fn a_policy_directory_loads_yml_in_any_case_and_names_what_it_skips() {
        let dir = std::env::temp_dir().join(format!("cmpw-policy-dir-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("..2026_11_27").join("x")).unwrap();
        std::fs::create_dir_all(dir.join("sub.yaml")).unwrap();
        std::os::unix::fs::symlink("..2026_11_27", dir.join("..data")).unwrap();
        std::fs::create_dir_all(dir.join("seccomp")).unwrap();
        std::fs::write(
            dir.join("seccomp/default.json"),
            crate::seccomp::DEFAULT_SECCOMP_JSON,
        )
        .unwrap();
        let files = [
            ("default.yaml", DEFAULT_POLICY_YAML.to_owned()),
            (
                "team-a.yml",
                selected("team-a", "{projects: [team-a]}", &[]),
            ),
            (
                "team-b.YAML",
                selected("team-b", "{projects: [team-b]}", &[]),
            ),
            (
                "team-c.Yml",
                selected("team-c", "{projects: [team-c]}", &[]),
            ),
            (
                ".team-d.yaml",
                selected("team-d", "{projects: [team-d]}", &[]),
            ),
            ("README.md", "policies\n".to_owned()),
        ];
        for (f, t) in &files {
            std::fs::write(dir.join(f), t).unwrap();
        }
        let set = PolicySet::load(&dir).expect("set");
        let _ = std::fs::remove_dir_all(&dir);
        let names: Vec<&str> = set.policies().iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["default", "team-a", "team-b", "team-c"]);
        assert_eq!(
            set.policies()[set.select(&project("team-a"))].name,
            "team-a"
        );
        assert_eq!(
            set.skipped(),
            [
                ".team-d.yaml: hidden (policies are *.yaml or *.yml)",
                "README.md: not *.yaml or *.yml",
                "sub.yaml: not a regular file",
            ]
        );
        assert!(is_policy_file_name("a.YmL") && !is_policy_file_name("a.yaml.bak"));
    }

    /// A directory of this test process's own, removed when dropped.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(tag: &str) -> Scratch {
            let d = std::env::temp_dir().join(format!("cmpw-policy-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&d);
            std::fs::create_dir_all(&d).unwrap();
            Scratch(d)
        }

        fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// A policy file that is a symbolic link out of the directory is skipped and named (a
    /// policy is read from the reviewed directory alone); a link inside it is read (a
    /// ConfigMap's files are links into `..data`).
    #[test]
    fn a_link_out_of_the_directory_is_skipped_and_one_inside_is_read() {
        let dir = Scratch::new("link");
        let outside = Scratch::new("link-outside");
        std::fs::create_dir_all(dir.path().join("seccomp")).unwrap();
        std::fs::write(
            dir.path().join("seccomp/default.json"),
            crate::seccomp::DEFAULT_SECCOMP_JSON,
        )
        .unwrap();
        std::fs::write(dir.path().join("default.yaml"), DEFAULT_POLICY_YAML).unwrap();
        std::fs::create_dir_all(dir.path().join("..data")).unwrap();
        std::fs::write(
            dir.path().join("..data/team-a.yaml"),
            selected("team-a", "{projects: [team-a]}", &[]),
        )
        .unwrap();
        std::os::unix::fs::symlink("..data/team-a.yaml", dir.path().join("team-a.yaml")).unwrap();
        let foreign = outside.path().join("team-b.yaml");
        std::fs::write(&foreign, selected("team-b", "{projects: [team-b]}", &[])).unwrap();
        std::os::unix::fs::symlink(&foreign, dir.path().join("team-b.yaml")).unwrap();
        let set = PolicySet::load(dir.path()).expect("set");
        let names: Vec<&str> = set.policies().iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["default", "team-a"]);
        assert_eq!(
            set.skipped(),
            ["team-b.yaml: a symbolic link out of the directory (policies are read from it alone)"]
        );
    }

    /// Each policy of a set names the file it was read from; no file past the last.
    #[test]
    fn each_policy_names_its_file() {
        let set = set(&[
            ("default.yaml", DEFAULT_POLICY_YAML.to_owned()),
            (
                "team-a.yaml",
                selected("team-a", "{projects: [team-a]}", &[]),
            ),
        ])
        .expect("set");
        assert_eq!(set.source(0), Some("default.yaml"));
        assert_eq!(set.source(1), Some("team-a.yaml"));
        assert_eq!(set.source(2), None);
    }

    /// A directory holds at most MAX_POLICIES policy files: that many load, one more is
    /// refused by name.
    #[test]
    fn a_directory_holds_at_most_max_policies() {
        let dir = Scratch::new("max");
        std::fs::create_dir_all(dir.path().join("seccomp")).unwrap();
        std::fs::write(
            dir.path().join("seccomp/default.json"),
            crate::seccomp::DEFAULT_SECCOMP_JSON,
        )
        .unwrap();
        std::fs::write(dir.path().join("default.yaml"), DEFAULT_POLICY_YAML).unwrap();
        for i in 1..MAX_POLICIES {
            let name = format!("p{i:03}");
            let text = selected(&name, &format!("{{projects: [{name}]}}"), &[]);
            std::fs::write(dir.path().join(format!("{name}.yaml")), text).unwrap();
        }
        let set = PolicySet::load(dir.path()).expect("MAX_POLICIES files");
        assert_eq!(set.policies().len(), MAX_POLICIES);
        let text = selected("extra", "{projects: [extra]}", &[]);
        std::fs::write(dir.path().join("extra.yaml"), text).unwrap();
        let err = PolicySet::load(dir.path())
            .expect_err("one more")
            .to_string();
        assert!(
            err.contains(&format!(
                "{} policy files, more than the {MAX_POLICIES} a directory may hold",
                MAX_POLICIES + 1
            )),
            "{err}"
        );
    }

    fn project(p: &str) -> Identity {
        Identity::from_env([(PROJECT_VAR, p)]).unwrap()
    }

    #[test]
    fn a_selected_policy_takes_the_node_wide_fields_from_the_default() {
        let team_a = selected(
            "team-a",
            "{projects: [team-a]}",
            &[(
                "pass: [PATH, LANG, LC_ALL, TZ]",
                "pass: [PATH, TEAM_A_VAULT_TOKEN]",
            )],
        );
        let s = set(&[
            ("default.yaml", DEFAULT_POLICY_YAML.to_owned()),
            ("team-a.yaml", team_a),
        ])
        .expect("set");
        let (d, a) = (&s.policies()[0], &s.policies()[1]);
        assert_eq!((a.uid_first, a.uid_count), (d.uid_first, d.uid_count));
        assert_eq!(a.require, d.require);
        assert_eq!(a.cache, d.cache);
        assert_eq!(a.env_pass, ["PATH", "TEAM_A_VAULT_TOKEN"]);
        assert_ne!(a.sha256, d.sha256);
        assert_eq!(s.select(&project("team-a")), 1);
        assert_eq!(s.select(&project("team-b")), 0);
        assert_eq!(s.select(&Identity::default()), 0);
    }

    #[test]
    fn node_wide_fields_in_a_selected_policy_are_refused_by_name() {
        for (line, field) in [
            ("  require: [seccomp]\n", "spec.require"),
            ("  uidRange: {first: 30000, count: 10}\n", "spec.uidRange"),
            ("  namespaces: [mount]\n", "spec.namespaces"),
            ("  cache: {enabled: false}\n", "spec.cache"),
        ] {
            let t = selected("team-a", "{projects: [team-a]}", &[]).replacen(
                "spec:\n",
                &format!("spec:\n{line}"),
                1,
            );
            let e = set(&[
                ("default.yaml", DEFAULT_POLICY_YAML.to_owned()),
                ("team-a.yaml", t),
            ])
            .expect_err(field)
            .to_string();
            assert!(e.starts_with("team-a.yaml: "), "{e}");
            assert!(e.contains(&format!("{field}: is node-wide")), "{e}");
        }
    }

    #[test]
    fn the_set_needs_one_default_distinct_names_and_no_ties() {
        let a = || selected("team-a", "{projects: [team-a]}", &[]);
        let d = || DEFAULT_POLICY_YAML.to_owned();
        let e = set(&[("a.yaml", a())]).expect_err("no default").to_string();
        assert!(
            e.contains("exactly one default") && e.contains("none"),
            "{e}"
        );
        let e = set(&[("d1.yaml", d()), ("d2.yaml", d())])
            .expect_err("two defaults")
            .to_string();
        assert!(e.contains("d1.yaml, d2.yaml"), "{e}");
        let e = set(&[("d.yaml", d()), ("a.yaml", a()), ("b.yaml", a())])
            .expect_err("one name twice")
            .to_string();
        assert!(e.contains("\"team-a\" is used by a.yaml and b.yaml"), "{e}");
        let b = selected("team-b", "{projects: [team-b, team-a]}", &[]);
        let e = set(&[("d.yaml", d()), ("a.yaml", a()), ("b.yaml", b)])
            .expect_err("a tie")
            .to_string();
        assert!(e.contains("a.yaml (team-a) and b.yaml (team-b)"), "{e}");
        // More specific is not a tie: the app's own policy wins over its project's.
        let app = selected("one-app", "{projects: [team-a], apps: [billing]}", &[]);
        let s = set(&[("d.yaml", d()), ("a.yaml", a()), ("app.yaml", app)]).expect("set");
        let billing = Identity::from_env([(PROJECT_VAR, "team-a"), (APP_VAR, "billing")]).unwrap();
        assert_eq!(s.policies()[s.select(&billing)].name, "one-app");
        assert_eq!(s.policies()[s.select(&project("team-a"))].name, "team-a");
    }

    #[test]
    fn select_is_only_for_a_policy_directory() {
        let t = selected("team-a", "{projects: [team-a]}", &[]);
        let e = Policy::parse(&t, None).expect_err("select").to_string();
        assert!(
            e.contains("spec.select") && e.contains("--policy DIR"),
            "{e}"
        );
        let e = set(&[
            ("d.yaml", DEFAULT_POLICY_YAML.to_owned()),
            ("a.yaml", selected("team-a", "{}", &[])),
        ])
        .expect_err("empty select")
        .to_string();
        assert!(e.contains("spec.select: names no projects"), "{e}");
        let e = Policy::parse(
            &DEFAULT_POLICY_YAML.replacen("  uidRange: {first: 20000, count: 40000}\n", "", 1),
            None,
        )
        .expect_err("no range")
        .to_string();
        assert!(e.contains("spec.uidRange: is required"), "{e}");
    }
}

#[cfg(test)]
mod chart_tests {
    use super::*;

    /// The Helm chart refuses an unknown policy field before the pod starts
    /// (deploy/helm/cmp-warden/templates/configmaps.yaml) from its own list of spec fields: it
    /// must be exactly the fields this parser reads, or it would refuse a valid policy or let
    /// a misspelt field through to the pod's start-up.
    #[test]
    fn the_helm_charts_spec_fields_are_the_parsers() {
        let text = DEFAULT_POLICY_YAML.replacen("spec:\n", "spec:\n  zzz: 1\n", 1);
        let err = Policy::parse(&text, None)
            .expect_err("unknown field")
            .to_string();
        let (_, expected) = err.split_once("expected one of ").expect(&err);
        let mut parser: Vec<&str> = expected.split('`').skip(1).step_by(2).collect();
        let helpers = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../deploy/helm/cmp-warden/templates/_helpers.tpl"
        ))
        .expect("_helpers.tpl");
        let (_, rest) = helpers
            .split_once("define \"cmp-warden.policySpecFields\" -}}\n")
            .expect("the policySpecFields definition");
        let (list, _) = rest.split_once('\n').expect("its line");
        let mut chart: Vec<&str> = list.split_whitespace().collect();
        parser.sort_unstable();
        chart.sort_unstable();
        assert_eq!(chart, parser, "{err}");
    }
}
