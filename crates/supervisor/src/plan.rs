//! The one translation of a [`Policy`] into what the runtime enforces. Every command (`serve`,
//! `render`, `appset serve`, `doctor`) gets its archive limits, rlimits, cgroup limits,
//! namespaces, Landlock paths, seccomp filter, output and time budgets from here, and nowhere
//! else reads those policy fields; the flags that override a policy value are applied here too.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use plugin::PluginConfig;
use policy::select::GivenTwice;
use policy::{Identity, NetworkMode, Policy, PolicySet, Protection, Select};

use cgroups::CgroupLimits;
use jail_wire::protocol::{Creds, DiskLimit, Rlimits, Sandbox};
use jail_wire::spec::Task;
use seccomp::{CompiledFilter, SeccompError};
use std::sync::Arc;
use vocab::request::{Operation, TimeLimit};

/// RLIMIT_NPROC above the cgroup's pids limit (the jail's own threads and the reclaim helper).
const NPROC_HEADROOM: u64 = 16;

/// Values the command line sets over the policy's.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// `--max-compressed`: over `spec.archive.compressedBytes`.
    pub compressed_bytes: Option<u64>,
    /// `--output-bytes`: over `spec.limits.outputBytes`.
    pub output_bytes: Option<u64>,
    /// `ARGOCD_EXEC_TIMEOUT`: a per-command limit (the policy has none), with its text.
    pub command_timeout: Option<(Duration, String)>,
    /// `ARGOCD_GRPC_MAX_SIZE_MB`: the most one reply may carry (default 100 MiB, Argo's).
    pub reply_bytes: Option<u64>,
}

/// Argo CD's default gRPC message limit (`ARGOCD_GRPC_MAX_SIZE_MB` = 100).
pub const DEFAULT_REPLY_BYTES: u64 = 100 << 20;

/// What a policy (with the command line's overrides) means at run time.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Its place among the server's plans (0: the default).
    pub index: PolicyIndex,
    /// The requests it is for (`spec.select`; `None`: the default).
    pub select: Option<Select>,
    /// The policy's name and SHA-256 (audit events name them).
    pub policy_name: String,
    /// SHA-256 of the policy text.
    pub policy_sha256: String,
    /// Protections whose absence stops start-up.
    pub require: Vec<Protection>,
    /// Every archive limit (`spec.archive`, `--max-compressed`).
    pub archive: archive::Options,
    /// Per-command stdout and stderr budget (`spec.limits.outputBytes`, `--output-bytes`).
    pub output_bytes: u64,
    /// The most one reply may carry (`ARGOCD_GRPC_MAX_SIZE_MB`).
    pub reply_bytes: u64,
    /// The per-request wall clock (`spec.limits.wallSeconds`).
    pub wall_clock: Duration,
    /// The per-command limit (`ARGOCD_EXEC_TIMEOUT`).
    pub command_timeout: Option<(Duration, String)>,
    /// The leased UID range (`spec.uidRange`).
    pub uid_range: (u32, u32),
    /// Per-request cgroup limits (`spec.limits.memoryBytes`, `pids`, `cpuMillis`).
    pub cgroup: CgroupLimits,
    /// The server's variables commands get (`spec.env.pass`), read once at start-up.
    pub base_env: Vec<(String, String)>,
    /// Names of the server's variables `spec.env.pass` keeps from commands (logged at
    /// start-up, listed by doctor, named when a request fails; never their values).
    pub withheld_env: Vec<String>,
    /// Those of [`Plan::withheld_env`] a failed request's error may name: none another policy
    /// of the set passes (whether another tenant's variable exists is not this request's to
    /// learn).
    pub nameable_withheld_env: Vec<String>,
    /// The repo-server's askpass socket as the operator shared it with this container
    /// (`ARGOCD_ASK_PASS_SOCK` in the server's environment, as Argo CD's docs have it set in
    /// both containers). The egress proxy relays to it only for a `provideGitCreds` request
    /// that names the same path: a request never points the supervisor at a socket of its
    /// choosing.
    pub askpass_socket: Option<PathBuf>,
    /// `network: allowList`: the destinations and the proxy's bounds
    /// (`spec.network.allow`, `audit`, `maxConnections`).
    pub egress: Option<(vocab::egress::AllowList, egress::Limits)>,
    /// The tree cache (`spec.cache`), when on and the jails can take a tree (their own user,
    /// mount and PID namespaces).
    pub cache: Option<crate::cache::CacheConfig>,
    /// Why this policy's requests never take a tree from the cache, if they do not: its
    /// request limits (`diskBytes`, `fileSizeBytes`) are tighter than its archive limits, so
    /// a tree the cache holds could be one its own extraction would refuse. Checked per
    /// policy: a selected policy's requests then extract in their own jail.
    pub cache_refused: Option<String>,
    /// What each jail applies to itself, without its lease (`spec.filesystem`, `network`,
    /// `limits`, `namespaces`, `require`, and the compiled `seccomp` profile).
    sandbox: Sandbox,
    /// Why the seccomp profile did not compile here, if it did not.
    seccomp_error: Option<SeccompError>,
    /// `spec.seccomp.mode`.
    seccomp_mode: policy::SeccompMode,
    /// `spec.seccomp.profile`: the file the filter was compiled from (reports name it).
    seccomp_profile: PathBuf,
    /// `spec.limits` as the policy sets them, for reports that list each field by its name;
    /// what runs reads the translated values (`cgroup`, the jail's rlimits, `wall_clock`).
    limits: policy::policy::Limits,
    /// `spec.cache.enabled` (whether this policy's jails can take a tree is `cache`).
    cache_enabled: bool,
}

