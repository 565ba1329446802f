//! Reloads while serving: the policy file or directory and `plugin.yaml`, read as one set,
//! checked as start-up checks them (the supervisor's [`Supervisor::reload`]), and put in force
//! for new requests; a request keeps the set it started under to its end. Asked for by a change
//! in either directory (inotify, which sees Kubernetes' `..data` swap of a ConfigMap volume), by
//! SIGHUP, and by a periodic check ([`RELOAD_CHECK`]). Each reload that changed something is
//! audited ([`ReloadEvent`]), counted (`cmp_warden_config_reloads_total{result}`) and logged.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use audit_event::{FileChange, PolicyRef, RELOAD, ReloadEvent, SCHEMA};
use plugin::PluginConfig;
use policy::PolicySet;
use sha2::{Digest, Sha256};
use supervisor::Supervisor;

use crate::audit::AuditSink;
use crate::metrics::Metrics;

/// How often the files are compared with the set in force when nothing else asked: the
/// fallback where inotify misses a change (a network file system, a watch limit reached).
pub const RELOAD_CHECK: Duration = Duration::from_secs(30);

/// A change is read this long after the last event of a burst (a ConfigMap update is several).
const SETTLE: Duration = Duration::from_millis(200);

/// The longest a burst of changes is waited out before the files are read.
const BURST: Duration = Duration::from_secs(5);

/// A check that takes longer than this is reported (the files are on a slow or stuck mount).
const SLOW_CHECK: Duration = Duration::from_secs(5);

use supervisor::Current;

/// The set in force: every policy's plan and the `plugin.yaml` they run, replaced as one. A
/// request reads it once, when its header arrives, and runs under that one generation of
/// both to its end; a reload puts a new one in force in one step.
#[derive(Debug)]
pub struct ConfigSet {
    /// Every policy's plan, the default first (the supervisor's set in force).
    pub plans: Arc<supervisor::Plans>,
    /// `plugin.yaml`.
    pub plugin: Arc<PluginConfig>,
}

/// What asked for a reload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// A change in a watched directory.
    Inotify,
    /// SIGHUP.
    Signal,
    /// The periodic check.
    Periodic,
}

impl Trigger {
    fn as_str(self) -> &'static str {
        match self {
            Trigger::Inotify => "inotify",
            Trigger::Signal => "signal",
            Trigger::Periodic => "periodic",
        }
    }
}

/// What a check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The files are the set in force (or the set refused last time, unchanged).
    Unchanged,
    /// The new set is in force.
    Accepted,
    /// The set in force stays; why.
    Refused(String),
}

/// The file in the parent of `serve`'s work directory (`--work-dir`, beside `_cmp_server`) that
/// says which set is in force, for `doctor`.
pub const IN_FORCE_FILE: &str = "cmp-warden-in-force.json";

/// Which set a running server has in force, and its last refused reload: written to
/// [`IN_FORCE_FILE`] at start-up and after every reload, read back by `doctor` through this
/// type (the server's log and `cmp_warden_config_info` say the same).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct InForce {
    /// The server's process ID (a file a dead server left says nothing).
    pub pid: u32,
    /// RFC 3339 UTC time the set was put in force (start-up or the reload that accepted it).
    pub since: String,
    /// The policies in force, the default first.
    pub policies: Vec<PolicyRef>,
    /// SHA-256 of plugin.yaml in force.
    pub plugin_sha256: String,
    /// SHA-256 of each file of the set in force, by the path the operator knows it by.
    pub files: BTreeMap<String, String>,
    /// The last reload refused since then (the set in force stayed), with its reason.
    pub last_refused: Option<ReloadEvent>,
}

impl InForce {
    /// What the server whose work directory is under `work_parent` has in force: `None` when
    /// no server wrote it or the one that did has exited.
    pub fn read(work_parent: &Path) -> Option<Result<InForce, String>> {
        let path = work_parent.join(IN_FORCE_FILE);
        let text = std::fs::read_to_string(&path).ok()?;
        let parsed =
            serde_json::from_str::<InForce>(&text).map_err(|e| format!("{}: {e}", path.display()));
        match parsed {
            Ok(f) if !Path::new(&format!("/proc/{}", f.pid)).exists() => None,
            other => Some(other),
        }
    }

    /// Written whole, then renamed over the last one (a reader sees one or the other).
    fn write(&self, dir: &Path) -> std::io::Result<()> {
        let tmp = dir.join(format!(".{IN_FORCE_FILE}.tmp"));
        let text = serde_json::to_string_pretty(self).map_err(std::io::Error::other)?;
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, dir.join(IN_FORCE_FILE))
    }
}

