//! Prometheus metrics (text exposition format 0.0.4), served on an optional address. A small
//! registry of our own: a handful of counters, gauges and one histogram do not justify a
//! metrics framework and its dependencies in a security sidecar.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Upper bounds (seconds) of the request-duration histogram.
pub const DURATION_BUCKETS: &[f64] = &[
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];

#[derive(Debug, Default)]
struct Histogram {
    buckets: Vec<u64>,
    sum: f64,
    count: u64,
}

/// The registry.
#[derive(Debug, Default)]
pub struct Metrics {
    /// By RPC, code and policy.
    requests: Mutex<BTreeMap<(String, String, String), u64>>,
    durations: Mutex<BTreeMap<String, Histogram>>,
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
    /// By reason and policy.
    kills: Mutex<BTreeMap<(String, String), u64>>,
    rejections: Mutex<BTreeMap<String, u64>>,
    seccomp: Mutex<BTreeMap<(String, String), u64>>,
    /// By decision and policy.
    egress: Mutex<BTreeMap<(String, String), u64>>,
    tree_cache: Mutex<BTreeMap<String, u64>>,
    active: AtomicI64,
    /// (in use, capacity) of the UID pool, read at scrape time.
    pool: Mutex<Option<PoolSource>>,
    /// The tree cache's figures, read at scrape time (only a server whose cache runs sets it).
    cache: Mutex<Option<CacheSource>>,
    /// Requests refused for want of a slot.
    refused_busy: AtomicU64,
    /// The commit the binary was built from (`cmp_warden_build_info`'s `commit`), when set.
    commit: std::sync::OnceLock<String>,
    /// Reloads of the configuration, by result (`accepted`, `refused`).
    reloads: Mutex<BTreeMap<String, u64>>,
    /// The set in force: its policies (`name=sha256`, comma-separated) and plugin.yaml's
    /// SHA-256.
    config: Mutex<Option<(String, String)>>,
}

type CacheFn = dyn Fn() -> Option<supervisor::CacheStats> + Send + Sync;

struct CacheSource(Box<CacheFn>);

impl std::fmt::Debug for CacheSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CacheSource")
    }
}

type PoolFn = dyn Fn() -> Option<(usize, usize)> + Send + Sync;

struct PoolSource(Box<PoolFn>);

impl std::fmt::Debug for PoolSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PoolSource")
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What one finished request contributes.
#[derive(Debug, Clone, Default)]
pub struct Finished<'a> {
    /// RPC name.
    pub rpc: &'a str,
    /// gRPC code name (`OK`, `InvalidArgument`, …).
    pub code: &'a str,
    /// The policy it ran under (`metadata.name`; the default's before one was chosen).
    pub policy: &'a str,
    /// Duration.
    pub duration: Duration,
    /// Compressed archive bytes received.
    pub bytes_in: u64,
    /// Manifest bytes returned.
    pub bytes_out: u64,
    /// The limit that killed it (`timeout`, `clientDeadline`, `memory`, `pids`, `output`, `seccomp`, `disk`).
    pub kill: Option<&'a str>,
    /// Extraction rejection class (`policy`, `limit`, `integrity`).
    pub rejection: Option<&'a str>,
    /// Seccomp events (syscall, `denied`/`audited`, count).
    pub seccomp: Vec<(&'a str, &'a str, u64)>,
    /// Egress connections by decision (`allowed`, `denied`, `audited`).
    pub egress: Vec<&'a str>,
    /// Where the tree came from (`hit`, `filled`, `uncached`), when the cache runs.
    pub tree_cache: Option<&'a str>,
    /// Refused for want of a slot: `--max-in-flight` running and `--max-queued` waiting, or
    /// its deadline passed while it waited.
    pub busy: bool,
}