impl Plan {
    /// `spec.limits.dataBytes`: each process's heap (the jail's own too).
    pub fn data_bytes(&self) -> u64 {
        self.sandbox.rlimits.data_bytes
    }

    /// `spec.limits.addressSpaceBytes`.
    pub fn address_space_bytes(&self) -> u64 {
        self.sandbox.rlimits.address_space_bytes
    }

    /// Translate `policy`, with `overrides` over it and `env` as the server's environment.
    pub fn new(
        policy: &Policy,
        overrides: &Overrides,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Plan {
        let env: Vec<(String, String)> = env.into_iter().collect();
        let (seccomp, seccomp_error) = match seccomp::compile(
            &policy.seccomp,
            policy.seccomp_mode,
            policy.network,
            policy.network_loopback,
        ) {
            Ok(f) => (Some(f), None),
            Err(e) => (None, Some(e)),
        };
        Plan {
            index: PolicyIndex::default(),
            select: policy.select.clone(),
            policy_name: policy.name.clone(),
            policy_sha256: policy.sha256.clone(),
            require: policy.require.clone(),
            archive: archive_options(policy, overrides),
            output_bytes: overrides.output_bytes.unwrap_or(policy.limits.output_bytes),
            reply_bytes: overrides.reply_bytes.unwrap_or(DEFAULT_REPLY_BYTES),
            wall_clock: Duration::from_secs(policy.limits.wall_seconds),
            command_timeout: overrides.command_timeout.clone(),
            uid_range: (policy.uid_first, policy.uid_count),
            cgroup: CgroupLimits {
                memory_bytes: policy.limits.memory_bytes,
                pids: policy.limits.pids,
                cpu_millis: policy.limits.cpu_millis,
            },
            withheld_env: policy.withheld_env(env.iter().cloned()),
            nameable_withheld_env: policy.withheld_env(env.iter().cloned()),
            askpass_socket: env
                .iter()
                .find(|(k, _)| k == "ARGOCD_ASK_PASS_SOCK")
                .map(|(_, v)| PathBuf::from(v)),
            base_env: policy.passed_env(env),
            egress: (policy.network == NetworkMode::AllowList).then(|| {
                (
                    policy.egress.clone(),
                    egress::Limits {
                        max_connections: policy.egress_max_connections,
                        ..egress::Limits::default()
                    },
                )
            }),
            cache: cache_config(policy),
            cache_refused: cache_outside_request_limits(policy),
            sandbox: sandbox(policy, seccomp),
            seccomp_error,
            seccomp_mode: policy.seccomp_mode,
            seccomp_profile: policy.seccomp_profile.clone(),
            limits: policy.limits.clone(),
            cache_enabled: policy.cache.enabled,
        }
    }

    /// Whether the policy requires `p`.
    pub fn requires(&self, p: Protection) -> bool {
        self.require.contains(&p)
    }

    /// The compiled seccomp filter, or why there is none.
    pub(crate) fn seccomp(&self) -> Result<&CompiledFilter, &SeccompError> {
        match (&self.sandbox.seccomp, &self.seccomp_error) {
            (Some(f), _) => Ok(f),
            (None, Some(e)) => Err(e),
            (None, None) => unreachable!("a plan has a filter or the reason it has none"),
        }
    }

    /// Why the policy's seccomp profile does not compile for this architecture, if it does not
    /// (`policy check` reports it as `serve` would find it).
    pub fn seccomp_error(&self) -> Option<&SeccompError> {
        self.seccomp_error.as_ref()
    }

    /// BPF instructions in the compiled filter (0 without one).
    pub fn seccomp_instructions(&self) -> usize {
        self.sandbox
            .seccomp
            .as_ref()
            .map_or(0, |f| f.instructions())
    }

    /// `spec.seccomp.mode`: enforce, or audit (log what it would deny).
    pub fn seccomp_mode(&self) -> policy::SeccompMode {
        self.seccomp_mode
    }

    /// `spec.seccomp.profile`, the file the filter comes from.
    pub fn seccomp_profile(&self) -> &Path {
        &self.seccomp_profile
    }

    /// `spec.limits` as the policy sets them (for reports; see the field).
    pub fn limits(&self) -> &policy::policy::Limits {
        &self.limits
    }

    /// `spec.cache.enabled`: whether the policy asks for the tree cache at all.
    pub fn cache_enabled(&self) -> bool {
        self.cache_enabled
    }

    /// `spec.filesystem.readOnly`.
    pub fn read_only(&self) -> &[PathBuf] {
        &self.sandbox.read_only
    }

    /// `spec.filesystem.readWrite`.
    pub fn read_write(&self) -> &[PathBuf] {
        &self.sandbox.read_write
    }

    /// Names of the server's variables commands get (`spec.env.pass`).
    pub fn passed_env_names(&self) -> impl Iterator<Item = &str> {
        self.base_env.iter().map(|(k, _)| k.as_str())
    }

    /// What a required Landlock must provide (`spec.landlock`: its lowest ABI, its features).
    pub fn landlock(&self) -> &policy::LandlockRequirement {
        &self.sandbox.landlock
    }

    /// The policy's network mode.
    pub fn network(&self) -> NetworkMode {
        self.sandbox.network
    }

    /// `spec.network.loopback`.
    pub fn loopback(&self) -> bool {
        self.sandbox.loopback
    }

    /// The paths `spec.filesystem` opens to commands (read-only and read-write).
    pub fn file_rules(&self) -> impl Iterator<Item = &Path> + Clone {
        self.sandbox
            .read_only
            .iter()
            .chain(&self.sandbox.read_write)
            .map(PathBuf::as_path)
    }

    /// A proxy for one request (`network: allowList`), not yet serving; with the git
    /// credential relay when the plugin sets `provideGitCreds` and the request's
    /// `ARGOCD_ASK_PASS_SOCK` is the one this server was given.
    pub(crate) fn egress_proxy(&self, task: Option<&Task>) -> Option<egress::Proxy> {
        let (list, limits) = self.egress.as_ref()?;
        let proxy = egress::Proxy::new(list.clone(), *limits);
        let askpass = task
            .filter(|t| t.config.spec.provide_git_creds)
            .and_then(|t| t.env.iter().find(|(k, _)| k == "ARGOCD_ASK_PASS_SOCK"))
            .map(|(_, v)| PathBuf::from(v))
            .filter(|p| self.askpass_socket.as_ref() == Some(p));
        Some(match askpass {
            // As the socket's owner: the repo-server makes it writable by itself alone.
            Some(p) => proxy.with_askpass(p, Arc::new(jail_sys::sys::connect_unix_as_owner)),
            None => proxy,
        })
    }

    /// The namespaces each request gets (`net` only without egress).
    pub fn namespaces(&self) -> policy::Namespaces {
        self.sandbox.namespaces
    }

    /// The sandbox one jail applies: leased as `creds`; with a pids cgroup, RLIMIT_NPROC (same
    /// count, per UID) stays a backstop just above it, so the cgroup refuses first and the
    /// failure can be named from `pids.events`.
    pub(crate) fn sandbox_for(&self, creds: Option<Creds>, pids_cgroup: bool) -> Sandbox {
        let mut sb = self.sandbox.clone();
        sb.creds = creds;
        // A benchmark build's layer pass; a policy that requires the layer still fails closed.
        let off = crate::bench::off();
        if off.seccomp {
            sb.seccomp = None;
        }
        #[cfg(feature = "bench-layers")]
        {
            sb.bench_no_landlock = off.landlock;
        }
        if pids_cgroup {
            sb.rlimits.processes = self.cgroup.pids.saturating_add(NPROC_HEADROOM);
        }
        sb
    }

    /// The request's deadline: the earlier of the caller's (the client's gRPC deadline, or the
    /// generator's timeout, with the limit to name) and the policy's wall clock, and which of
    /// them it is (the error names it when it fires).
    pub fn deadline(&self, caller: Option<(Instant, TimeLimit)>) -> (Option<Instant>, TimeLimit) {
        self.deadline_from(Instant::now(), caller)
    }

    /// [`Plan::deadline`] for a request that started at `start`.
    pub fn deadline_from(
        &self,
        start: Instant,
        caller: Option<(Instant, TimeLimit)>,
    ) -> (Option<Instant>, TimeLimit) {
        let wall = start + self.wall_clock;
        match caller {
            Some((c, limit)) if c <= wall => (Some(c), limit),
            _ => (
                Some(wall),
                TimeLimit::Request {
                    seconds: self.wall_clock.as_secs(),
                },
            ),
        }
    }

    /// One request of `op` on `config`: its environment (the passed server variables, then
    /// the request's own, last wins), its budgets and `deadline` (from [`Plan::deadline`]).
    /// `tree` names the request's directory (and jail and cgroup).
    pub fn request(
        self: &Arc<Self>,
        op: Operation,
        config: &PluginConfig,
        tree: PathBuf,
        app_rel_path: &str,
        request_env: &[(String, String)],
        (deadline, deadline_limit): (Option<Instant>, TimeLimit),
    ) -> RequestSpec {
        RequestSpec {
            plan: Arc::clone(self),
            task: Task {
                op,
                config: config.clone(),
                app_rel_path: app_rel_path.to_owned(),
                env: plugin::env::compose(&self.base_env, request_env),
                archive: self.archive.clone(),
                output_bytes: self.output_bytes,
                reply_bytes: self.reply_bytes,
                deadline_limit,
                command_timeout: self.command_timeout.clone(),
                archive_sha256: None,
                archive_size: None,
            },
            tree,
            deadline,
            record: Default::default(),
        }
    }
}

/// Every policy's plan, the default first: what a request runs under is chosen here, once,
/// from Argo CD's own variables in its environment (each plan keeps its policy's `select`).
#[derive(Debug)]
pub struct Plans {
    plans: Vec<Arc<Plan>>,
}

impl Plans {
    /// Each policy of `set` translated (as [`Plan::new`]).
    pub fn new(
        set: &PolicySet,
        overrides: &Overrides,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Plans {
        let env: Vec<(String, String)> = env.into_iter().collect();
        let plans = set
            .policies()
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let mut plan = Plan::new(p, overrides, env.iter().cloned());
                plan.index = PolicyIndex(i);
                let others: Vec<&Policy> = (set.policies().iter().enumerate())
                    .filter(|(j, _)| *j != i)
                    .map(|(_, q)| q)
                    .collect();
                plan.nameable_withheld_env
                    .retain(|n| !others.iter().any(|q| q.passes(n)));
                Arc::new(plan)
            })
            .collect();
        Plans { plans }
    }