/// Where the configuration comes from.
#[derive(Debug, Clone)]
pub struct Sources {
    /// `--policy`: a file or a directory (`None`: the embedded default, never reloaded).
    pub policy: Option<PathBuf>,
    /// `--config-dir-path`, holding plugin.yaml.
    pub plugin_dir: PathBuf,
}

/// SHA-256 of each file of a set, by the path the operator knows it by.
type Files = BTreeMap<String, String>;

/// A set as read from the files.
struct Read {
    policies: Option<PolicySet>,
    plugin: PluginConfig,
    files: Files,
}

/// The reloader: what is in force, and everything a reload touches.
pub struct Reloader {
    sources: Sources,
    supervisor: Arc<Supervisor>,
    config: Arc<Current<ConfigSet>>,
    audit: AuditSink,
    metrics: Arc<Metrics>,
    /// What is in force, and what was refused last.
    state: Mutex<State>,
    /// Set by SIGHUP.
    hup: Arc<AtomicBool>,
    /// The directories' watch, made before the files in force were read.
    watch: Mutex<Option<std::io::Result<Watch>>>,
    /// Where [`InForce`] is written (the parent of `serve`'s work directory), if anywhere.
    status_dir: Option<PathBuf>,
}

/// The set in force as the reloader knows it.
struct State {
    /// SHA-256 of each of its files.
    files: Files,
    /// RFC 3339 UTC time it was put in force (start-up, or the reload that accepted it).
    since: String,
    /// The set refused since then (not tried again until its files change, or SIGHUP asks),
    /// with its reload's event.
    refused: Option<(Files, ReloadEvent)>,
}

/// The files as start-up is about to read them, and a watch on their directories made first:
/// a change after this is seen (by the watch, else by the periodic check), even one made
/// before serving began.
#[derive(Debug)]
pub struct Baseline {
    watch: std::io::Result<Watch>,
    files: Files,
}

impl Baseline {
    /// Call before the policies and plugin.yaml are loaded.
    pub fn take(sources: &Sources) -> Baseline {
        let watch = Watch::new(sources);
        let files = match read(sources) {
            Ok(r) => r.files,
            Err((files, _)) => files,
        };
        Baseline { watch, files }
    }
}

impl std::fmt::Debug for Reloader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloader")
            .field("sources", &self.sources)
            .finish_non_exhaustive()
    }
}

impl Reloader {
    /// A reloader whose set in force is what `baseline` found (start-up read the files after
    /// it). SIGHUP asks it for a reload from now on (instead of ending the process).
    pub fn new(
        sources: Sources,
        baseline: Baseline,
        supervisor: Arc<Supervisor>,
        config: Arc<Current<ConfigSet>>,
        audit: AuditSink,
        metrics: Arc<Metrics>,
    ) -> std::io::Result<Self> {
        let hup = Arc::new(AtomicBool::new(false));
        signal_hook::flag::register(signal_hook::consts::SIGHUP, hup.clone())?;
        let Baseline { watch, files } = baseline;
        let r = Reloader {
            watch: Mutex::new(Some(watch)),
            sources,
            supervisor,
            config,
            audit,
            metrics,
            state: Mutex::new(State {
                files,
                since: crate::audit::rfc3339_now(),
                refused: None,
            }),
            hup,
            status_dir: None,
        };
        r.publish();
        Ok(r)
    }

    /// Remove what [`Self::with_status_dir`] wrote (serving has ended).
    pub fn withdraw(&self) {
        if let Some(dir) = &self.status_dir {
            let _ = std::fs::remove_file(dir.join(IN_FORCE_FILE));
        }
    }

    /// Also write the set in force to `dir` ([`InForce`], for `doctor`), now and after each
    /// reload.
    pub fn with_status_dir(mut self, dir: PathBuf) -> Self {
        self.status_dir = Some(dir);
        self.publish();
        self
    }