/// Keeps a request in `cmp_warden_active_requests` while alive.
#[derive(Debug)]
pub struct ActiveGuard(Arc<Metrics>);

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Metrics {
    /// Report the tree cache's figures through `f` at each scrape.
    pub fn set_cache_source(
        &self,
        f: impl Fn() -> Option<supervisor::CacheStats> + Send + Sync + 'static,
    ) {
        *lock(&self.cache) = Some(CacheSource(Box::new(f)));
    }

    /// A reload of the configuration ended with `result` (`accepted` or `refused`).
    pub fn reloaded(&self, result: &str) {
        *lock(&self.reloads).entry(result.to_owned()).or_default() += 1;
    }

    /// The configuration in force (`cmp_warden_config_info`).
    pub fn set_config(&self, policies: String, plugin_sha256: String) {
        *lock(&self.config) = Some((policies, plugin_sha256));
    }

    /// The commit `cmp_warden_build_info` names (the binary's own, from its build script).
    pub fn set_commit(&self, commit: &str) {
        let _ = self.commit.set(commit.to_owned());
    }

    /// Report the UID pool's usage through `f` at each scrape.
    pub fn set_pool_source(&self, f: impl Fn() -> Option<(usize, usize)> + Send + Sync + 'static) {
        *lock(&self.pool) = Some(PoolSource(Box::new(f)));
    }

    /// A request started; it counts as active until the guard is dropped (also when the
    /// handler's future is dropped because the client went away).
    pub fn started(self: &Arc<Self>) -> ActiveGuard {
        self.active.fetch_add(1, Ordering::Relaxed);
        ActiveGuard(self.clone())
    }

    /// A request finished.
    pub fn finished(&self, f: &Finished<'_>) {
        *lock(&self.requests)
            .entry((f.rpc.to_owned(), f.code.to_owned(), f.policy.to_owned()))
            .or_default() += 1;
        {
            let mut d = lock(&self.durations);
            let h = d.entry(f.rpc.to_owned()).or_insert_with(|| Histogram {
                buckets: vec![0; DURATION_BUCKETS.len()],
                ..Default::default()
            });
            let s = f.duration.as_secs_f64();
            for (i, b) in DURATION_BUCKETS.iter().enumerate() {
                if s <= *b {
                    h.buckets[i] += 1;
                }
            }
            h.sum += s;
            h.count += 1;
        }
        self.bytes_in.fetch_add(f.bytes_in, Ordering::Relaxed);
        self.bytes_out.fetch_add(f.bytes_out, Ordering::Relaxed);
        if let Some(k) = f.kill {
            *lock(&self.kills)
                .entry((k.to_owned(), f.policy.to_owned()))
                .or_default() += 1;
        }
        if let Some(r) = f.rejection {
            *lock(&self.rejections).entry(r.to_owned()).or_default() += 1;
        }
        for (s, a, n) in &f.seccomp {
            *lock(&self.seccomp)
                .entry(((*s).to_owned(), (*a).to_owned()))
                .or_default() += n;
        }
        for d in &f.egress {
            *lock(&self.egress)
                .entry(((*d).to_owned(), f.policy.to_owned()))
                .or_default() += 1;
        }
        if let Some(t) = f.tree_cache {
            *lock(&self.tree_cache).entry(t.to_owned()).or_default() += 1;
        }
        if f.busy {
            self.refused_busy.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// What `/metrics` serves: the registry, build information, and this process's own
    /// resource use (the `process_*` metrics every Prometheus client library exports).
    pub fn exposition(&self) -> String {
        let mut o = self.render();
        let _ = writeln!(
            o,
            "# HELP cmp_warden_build_info The running build (always 1).\n# TYPE cmp_warden_build_info gauge\ncmp_warden_build_info{{version=\"{}\"{}}} 1",
            env!("CARGO_PKG_VERSION"),
            self.commit
                .get()
                .map(|c| format!(",commit=\"{}\"", escape(c)))
                .unwrap_or_default()
        );
        if let Some((policies, plugin)) = &*lock(&self.config) {
            let _ = writeln!(
                o,
                "# HELP cmp_warden_config_info The configuration in force: its policies (name=sha256, comma-separated) and plugin.yaml's SHA-256 (always 1).\n# TYPE cmp_warden_config_info gauge\ncmp_warden_config_info{{policies=\"{}\",plugin_sha256=\"{}\"}} 1",
                escape(policies),
                escape(plugin)
            );
        }
        process_metrics(&mut o);
        o
    }

    /// The registry's exposition text.
    pub fn render(&self) -> String {
        let mut o = Text::default();
        o.family(
            "cmp_warden_requests_total",
            "counter",
            "Requests by RPC, gRPC code and the policy they ran under.",
            lock(&self.requests).iter().map(|((rpc, code, policy), n)| {
                (
                    format!(
                        "rpc=\"{rpc}\",code=\"{code}\",policy=\"{}\"",
                        escape(policy)
                    ),
                    *n,
                )
            }),
        );
        o.head(
            "cmp_warden_request_duration_seconds",
            "histogram",
            "Request duration by RPC.",
        );
        for (rpc, h) in lock(&self.durations).iter() {
            for (i, b) in DURATION_BUCKETS.iter().enumerate() {
                let _ = writeln!(
                    o.0,
                    "cmp_warden_request_duration_seconds_bucket{{rpc=\"{rpc}\",le=\"{b}\"}} {}",
                    h.buckets[i]
                );
            }
            let _ = writeln!(
                o.0,
                "cmp_warden_request_duration_seconds_bucket{{rpc=\"{rpc}\",le=\"+Inf\"}} {}\ncmp_warden_request_duration_seconds_sum{{rpc=\"{rpc}\"}} {}\ncmp_warden_request_duration_seconds_count{{rpc=\"{rpc}\"}} {}",
                h.count, h.sum, h.count
            );
        }
        o.one(
            "cmp_warden_received_bytes_total",
            "counter",
            "Compressed archive bytes received.",
            self.bytes_in.load(Ordering::Relaxed),
        );
        o.one(
            "cmp_warden_sent_bytes_total",
            "counter",
            "Manifest bytes returned.",
            self.bytes_out.load(Ordering::Relaxed),
        );
        o.family(
            "cmp_warden_sandbox_kills_total",
            "counter",
            "Requests ended by a sandbox limit, by reason and policy.",
            lock(&self.kills).iter().map(|((r, policy), n)| {
                (format!("reason=\"{r}\",policy=\"{}\"", escape(policy)), *n)
            }),
        );
        o.family(
            "cmp_warden_archive_rejections_total",
            "counter",
            "Archives refused, by class.",
            lock(&self.rejections)
                .iter()
                .map(|(r, n)| (format!("class=\"{r}\""), *n)),
        );
        o.family(
            "cmp_warden_seccomp_events_total",
            "counter",
            "System calls the seccomp profile denied (enforce) or would have denied (audit).",
            lock(&self.seccomp)
                .iter()
                .map(|((s, a), n)| (format!("syscall=\"{s}\",action=\"{a}\""), *n)),
        );
        o.family(
            "cmp_warden_egress_connections_total",
            "counter",
            "Connections through the egress proxy (network: allowList), by decision and policy.",
            lock(&self.egress).iter().map(|((d, policy), n)| {
                (
                    format!("decision=\"{d}\",policy=\"{}\"", escape(policy)),
                    *n,
                )
            }),
        );
        if let Some(c) = lock(&self.cache).as_ref().and_then(|s| (s.0)()) {
            o.family(
                "cmp_warden_tree_cache_requests_total",
                "counter",
                "Requests by where their tree came from: a sealed one (hit), one they filled, or their own extraction (uncached).",
                lock(&self.tree_cache)
                    .iter()
                    .map(|(r, n)| (format!("result=\"{r}\""), *n)),
            );
            o.one(
                "cmp_warden_tree_cache_bytes",
                "gauge",
                "Bytes of sealed trees in the cache (spec.cache.bytes bounds it).",
                c.bytes,
            );
            o.one(
                "cmp_warden_tree_cache_trees",
                "gauge",
                "Sealed trees in the cache.",
                c.trees,
            );
            o.one(
                "cmp_warden_tree_cache_evictions_total",
                "counter",
                "Trees removed to stay within spec.cache.bytes (least recently used, never one in use).",
                c.evictions,
            );
            o.one(
                "cmp_warden_tree_cache_in_service",
                "gauge",
                "1 while the tree cache serves; 0 from TREE CACHE OUT OF SERVICE until a new keeper runs (requests extract in their own jails meanwhile).",
                u64::from(c.in_service),
            );
        }
        // Only a server that reloads (`serve`) has a configuration in force to report.
        if lock(&self.config).is_some() {
            let reloads = lock(&self.reloads);
            o.family(
                "cmp_warden_config_reloads_total",
                "counter",
                "Reloads of the policies and plugin.yaml while serving, by result: accepted (in force for new requests) or refused (the set in force stays; the log and the audit event say why).",
                ["accepted", "refused"].into_iter().map(|r| {
                    (
                        format!("result=\"{r}\""),
                        reloads.get(r).copied().unwrap_or(0),
                    )
                }),
            );
        }
        o.one(
            "cmp_warden_admission_refusals_total",
            "counter",
            "Requests refused for want of a slot (--max-in-flight running, --max-queued waiting, or the deadline passed in the queue).",
            self.refused_busy.load(Ordering::Relaxed),
        );
        o.one(
            "cmp_warden_active_requests",
            "gauge",
            "Requests in flight.",
            self.active.load(Ordering::Relaxed).max(0),
        );
        if let Some((used, cap)) = lock(&self.pool).as_ref().and_then(|f| (f.0)()) {
            o.one("cmp_warden_uid_pool_in_use", "gauge", "Leased UIDs.", used);
            o.one(
                "cmp_warden_uid_pool_capacity",
                "gauge",
                "UIDs in the pool.",
                cap,
            );
        }
        o.0
    }
}

/// A label value as the exposition format writes it (a policy's name is the operator's text).
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Exposition text being written: a family's `# HELP` and `# TYPE`, then its samples.
#[derive(Default)]
struct Text(String);

impl Text {
    fn head(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.0, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    /// A family of one unlabelled sample.
    fn one(&mut self, name: &str, kind: &str, help: &str, value: impl std::fmt::Display) {
        self.head(name, kind, help);
        let _ = writeln!(self.0, "{name} {value}");
    }

    /// A family of labelled samples (`labels` as written between the braces).
    fn family(
        &mut self,
        name: &str,
        kind: &str,
        help: &str,
        samples: impl Iterator<Item = (String, u64)>,
    ) {
        self.head(name, kind, help);
        for (labels, n) in samples {
            let _ = writeln!(self.0, "{name}{{{labels}}} {n}");
        }
    }
}

/// The `sandbox_kills_total` reason for an audit event's `limit`, if that limit ended commands.
pub fn kill_reason(limit: Option<vocab::record::Limit>) -> Option<&'static str> {
    limit
        .filter(|l| l.kills())
        .map(vocab::record::Limit::as_str)
}

/// Connections the metrics listener serves at once.
const MAX_METRICS_CONNECTIONS: usize = 32;

/// Serve `GET /metrics` (and `GET /healthz`) on `listener` until the task is dropped: HTTP/1.1
/// by hyper, 5 s to send the request head, 30 s per connection, 32 connections at once.
pub async fn serve_metrics(listener: tokio::net::TcpListener, metrics: Arc<Metrics>) {
    let mut errors = crate::sparse::AcceptErrors::default();
    // Connections served at once; more wait in the kernel's backlog.
    let places = Arc::new(tokio::sync::Semaphore::new(MAX_METRICS_CONNECTIONS));
    loop {
        let Ok(place) = places.clone().acquire_owned().await else {
            return;
        };
        let conn = match listener.accept().await {
            Ok((conn, _)) => conn,
            Err(e) => {
                errors.after("metrics", &e).await;
                continue;
            }
        };
        let m = metrics.clone();
        tokio::spawn(async move {
            let _place = place;
            let service = hyper::service::service_fn(move |req| {
                let m = m.clone();
                async move { Ok::<_, std::convert::Infallible>(respond(&req, &m)) }
            });
            let mut b = hyper::server::conn::http1::Builder::new();
            b.timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(Duration::from_secs(5))
                .max_buf_size(16 * 1024);
            let conn = b.serve_connection(hyper_util::rt::TokioIo::new(conn), service);
            let _ = tokio::time::timeout(Duration::from_secs(30), conn).await;
        });
    }
}

fn respond<B>(
    req: &hyper::Request<B>,
    m: &Metrics,
) -> hyper::Response<http_body_util::Full<bytes::Bytes>> {
    let (status, ctype, body) = match (req.method(), req.uri().path()) {
        (&hyper::Method::GET, "/metrics") => (
            hyper::StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            m.exposition(),
        ),
        // Liveness for probes (the kubelet's gRPC probe cannot speak TLS).
        (&hyper::Method::GET, "/healthz") => (hyper::StatusCode::OK, "text/plain", "ok\n".into()),
        (&hyper::Method::GET, _) => (
            hyper::StatusCode::NOT_FOUND,
            "text/plain",
            "not found\n".into(),
        ),
        _ => (
            hyper::StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "GET /metrics\n".into(),
        ),
    };
    let mut resp = hyper::Response::new(http_body_util::Full::new(bytes::Bytes::from(body)));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(ctype),
    );
    resp
}

/// This process's resource use as Prometheus' client libraries name it, from `/proc/self`.
fn process_metrics(o: &mut String) {
    let head = |o: &mut String, name: &str, kind: &str, help: &str| {
        let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}");
    };
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the parenthesised command name: state is field 3 (index 0 here).
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, r)| r.split_whitespace().collect())
        .unwrap_or_default();
    let field = |n: usize| fields.get(n - 3).and_then(|v| v.parse::<u64>().ok());
    let ticks = rustix::param::clock_ticks_per_second() as f64;
    if let (Some(utime), Some(stime)) = (field(14), field(15)) {
        head(
            o,
            "process_cpu_seconds_total",
            "counter",
            "User and system CPU time spent in seconds.",
        );
        let _ = writeln!(
            o,
            "process_cpu_seconds_total {}",
            (utime + stime) as f64 / ticks
        );
    }
    if let Some(rss) = field(24) {
        head(
            o,
            "process_resident_memory_bytes",
            "gauge",
            "Resident memory size in bytes.",
        );
        let _ = writeln!(
            o,
            "process_resident_memory_bytes {}",
            rss * rustix::param::page_size() as u64
        );
    }
    if let Some(vsize) = field(23) {
        head(
            o,
            "process_virtual_memory_bytes",
            "gauge",
            "Virtual memory size in bytes.",
        );
        let _ = writeln!(o, "process_virtual_memory_bytes {vsize}");
    }
    let btime = std::fs::read_to_string("/proc/stat").ok().and_then(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("btime ")?.trim().parse::<u64>().ok())
    });
    if let (Some(start), Some(btime)) = (field(22), btime) {
        head(
            o,
            "process_start_time_seconds",
            "gauge",
            "Start time of the process since unix epoch in seconds.",
        );
        let _ = writeln!(
            o,
            "process_start_time_seconds {}",
            btime as f64 + start as f64 / ticks
        );
    }
    if let Some(threads) = field(20) {
        head(
            o,
            "process_threads",
            "gauge",
            "Number of OS threads in the process.",
        );
        let _ = writeln!(o, "process_threads {threads}");
    }
    if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
        head(
            o,
            "process_open_fds",
            "gauge",
            "Number of open file descriptors.",
        );
        let _ = writeln!(o, "process_open_fds {}", fds.count());
    }
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    if let Some(max) = limit.current {
        head(
            o,
            "process_max_fds",
            "gauge",
            "Maximum number of open file descriptors.",
        );
        let _ = writeln!(o, "process_max_fds {max}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The exposition scrapers read, for requests ended by typed limits and seccomp actions:
    /// names, labels and values. A change here breaks dashboards and alerts.
    #[test]
    fn the_exposition_format_is_pinned() {
        use vocab::record::Limit;
        use vocab::record::SeccompAction;
        let m = Arc::new(Metrics::default());
        m.finished(&Finished {
            rpc: vocab::request::Operation::Generate.rpc_name(),
            code: "OK",
            policy: "default",
            duration: Duration::from_millis(40),
            bytes_in: 10,
            bytes_out: 20,
            ..Default::default()
        });
        m.finished(&Finished {
            rpc: vocab::request::Operation::Match.rpc_name(),
            code: "ResourceExhausted",
            policy: "team-a",
            duration: Duration::from_secs(2),
            kill: kill_reason(Some(Limit::Pids)),
            rejection: None,
            seccomp: vec![("unshare", SeccompAction::Denied.as_str(), 3)],
            egress: vec![
                vocab::egress::Decision::Allowed.as_str(),
                vocab::egress::Decision::Denied.as_str(),
                vocab::egress::Decision::Denied.as_str(),
            ],
            ..Default::default()
        });
        m.finished(&Finished {
            rpc: vocab::request::Operation::Parameters.rpc_name(),
            code: "InvalidArgument",
            policy: "default",
            duration: Duration::from_millis(1),
            kill: kill_reason(Some(Limit::Archive)),
            rejection: Some("policy"),
            seccomp: vec![("bpf", SeccompAction::Audited.as_str(), 1)],
            ..Default::default()
        });
        m.finished(&Finished {
            rpc: vocab::request::Operation::Generate.rpc_name(),
            code: "ResourceExhausted",
            policy: "default",
            duration: Duration::from_millis(1),
            busy: true,
            ..Default::default()
        });
        m.set_pool_source(|| Some((2, 16)));
        assert_eq!(m.render(), PINNED, "the metrics exposition changed");
    }

    const PINNED: &str = r#"# HELP cmp_warden_requests_total Requests by RPC, gRPC code and the policy they ran under.
# TYPE cmp_warden_requests_total counter
cmp_warden_requests_total{rpc="GenerateManifest",code="OK",policy="default"} 1
cmp_warden_requests_total{rpc="GenerateManifest",code="ResourceExhausted",policy="default"} 1
cmp_warden_requests_total{rpc="GetParametersAnnouncement",code="InvalidArgument",policy="default"} 1
cmp_warden_requests_total{rpc="MatchRepository",code="ResourceExhausted",policy="team-a"} 1
# HELP cmp_warden_request_duration_seconds Request duration by RPC.
# TYPE cmp_warden_request_duration_seconds histogram
cmp_warden_request_duration_seconds_bucket{rpc="GenerateManifest",le="0.05"} 2
cmp_warden_request_duration_seconds_bucket{rpc="GenerateManifest",le="0.1"} 2
cmp_warden_request_duration_seconds_bucket{rpc="GenerateManifest",le="0.25"} 2
cmp_warden_request_duration_seconds_bucket{rpc="GenerateManifest",le="0.5"} 2
cmp_warden_request_duration_seconds_bucket{rpc="GenerateManifest",le="1"} 2
cmp_warden_request_duration_seconds_bucket{rpc="GenerateManifest",le="2.5"} 2
cmp_warden_request_duration_seconds_bucket{rpc="GenerateManifest",le="5"} 2
cmp_warden_request_duration_seconds_bucket{rpc="GenerateManifest",le="10"} 2
cmp_warden_request_duration_seconds_bucket{rpc="GenerateManifest",le="30"} 2
cmp_warden_request_duration_seconds_bucket{rpc="GenerateManifest",le="60"} 2
cmp_warden_request_duration_seconds_bucket{rpc="GenerateManifest",le="120"} 2
cmp_warden_request_duration_seconds_bucket{rpc="GenerateManifest",le="300"} 2
cmp_warden_request_duration_seconds_bucket{rpc="GenerateManifest",le="+Inf"} 2
cmp_warden_request_duration_seconds_sum{rpc="GenerateManifest"} 0.041
cmp_warden_request_duration_seconds_count{rpc="GenerateManifest"} 2
cmp_warden_request_duration_seconds_bucket{rpc="GetParametersAnnouncement",le="0.05"} 1
cmp_warden_request_duration_seconds_bucket{rpc="GetParametersAnnouncement",le="0.1"} 1
cmp_warden_request_duration_seconds_bucket{rpc="GetParametersAnnouncement",le="0.25"} 1
cmp_warden_request_duration_seconds_bucket{rpc="GetParametersAnnouncement",le="0.5"} 1
cmp_warden_request_duration_seconds_bucket{rpc="GetParametersAnnouncement",le="1"} 1
cmp_warden_request_duration_seconds_bucket{rpc="GetParametersAnnouncement",le="2.5"} 1
cmp_warden_request_duration_seconds_bucket{rpc="GetParametersAnnouncement",le="5"} 1
cmp_warden_request_duration_seconds_bucket{rpc="GetParametersAnnouncement",le="10"} 1
cmp_warden_request_duration_seconds_bucket{rpc="GetParametersAnnouncement",le="30"} 1
cmp_warden_request_duration_seconds_bucket{rpc="GetParametersAnnouncement",le="60"} 1
cmp_warden_request_duration_seconds_bucket{rpc="GetParametersAnnouncement",le="120"} 1
cmp_warden_request_duration_seconds_bucket{rpc="GetParametersAnnouncement",le="300"} 1
cmp_warden_request_duration_seconds_bucket{rpc="GetParametersAnnouncement",le="+Inf"} 1
cmp_warden_request_duration_seconds_sum{rpc="GetParametersAnnouncement"} 0.001
cmp_warden_request_duration_seconds_count{rpc="GetParametersAnnouncement"} 1
cmp_warden_request_duration_seconds_bucket{rpc="MatchRepository",le="0.05"} 0
cmp_warden_request_duration_seconds_bucket{rpc="MatchRepository",le="0.1"} 0
cmp_warden_request_duration_seconds_bucket{rpc="MatchRepository",le="0.25"} 0
cmp_warden_request_duration_seconds_bucket{rpc="MatchRepository",le="0.5"} 0
cmp_warden_request_duration_seconds_bucket{rpc="MatchRepository",le="1"} 0
cmp_warden_request_duration_seconds_bucket{rpc="MatchRepository",le="2.5"} 1
cmp_warden_request_duration_seconds_bucket{rpc="MatchRepository",le="5"} 1
cmp_warden_request_duration_seconds_bucket{rpc="MatchRepository",le="10"} 1
cmp_warden_request_duration_seconds_bucket{rpc="MatchRepository",le="30"} 1
cmp_warden_request_duration_seconds_bucket{rpc="MatchRepository",le="60"} 1
cmp_warden_request_duration_seconds_bucket{rpc="MatchRepository",le="120"} 1
cmp_warden_request_duration_seconds_bucket{rpc="MatchRepository",le="300"} 1
cmp_warden_request_duration_seconds_bucket{rpc="MatchRepository",le="+Inf"} 1
cmp_warden_request_duration_seconds_sum{rpc="MatchRepository"} 2
cmp_warden_request_duration_seconds_count{rpc="MatchRepository"} 1
# HELP cmp_warden_received_bytes_total Compressed archive bytes received.
# TYPE cmp_warden_received_bytes_total counter
cmp_warden_received_bytes_total 10
# HELP cmp_warden_sent_bytes_total Manifest bytes returned.
# TYPE cmp_warden_sent_bytes_total counter
cmp_warden_sent_bytes_total 20
# HELP cmp_warden_sandbox_kills_total Requests ended by a sandbox limit, by reason and policy.
# TYPE cmp_warden_sandbox_kills_total counter
cmp_warden_sandbox_kills_total{reason="pids",policy="team-a"} 1
# HELP cmp_warden_archive_rejections_total Archives refused, by class.
# TYPE cmp_warden_archive_rejections_total counter
cmp_warden_archive_rejections_total{class="policy"} 1
# HELP cmp_warden_seccomp_events_total System calls the seccomp profile denied (enforce) or would have denied (audit).
# TYPE cmp_warden_seccomp_events_total counter
cmp_warden_seccomp_events_total{syscall="bpf",action="audited"} 1
cmp_warden_seccomp_events_total{syscall="unshare",action="denied"} 3
# HELP cmp_warden_egress_connections_total Connections through the egress proxy (network: allowList), by decision and policy.
# TYPE cmp_warden_egress_connections_total counter
cmp_warden_egress_connections_total{decision="allowed",policy="team-a"} 1
cmp_warden_egress_connections_total{decision="denied",policy="team-a"} 2
# HELP cmp_warden_admission_refusals_total Requests refused for want of a slot (--max-in-flight running, --max-queued waiting, or the deadline passed in the queue).
# TYPE cmp_warden_admission_refusals_total counter
cmp_warden_admission_refusals_total 1
# HELP cmp_warden_active_requests Requests in flight.
# TYPE cmp_warden_active_requests gauge
cmp_warden_active_requests 0
# HELP cmp_warden_uid_pool_in_use Leased UIDs.
# TYPE cmp_warden_uid_pool_in_use gauge
cmp_warden_uid_pool_in_use 2
# HELP cmp_warden_uid_pool_capacity UIDs in the pool.
# TYPE cmp_warden_uid_pool_capacity gauge
cmp_warden_uid_pool_capacity 16
"#;

    #[test]
    fn exposition_counts_and_buckets() {
        let m = Arc::new(Metrics::default());
        // Both requests end (their guards drop) before the scrape.
        drop((m.started(), m.started()));
        m.finished(&Finished {
            rpc: "GenerateManifest",
            code: "OK",
            policy: "default",
            duration: Duration::from_millis(200),
            bytes_in: 100,
            bytes_out: 50,
            ..Default::default()
        });
        m.finished(&Finished {
            rpc: "GenerateManifest",
            code: "ResourceExhausted",
            policy: "default",
            duration: Duration::from_secs(3),
            kill: Some("memory"),
            ..Default::default()
        });
        m.set_pool_source(|| Some((1, 16)));
        let t = m.render();
        for want in [
            "cmp_warden_requests_total{rpc=\"GenerateManifest\",code=\"OK\",policy=\"default\"} 1",
            "cmp_warden_requests_total{rpc=\"GenerateManifest\",code=\"ResourceExhausted\",policy=\"default\"} 1",
            "cmp_warden_request_duration_seconds_bucket{rpc=\"GenerateManifest\",le=\"0.25\"} 1",
            "cmp_warden_request_duration_seconds_bucket{rpc=\"GenerateManifest\",le=\"5\"} 2",
            "cmp_warden_request_duration_seconds_count{rpc=\"GenerateManifest\"} 2",
            "cmp_warden_received_bytes_total 100",
            "cmp_warden_sandbox_kills_total{reason=\"memory\",policy=\"default\"} 1",
            "cmp_warden_active_requests 0",
            "cmp_warden_uid_pool_in_use 1",
        ] {
            assert!(t.contains(want), "{want} missing from\n{t}");
        }
    }
}