    /// The default plan (requests no policy selects; the probe; one-shot commands).
    pub fn default_plan(&self) -> &Arc<Plan> {
        &self.plans[0]
    }

    /// Every plan, the default first.
    pub fn all(&self) -> &[Arc<Plan>] {
        &self.plans
    }

    /// The plan a request with this environment runs under: the most specific policy whose
    /// `spec.select` matches Argo CD's own variables, else the default. Refused (the reason
    /// returned) when a selecting variable is given twice with different values.
    pub fn select<'a>(
        &self,
        env: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Selected<'_>, GivenTwice> {
        let id = Identity::from_env(env);
        if self.plans.len() == 1 {
            // Nothing to choose between: an ambiguous project only goes unnamed.
            let id = id.ok().unwrap_or_default();
            return Ok(Selected {
                plan: &self.plans[0],
                project: id.project,
                application: id.app,
            });
        }
        let id = id?;
        let i = policy::select::most_specific(self.plans.iter().map(|p| p.select.as_ref()), &id);
        Ok(Selected {
            plan: &self.plans[i],
            project: id.project,
            application: id.app,
        })
    }
}

/// A request's policy, and the Argo CD project it was chosen for (what commands see as
/// `ARGOCD_APP_PROJECT_NAME`; `None` when absent, empty or given twice differently).
#[derive(Debug)]
pub struct Selected<'a> {
    /// The plan the request runs under.
    pub plan: &'a Arc<Plan>,
    /// The project, for the audit event.
    pub project: Option<String>,
    /// The Argo CD application (`ARGOCD_APP_NAME`, which the repo-server sets from the
    /// Application itself), for the audit event: the metadata's `appName` is only the last
    /// directory of the application's path.
    pub application: Option<String>,
}