    /// Compare the files with the set in force; put a changed set in force if it passes every
    /// check, else keep the one in force and say why.
    pub fn check(&self, trigger: Trigger) -> Outcome {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        // A read that fails is read once more after a pause: the kubelet removes the old
        // version's directory right after its swap, and a read that resolved `..data` before
        // the swap can find its files gone; a set that is broken is broken both times.
        let began = Instant::now();
        let read = read(&self.sources).or_else(|_| {
            std::thread::sleep(SETTLE);
            read(&self.sources)
        });
        if began.elapsed() > SLOW_CHECK {
            tracing::warn!(
                trigger = trigger.as_str(),
                seconds = began.elapsed().as_secs(),
                "reading the configuration for a reload was slow: the policy and config directories are on a slow or stuck file system"
            );
        }
        let files = match &read {
            Ok(r) => r.files.clone(),
            Err((files, _)) => files.clone(),
        };
        let refused_before = state.refused.as_ref().map(|(f, _)| f);
        if files == state.files || (trigger != Trigger::Signal && refused_before == Some(&files)) {
            return Outcome::Unchanged;
        }
        let changes = changes(&state.files, &files);
        let reason = match read {
            Err((_, why)) => Some(why),
            Ok(r) => self.apply(r).err(),
        };
        let event = ReloadEvent {
            log: "audit".to_owned(),
            schema: SCHEMA.to_owned(),
            event: RELOAD.to_owned(),
            time: crate::audit::rfc3339_now(),
            trigger: trigger.as_str().to_owned(),
            result: if reason.is_none() {
                "accepted"
            } else {
                "refused"
            }
            .to_owned(),
            reason: reason.clone(),
            files: changes,
            policies: self.policies_in_force(),
            plugin_sha256: plugin_sha256(
                if reason.is_none() {
                    &files
                } else {
                    &state.files
                },
                &self.sources,
            ),
        };
        if reason.is_none() {
            *state = State {
                files,
                since: event.time.clone(),
                refused: None,
            };
        } else {
            state.refused = Some((files, event.clone()));
        }
        drop(state);
        self.audit.emit_reload(&event);
        self.metrics.reloaded(&event.result);
        self.publish();
        match reason {
            None => {
                tracing::info!(trigger = trigger.as_str(), policies = %policy_list(&event.policies), plugin_sha256 = %event.plugin_sha256, "configuration reloaded: new requests run under it");
                Outcome::Accepted
            }
            Some(why) => {
                tracing::warn!(trigger = trigger.as_str(), reason = %why, "CONFIGURATION RELOAD REFUSED: the set in force stays");
                Outcome::Refused(why)
            }
        }
    }

    /// Check the new set and put it in force: the policies through the supervisor (probed as
    /// at start-up), then the policies' plans and plugin.yaml together, in one step.
    fn apply(&self, r: Read) -> Result<(), String> {
        let old = self.config.current();
        if r.plugin.plugin_name() != old.plugin.plugin_name() {
            return Err(format!(
                "plugin.yaml names the plugin {:?} (metadata.name and spec.version), not {:?}: the socket's name comes from them; restart the server to rename it",
                r.plugin.plugin_name(),
                old.plugin.plugin_name()
            ));
        }
        let plans = match &r.policies {
            Some(set) => self.supervisor.reload(set).map_err(|e| e.to_string())?.new,
            None => old.plans.clone(),
        };
        self.config.replace(ConfigSet {
            plans,
            plugin: Arc::new(r.plugin),
        });
        Ok(())
    }

    /// The set in force as metrics and, with a status directory, as [`InForce`] for doctor.
    fn publish(&self) {
        let policies = self.policies_in_force();
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let plugin_sha256 = plugin_sha256(&state.files, &self.sources);
        self.metrics
            .set_config(policy_list(&policies), plugin_sha256.clone());
        let Some(dir) = &self.status_dir else {
            return;
        };
        let in_force = InForce {
            pid: std::process::id(),
            since: state.since.clone(),
            policies,
            plugin_sha256,
            files: state.files.clone(),
            last_refused: state.refused.as_ref().map(|(_, e)| e.clone()),
        };
        drop(state);
        if let Err(e) = in_force.write(dir) {
            tracing::warn!(dir = %dir.display(), error = %e, "could not write the set in force for doctor (doctor will not name it)");
        }
    }

    /// The policies in force (name and SHA-256 each, the default first).
    fn policies_in_force(&self) -> Vec<PolicyRef> {
        self.config
            .current()
            .plans
            .all()
            .iter()
            .map(|p| crate::audit::policy_ref(p))
            .collect()
    }