/// `spec.archive`, every field, with `--max-compressed` over `compressedBytes`.
fn archive_options(policy: &Policy, overrides: &Overrides) -> archive::Options {
    let a = &policy.archive;
    let mut opts = archive::Options::default();
    opts.limits.compressed_bytes = overrides.compressed_bytes.unwrap_or(a.compressed_bytes);
    opts.limits.extracted_bytes = a.extracted_bytes;
    opts.limits.file_bytes = a.file_bytes;
    opts.limits.entries = a.entries;
    opts.limits.strict_names = a.strict_names;
    opts.limits.symlinks = a.symlinks;
    opts.limits.path_depth = usize::try_from(a.path_depth).unwrap_or(usize::MAX);
    opts.limits.max_ratio = a.max_ratio;
    opts.limits.wall_clock = Duration::from_secs(a.wall_seconds);
    // The server hashes every byte it forwards and sends the end frame only when the checksum
    // matched: a second SHA-256 in the jail would only cost CPU.
    opts.skip_digest = true;
    opts
}

/// Why a cached tree would not answer as a fresh extraction under this policy, if it would
/// not: a fresh extraction writes the tree into the request's tmpfs (`spec.limits.diskBytes`)
/// under its `RLIMIT_FSIZE` (`fileSizeBytes`), a cached tree lives beside it; when those are
/// tighter than the archive limits a tree within the archive limits could be served from the
/// cache where extracting it would fail.
pub(super) fn cache_outside_request_limits(p: &Policy) -> Option<String> {
    let (disk, extracted) = (p.limits.disk_bytes, p.archive.extracted_bytes);
    let (fsize, file) = (p.limits.file_size_bytes, p.archive.file_bytes);
    if disk < extracted {
        return Some(format!(
            "spec.limits.diskBytes ({disk}) is below spec.archive.extractedBytes ({extracted}): a cached tree is not on the request's disk, so it would not be held to that limit; raise diskBytes or lower extractedBytes to use spec.cache"
        ));
    }
    if fsize < file {
        return Some(format!(
            "spec.limits.fileSizeBytes ({fsize}) is below spec.archive.fileBytes ({file}): a cached file is not written under the request's RLIMIT_FSIZE; raise fileSizeBytes or lower fileBytes to use spec.cache"
        ));
    }
    None
}

/// Fills under way at once: each may need up to `archive.extractedBytes` of the cache's
/// memory before it is sealed; more concurrent first requests extract in their own jails.
const MAX_FILLS: usize = 2;

/// `spec.cache`, when on and the jails have what taking a tree needs.
fn cache_config(p: &Policy) -> Option<crate::cache::CacheConfig> {
    let ns = p.namespaces;
    // (The user namespace comes with any of them.)
    (p.cache.enabled && ns.mount && ns.pid).then_some(crate::cache::CacheConfig {
        budget: p.cache.bytes,
        max_fills: MAX_FILLS,
        uid: p.cache.uid,
        range: (p.uid_first, p.uid_count),
        extracted_bytes: p.archive.extracted_bytes,
        entries: p.archive.entries,
        min_archive_bytes: p.cache.min_archive_bytes,
    })
}

/// The namespaces a jail is asked to enter under `p`: the policy's, but no network namespace
/// under `network: egress`, which needs the host's network (allowList keeps the empty
/// namespace: the proxy is its only way out).
pub fn wanted_namespaces(p: &Policy) -> policy::Namespaces {
    let mut namespaces = p.namespaces;
    namespaces.net &= p.network != NetworkMode::Egress;
    namespaces
}

/// The jail's confinement from `spec.filesystem`, `network`, `limits`, `namespaces` and
/// `require`.
fn sandbox(p: &Policy, seccomp: Option<CompiledFilter>) -> Sandbox {
    let namespaces = wanted_namespaces(p);
    Sandbox {
        creds: None,
        read_only: p.read_only.clone(),
        read_write: p.read_write.clone(),
        network: p.network,
        loopback: p.network_loopback,
        seccomp,
        rlimits: Rlimits {
            open_files: p.limits.open_files,
            file_size_bytes: p.limits.file_size_bytes,
            processes: p.limits.pids,
            data_bytes: p.limits.data_bytes,
            address_space_bytes: p.limits.address_space_bytes,
        },
        require: p.require.clone(),
        landlock: p.landlock.clone(),
        namespaces,
        disk: DiskLimit {
            bytes: p.limits.disk_bytes,
            // Every archive entry plus room for what the commands create; inodes cost kernel
            // memory, so they are bounded too.
            inodes: p.archive.entries.saturating_mul(2).saturating_add(65_536),
        },
        tree_attach: cache_config(p).is_some(),
        #[cfg(feature = "bench-layers")]
        bench_no_landlock: false,
    }
}