    /// Watch the sources until `stop`: inotify on their directories, SIGHUP, and the periodic
    /// check. The thread wakes at least once a second to see `stop` and the signal.
    pub fn spawn(
        self: Arc<Self>,
        stop: Arc<AtomicBool>,
    ) -> std::io::Result<std::thread::JoinHandle<()>> {
        let watch = self
            .watch
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .unwrap_or_else(|| Watch::new(&self.sources));
        if let Err(e) = &watch {
            tracing::warn!(error = %e, interval_seconds = RELOAD_CHECK.as_secs(), "configuration changes are not watched (inotify); they are found by the periodic check and SIGHUP");
        }
        std::thread::Builder::new()
            .name("config-reload".into())
            .spawn(move || {
                let watch = watch.ok();
                let mut next = Instant::now() + RELOAD_CHECK;
                while !stop.load(Ordering::Relaxed) {
                    let changed = watch
                        .as_ref()
                        .is_some_and(|w| w.wait(Duration::from_secs(1)));
                    if changed {
                        // The rest of the burst, but never longer than BURST: a file written
                        // over and over must not keep every later change from being applied.
                        let until = Instant::now() + BURST;
                        while Instant::now() < until
                            && watch.as_ref().is_some_and(|w| w.wait(SETTLE))
                        {
                        }
                    } else if watch.is_none() {
                        std::thread::sleep(Duration::from_secs(1));
                    }
                    let trigger = if self.hup.swap(false, Ordering::Relaxed) {
                        Trigger::Signal
                    } else if changed {
                        Trigger::Inotify
                    } else if Instant::now() >= next {
                        Trigger::Periodic
                    } else {
                        continue;
                    };
                    next = Instant::now() + RELOAD_CHECK;
                    if !stop.load(Ordering::Relaxed) {
                        self.check(trigger);
                    }
                }
            })
    }
}

fn policy_list(policies: &[PolicyRef]) -> String {
    policies
        .iter()
        .map(|p| format!("{}={}", p.name, p.sha256))
        .collect::<Vec<_>>()
        .join(",")
}

/// A directory as its files are now: a Kubernetes volume's `..data` (the timestamped
/// directory it points to), so a set is read from one version of it whole, never half of an
/// update; the directory itself otherwise.
fn resolved(dir: &Path) -> PathBuf {
    let data = dir.join("..data");
    if data.exists() {
        std::fs::canonicalize(&data).unwrap_or(data)
    } else {
        dir.to_path_buf()
    }
}

/// SHA-256 of plugin.yaml among `files` (a set's).
fn plugin_sha256(files: &Files, s: &Sources) -> String {
    files.get(&plugin_key(s)).cloned().unwrap_or_default()
}

fn plugin_key(s: &Sources) -> String {
    s.plugin_dir.join("plugin.yaml").display().to_string()
}

/// The set the files hold now, with each file's SHA-256; or, when it cannot be read, the files
/// as far as they were hashed and why.
fn read(s: &Sources) -> Result<Read, (Files, String)> {
    let mut files = Files::new();
    let plugin_dir = resolved(&s.plugin_dir);
    let plugin_text = policy::policy::read_bounded(&plugin_dir.join("plugin.yaml"));
    if let Ok(t) = &plugin_text {
        files.insert(plugin_key(s), sha256(t.as_bytes()));
    }
    // Where the policies were read from, and the name the operator knows that by.
    let mut read_from = None;
    let policies = match &s.policy {
        None => None,
        Some(p) if p.is_dir() => {
            let dir = resolved(p);
            hash_policy_files(&dir, p, &mut files);
            read_from = Some((dir.clone(), p.clone()));
            Some(PolicySet::load(&dir).map_err(|e| format!("{}: {e}", p.display())))
        }
        Some(p) => {
            if let Ok(t) = policy::policy::read_bounded(p) {
                files.insert(p.display().to_string(), sha256(t.as_bytes()));
            }
            Some(PolicySet::load(p).map_err(|e| format!("{}: {e}", p.display())))
        }
    };
    let policies = match policies.transpose() {
        Ok(p) => p,
        Err(why) => return Err((files, why)),
    };
    // The seccomp profiles the policies name, wherever they are (under the policy
    // directory's version, by their name under the directory: hashed above).
    for p in policies.iter().flat_map(|s| s.policies()) {
        let path = &p.seccomp_profile;
        let shown = match &read_from {
            Some((dir, p)) => match path.strip_prefix(dir) {
                Ok(rest) => p.join(rest),
                Err(_) => path.clone(),
            },
            None => path.clone(),
        };
        if let Ok(t) = policy::policy::read_bounded(path) {
            files
                .entry(shown.display().to_string())
                .or_insert_with(|| sha256(t.as_bytes()));
        }
    }
    let plugin = match plugin_text {
        Err(e) => Err(format!("{}: {e}", plugin_key(s))),
        Ok(t) => PluginConfig::parse(&t)
            .map(|l| l.config)
            .map_err(|e| format!("{}: {e}", plugin_key(s))),
    };
    match plugin {
        Ok(plugin) => Ok(Read {
            policies,
            plugin,
            files,
        }),
        Err(why) => Err((files, why)),
    }
}

/// The policy files of `dir`, named as under `shown`: its `*.yaml` and `*.yml` entries (what
/// [`PolicySet::load`] reads; not Kubernetes' `..` ones), and the `*.json` seccomp profiles in
/// its subdirectories one level down. A link is followed only to a file inside the directory,
/// never to a directory (a link to `.` costs nothing), and each file is read at most
/// [`policy::policy::MAX_FILE_BYTES`], at most [`policy::policy::MAX_POLICIES`] of each kind:
/// a huge or endless file beside the policies is never read whole.
fn hash_policy_files(dir: &Path, shown: &Path, files: &mut Files) {
    let Ok(canonical) = std::fs::canonicalize(dir) else {
        return;
    };
    let mut hash = |dir: &Path,
                    shown: &Path,
                    wanted: fn(&str) -> bool,
                    subdirs: bool|
     -> Vec<(PathBuf, PathBuf)> {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return Vec::new();
        };
        let mut hashed = 0;
        let mut below = Vec::new();
        for e in entries.flatten() {
            let name = e.file_name();
            let n = name.to_string_lossy();
            if n.starts_with("..") {
                continue;
            }
            let path = e.path();
            // A real directory (never a link to one) is looked into, one level down.
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                if subdirs {
                    below.push((path, shown.join(&name)));
                }
                continue;
            }
            let inside = std::fs::canonicalize(&path).is_ok_and(|t| t.starts_with(&canonical));
            if !wanted(&n) || !inside || hashed == policy::policy::MAX_POLICIES {
                continue;
            }
            if let Ok(t) = policy::policy::read_bounded(&path) {
                hashed += 1;
                files.insert(
                    shown.join(&name).display().to_string(),
                    sha256(t.as_bytes()),
                );
            }
        }
        below
    };
    let profile = |n: &str| n.to_ascii_lowercase().ends_with(".json");
    for (sub, shown) in hash(dir, shown, policy::policy::is_policy_file_name, true) {
        hash(&sub, &shown, profile, false);
    }
}

fn sha256(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Every file that differs between `old` and `new`.
fn changes(old: &Files, new: &Files) -> Vec<FileChange> {
    let mut paths: Vec<&String> = old.keys().chain(new.keys()).collect();
    paths.sort();
    paths.dedup();
    paths
        .into_iter()
        .filter(|p| old.get(*p) != new.get(*p))
        .map(|p| FileChange {
            path: p.clone(),
            old_sha256: old.get(p).cloned(),
            new_sha256: new.get(p).cloned(),
        })
        .collect()
}

/// inotify on the sources' directories (a policy file's own directory), for any entry made,
/// moved, written or removed there: `..data`'s swap is a rename into the directory.
#[derive(Debug)]
struct Watch {
    fd: rustix::fd::OwnedFd,
}

impl Watch {
    fn new(s: &Sources) -> std::io::Result<Watch> {
        use rustix::fs::inotify;
        let fd = inotify::init(inotify::CreateFlags::CLOEXEC | inotify::CreateFlags::NONBLOCK)?;
        let mask = inotify::WatchFlags::CREATE
            | inotify::WatchFlags::MOVED_TO
            | inotify::WatchFlags::MOVED_FROM
            | inotify::WatchFlags::CLOSE_WRITE
            | inotify::WatchFlags::DELETE
            | inotify::WatchFlags::ATTRIB;
        let mut dirs = vec![s.plugin_dir.clone()];
        if let Some(p) = &s.policy {
            dirs.push(if p.is_dir() {
                p.clone()
            } else {
                p.parent()
                    .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
            });
        }
        for d in dirs {
            inotify::add_watch(&fd, &d, mask)?;
        }
        Ok(Watch { fd })
    }

    /// Whether an event arrived within `limit` (every pending one is read).
    fn wait(&self, limit: Duration) -> bool {
        use rustix::event::{PollFd, PollFlags, Timespec, poll};
        let mut fds = [PollFd::new(&self.fd, PollFlags::IN)];
        let timeout = Timespec::try_from(limit).ok();
        if !matches!(poll(&mut fds, timeout.as_ref()), Ok(n) if n > 0) {
            return false;
        }
        let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 4096];
        let mut reader = rustix::fs::inotify::Reader::new(&self.fd, &mut buf);
        let mut any = false;
        while reader.next().is_ok() {
            any = true;
        }
        any
    }
}