/// A plan's place among the server's plans, the default being 0: the slot of the spare jail
/// prepared under it. A request carries its plan itself ([`RequestSpec::plan`]), never an
/// index to look it up again.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct PolicyIndex(pub usize);

/// One request as the caller hands it to a [`crate::Runner`], made by [`Plan::request`].
#[derive(Debug, Clone)]
pub struct RequestSpec {
    /// What to run.
    pub task: Task,
    /// The plan of the policy it runs under, as it was when the request arrived: its jail is
    /// confined by it, whatever the server's plans are later.
    pub plan: Arc<Plan>,
    /// The (not yet existing) directory the archive is extracted into; its name names the
    /// request's jail and cgroup.
    pub tree: PathBuf,
    /// When the request must be finished.
    pub deadline: Option<Instant>,
    /// What the request did, for the audit log (filled by the runner).
    pub record: jail_wire::record::Recorder,
}

impl RequestSpec {
    /// Which RPC.
    pub fn op(&self) -> Operation {
        self.task.op
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn custom() -> Policy {
        let text = policy::policy::DEFAULT_POLICY_YAML
            .replacen("compressedBytes: 100Mi", "compressedBytes: 3Mi", 1)
            .replacen("extractedBytes: 1Gi", "extractedBytes: 5Mi", 1)
            .replacen("fileBytes: 256Mi", "fileBytes: 2Mi", 1)
            .replacen("entries: 100000", "entries: 77", 1)
            .replacen("symlinks: 10000", "symlinks: 7", 1)
            .replacen("pathDepth: 64", "pathDepth: 9", 1)
            .replacen("maxRatio: 250", "maxRatio: 33", 1)
            .replacen("wallSeconds: 120", "wallSeconds: 11", 1);
        Policy::parse(&text, None).expect("custom policy")
    }

    #[test]
    fn one_policy_selects_no_one_but_names_the_project_commands_see() {
        let set = PolicySet::single(custom());
        let plans = Plans::new(&set, &Overrides::default(), std::iter::empty());
        let env = |pairs: &[(&'static str, &'static str)]| pairs.to_vec();
        let project =
            |e: Vec<(&str, &str)>| plans.select(e).expect("one policy never refuses").project;
        assert_eq!(
            project(env(&[("ARGOCD_APP_PROJECT_NAME", "team-a")])),
            Some("team-a".into())
        );
        assert_eq!(project(env(&[("ARGOCD_APP_PROJECT_NAME", "")])), None);
        assert_eq!(
            project(env(&[("ARGOCD_ENV_ARGOCD_APP_PROJECT_NAME", "team-a")])),
            None
        );
        // Given twice differently: commands see the last, the audit event names neither.
        assert_eq!(
            project(env(&[
                ("ARGOCD_APP_PROJECT_NAME", "team-b"),
                ("ARGOCD_APP_PROJECT_NAME", "team-a")
            ])),
            None
        );
    }

    #[test]
    fn git_credentials_are_relayed_only_to_the_servers_own_askpass_socket() {
        let text = policy::policy::DEFAULT_POLICY_YAML.replacen(
            "network: {mode: none}",
            "network: {mode: allowList, allow: [{host: github.com, ports: [443]}]}",
            1,
        );
        let p = Policy::parse(&text, None).expect("allowList policy");
        let server_env = [("ARGOCD_ASK_PASS_SOCK".to_owned(), "/ask/sock".to_owned())];
        let plan = Arc::new(Plan::new(&p, &Overrides::default(), server_env));
        let mut creds = PluginConfig::default();
        creds.spec.provide_git_creds = true;
        let relayed = |config: &PluginConfig, sock: &str| {
            let spec = plan.request(
                Operation::Generate,
                config,
                PathBuf::from("/w/r"),
                ".",
                &[("ARGOCD_ASK_PASS_SOCK".into(), sock.into())],
                plan.deadline(None),
            );
            plan.egress_proxy(Some(&spec.task))
                .expect("a proxy under allowList")
                .askpass()
                .map(Path::to_path_buf)
        };
        assert_eq!(
            relayed(&creds, "/ask/sock"),
            Some(PathBuf::from("/ask/sock"))
        );
        // A request naming another socket cannot aim the supervisor at it.
        assert_eq!(relayed(&creds, "/run/other.sock"), None);
        // Without provideGitCreds, nothing is relayed.
        assert_eq!(relayed(&PluginConfig::default(), "/ask/sock"), None);
    }

    #[test]
    fn every_archive_limit_comes_from_the_policy_and_flags_override_it() {
        let p = custom();
        let plan = Plan::new(&p, &Overrides::default(), Vec::new());
        let l = &plan.archive.limits;
        assert_eq!(
            (
                l.compressed_bytes,
                l.extracted_bytes,
                l.file_bytes,
                l.entries,
                l.symlinks,
                l.path_depth,
                l.max_ratio,
                l.wall_clock
            ),
            (
                3 << 20,
                5 << 20,
                2 << 20,
                77,
                7,
                9,
                33,
                Duration::from_secs(11)
            )
        );
        let over = Arc::new(Plan::new(
            &p,
            &Overrides {
                compressed_bytes: Some(4096),
                output_bytes: Some(2048),
                command_timeout: Some((Duration::from_secs(3), "3s".into())),
                reply_bytes: Some(5 << 20),
            },
            Vec::new(),
        ));
        assert_eq!(over.reply_bytes, 5 << 20);
        assert_eq!(over.archive.limits.compressed_bytes, 4096);
        assert_eq!(over.archive.limits.entries, 77);
        assert_eq!(over.output_bytes, 2048);
        let spec = over.request(
            Operation::Generate,
            &PluginConfig::default(),
            PathBuf::from("/w/r"),
            ".",
            &[],
            over.deadline(None),
        );
        assert_eq!(spec.task.archive.limits.symlinks, 7);
        assert_eq!(spec.task.output_bytes, 2048);
        assert_eq!(
            spec.task.command_timeout,
            Some((Duration::from_secs(3), "3s".into()))
        );
    }

    #[test]
    fn the_sandbox_follows_the_policy() {
        let p = Policy::default_policy().expect("default");
        let plan = Plan::new(&p, &Overrides::default(), Vec::new());
        let sb = plan.sandbox_for(Some(Creds { uid: 7, gid: 7 }), true);
        assert_eq!(sb.creds, Some(Creds { uid: 7, gid: 7 }));
        assert_eq!(sb.rlimits.processes, p.limits.pids + NPROC_HEADROOM);
        assert_eq!(
            plan.sandbox_for(None, false).rlimits.processes,
            p.limits.pids
        );
        assert_eq!(sb.read_only, p.read_only);
        assert_eq!(sb.disk.bytes, p.limits.disk_bytes);
        assert!(sb.namespaces.net);
        assert!(plan.seccomp().is_ok());
        let egress = Policy::parse(
            &policy::policy::DEFAULT_POLICY_YAML.replacen(
                "network: {mode: none}",
                "network: {mode: egress}",
                1,
            ),
            None,
        )
        .expect("egress");
        assert!(
            !Plan::new(&egress, &Overrides::default(), Vec::new())
                .namespaces()
                .net
        );
    }

    #[test]
    fn the_deadline_is_the_earlier_of_the_clients_and_the_wall_clock() {
        let p = Policy::default_policy().expect("default");
        let plan = Plan::new(&p, &Overrides::default(), Vec::new());
        let soon = Instant::now() + Duration::from_secs(5);
        assert_eq!(
            plan.deadline(Some((soon, TimeLimit::Client))),
            (Some(soon), TimeLimit::Client)
        );
        let (_, limit) = plan.deadline(None);
        assert_eq!(
            limit,
            TimeLimit::Request {
                seconds: p.limits.wall_seconds
            }
        );
        let late = Instant::now() + Duration::from_secs(p.limits.wall_seconds + 60);
        assert!(matches!(
            plan.deadline(Some((late, TimeLimit::Client))).1,
            TimeLimit::Request { .. }
        ));
    }

    #[test]
    fn the_environment_is_the_passed_server_variables_then_the_requests() {
        let p = Policy::default_policy().expect("default");
        let plan = Arc::new(Plan::new(
            &p,
            &Overrides::default(),
            vec![
                ("PATH".to_owned(), "/bin".to_owned()),
                ("SECRET_TOKEN".to_owned(), "x".to_owned()),
            ],
        ));
        let spec = plan.request(
            Operation::Match,
            &PluginConfig::default(),
            PathBuf::from("/w/r"),
            "app",
            &[("ARGOCD_APP_NAME".to_owned(), "a".to_owned())],
            plan.deadline(None),
        );
        assert!(spec.task.env.iter().any(|(k, _)| k == "PATH"));
        assert!(!spec.task.env.iter().any(|(k, _)| k == "SECRET_TOKEN"));
        assert_eq!(
            spec.task.env.last(),
            Some(&("ARGOCD_APP_NAME".to_owned(), "a".to_owned()))
        );
    }
}
