//! `plugin.ConfigManagementPluginService`: receives the stream, feeds the archive to the runner
//! as it arrives (hashing and counting it), releases end-of-file only once the checksum matches,
//! and enforces the deadline (`grpc-timeout` minus 100 ms, as Argo CD).

use std::io::{self, Read};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use plugin::PluginConfig;
use proto::plugin::config_management_plugin_service_server::ConfigManagementPluginService;
use proto::plugin::{
    AppStreamRequest, CheckPluginConfigurationResponse, ManifestResponse,
    ParametersAnnouncementResponse, RepositoryResponse, app_stream_request,
};
use proto::repository::ParameterAnnouncement;
use sha2::{Digest, Sha256};
use supervisor::{CancelReason, CancelToken, Executed, Plan, Runner};
use tokio::sync::mpsc;
use tonic::{Request, Response, Status, Streaming};
use tracing::Instrument;
use vocab::record::Limit;
use vocab::request::{Operation, Outcome, TimeLimit};

use crate::audit::{AuditSink, Seen};
use crate::conns::PeerInfo;
use crate::metrics::Metrics;
use crate::status::{StreamError, to_status};
use audit_event::ArchiveInfo;

/// Bytes handed to the extractor at once.
const BATCH: usize = 64 * 1024;

/// Argo CD starts work 100 ms before the client's deadline.
const DEADLINE_BUFFER: Duration = Duration::from_millis(100);

/// Settings the service needs.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    /// The set in force, which a reload replaces whole: what each policy means for a request
    /// (archive limits — the compressed cap is enforced while receiving too —, budgets, wall
    /// clock, environment), which policy a request's Argo CD variables select, and the
    /// plugin (`plugin.yaml`). A request reads it once, when it begins, and runs under that
    /// generation to its end.
    pub config: Arc<supervisor::Current<crate::reload::ConfigSet>>,
    /// `<workdir>/_cmp_server`: per-request trees are created here.
    pub work_dir: PathBuf,
    /// Where audit events go.
    pub audit: AuditSink,
    /// Metrics registry.
    pub metrics: Arc<Metrics>,
    /// Token every call arriving over TCP must carry (unix peers are authorised by credentials).
    pub tcp_token: Option<crate::auth::BearerToken>,
    /// Requests in flight, the queue, and how long a stream may stall.
    pub admission: crate::admission::AdmissionConfig,
    /// OpenTelemetry export (`--otlp-address`), when configured.
    pub tracer: Option<Arc<otlp::Exporter>>,
}

/// What the audit event needs that only the handler learns.
#[derive(Debug, Default)]
struct Ctx {
    app: String,
    app_rel_path: String,
    env_names: Vec<String>,
    archive: ArchiveInfo,
    record: Option<supervisor::record::Recorder>,
    limit: Option<Limit>,
    trace: Option<crate::trace::RequestTrace>,
    /// The caller's trace ID (its `traceparent`), traced here or not.
    caller_trace: Option<String>,
    timings: crate::trace::Timings,
    /// The plan the request runs under, once its header chose it.
    plan: Option<Arc<Plan>>,
    /// `ARGOCD_APP_PROJECT_NAME` (bounded), for the audit event.
    project: Option<String>,
}

/// How long past the policy's wall clock the service waits for the jail to report which
/// command it killed (TERM, then KILL after 5 s) before answering on its own.
const WALL_CLOCK_GRACE: Duration = Duration::from_secs(8);

/// The service.
#[derive(Debug, Clone)]
pub struct CmpService {
    cfg: Arc<ServiceConfig>,
    runner: Arc<dyn Runner>,
    admission: Arc<crate::admission::Admission>,
    active: Arc<Mutex<Vec<(u64, CancelToken)>>>,
    next_id: Arc<std::sync::atomic::AtomicU64>,
}

impl CmpService {
    /// A service using `runner`.
    pub fn new(cfg: ServiceConfig, runner: Arc<dyn Runner>) -> Self {
        Self {
            admission: Arc::new(crate::admission::Admission::new(cfg.admission)),
            cfg: Arc::new(cfg),
            runner,
            active: Arc::default(),
            next_id: Arc::default(),
        }
    }

    /// Cancel every request in flight (shutdown after the grace period).
    pub fn cancel_all(&self) {
        for (_, t) in self.active.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            t.cancel(CancelReason::Shutdown);
        }
    }

    /// Requests in flight.
    pub fn active(&self) -> usize {
        self.active.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// A TCP peer must present the token when one is configured (unix peers passed the
    /// credential check at accept). Refusals are logged here and audited by the caller.
    fn authenticate<T>(&self, req: &Request<T>) -> Result<(), Status> {
        let Some(token) = &self.cfg.tcp_token else {
            return Ok(());
        };
        let remote = match req.extensions().get::<Option<PeerInfo>>() {
            Some(Some(PeerInfo::Unix { .. })) => return Ok(()),
            Some(Some(PeerInfo::Tcp { remote, .. })) => *remote,
            _ => None,
        };
        let header = req.metadata().get("authorization").map(|v| v.as_bytes());
        token.check(header).map_err(|e| {
            static REFUSED: crate::sparse::Sparse = crate::sparse::Sparse::new();
            let remote = remote.map(|r| r.to_string()).unwrap_or_default();
            REFUSED.warn(
                "request refused: authentication",
                &format_args!("{remote}: {e}"),
            );
            crate::status::unauthenticated(&e)
        })
    }

    async fn handle(
        &self,
        op: Operation,
        req: Request<Streaming<AppStreamRequest>>,
    ) -> Result<Executed, Status> {
        let client_deadline = grpc_deadline(&req).map(|d| (d, TimeLimit::Client));
        let id = self
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let request_id = uuid::Uuid::new_v4();
        let span = tracing::info_span!("request", %request_id, rpc = op.rpc_name(), app = tracing::field::Empty);
        let started = Instant::now();
        let _active = self.cfg.metrics.started();
        let mut audit = AuditGuard {
            svc: self.clone(),
            op,
            request_id,
            started,
            ctx: Some(Ctx::default()),
            handoff: None,
        };
        if let Err(refused) = self.authenticate(&req) {
            if let Some(ctx) = audit.ctx.as_mut() {
                ctx.limit = Some(Limit::Authentication);
            }
            let out = Err(refused);
            audit.finish(&out);
            return out;
        }
        // Traced only once authenticated: the caller's sampling flag is not trusted before.
        if let Some(ctx) = audit.ctx.as_mut() {
            let traceparent = req
                .metadata()
                .get("traceparent")
                .and_then(|v| v.to_str().ok());
            ctx.trace = crate::trace::RequestTrace::begin(self.cfg.tracer.as_deref(), traceparent);
            ctx.caller_trace = crate::trace::caller_trace_id(traceparent);
        }
        let out = self
            .handle_inner(
                op,
                req.into_inner(),
                client_deadline,
                id,
                request_id,
                &mut audit,
            )
            .instrument(span)
            .await;
        audit.finish(&out);
        out
    }

    /// The request's audit event and metrics (also for requests refused before any sandbox),
    /// and its trace's spans.
    fn account(
        &self,
        op: Operation,
        request_id: uuid::Uuid,
        ctx: Ctx,
        out: &Result<Executed, Status>,
        elapsed: Duration,
    ) {
        if supervisor::bench::off().audit {
            return; // a benchmark build's layer pass: no event, no request metrics
        }
        // One snapshot of what ran, for the trace and the audit event.
        let record = ctx
            .record
            .as_ref()
            .map(supervisor::record::snapshot)
            .unwrap_or_default();
        if let (Some(trace), Some(tracer)) = (&ctx.trace, &self.cfg.tracer) {
            tracer.submit(trace.spans(
                op,
                &ctx.app,
                &request_id.to_string(),
                ctx.timings,
                &record,
                crate::trace::Ending {
                    code: out.as_ref().map_or_else(Status::code, |_| tonic::Code::Ok),
                    message: out.as_ref().err().map(Status::message),
                    at: std::time::SystemTime::now(),
                },
            ));
        }
        let bytes_out = match out.as_ref().map(|e| &e.outcome) {
            Ok(Outcome::Manifests(m)) => m.iter().map(|s| s.len() as u64).sum(),
            _ => 0,
        };
        // Refused before its header chose a plan: the default in force.
        let default_plan = self.cfg.config.current().plans.default_plan().clone();
        crate::lifecycle::account(
            &self.cfg.metrics,
            &self.cfg.audit,
            crate::lifecycle::Ending {
                op,
                seen: Seen {
                    request_id: request_id.to_string(),
                    trace_id: ctx
                        .trace
                        .as_ref()
                        .map(crate::trace::RequestTrace::trace_id)
                        .or(ctx.caller_trace),
                    app: ctx.app,
                    project: ctx.project,
                    app_rel_path: ctx.app_rel_path,
                    env_names: ctx.env_names,
                    archive: ctx.archive,
                    limit: ctx.limit,
                },
                result: out.as_ref().map(|_| ()),
                code: None,
                elapsed,
                plan: ctx.plan.as_deref().unwrap_or(&default_plan),
                record,
                bytes_out,
                refused: ctx.limit == Some(Limit::Authentication),
            },
        );
    }

    /// One CMP call, after authentication: steps 1–4 and 14 of a request (docs/supervisor.md,
    /// "Per request"; 5–13 run in the supervisor's jail, 15–16 in [`lifecycle`]):
    ///
    /// 1. the stream's header: metadata, its environment and `appRelPath` checked
    ///    ([`CmpService::receive_header`]), then the policy its Argo CD variables select
    ///    ([`Plans::select`]), whose clocks and limits bound the rest;
    /// 2. the archive's first chunk (no jail before the archive starts to arrive);
    /// 3. a slot, waiting in the queue within the request's deadline ([`Admission`]);
    /// 4. the request handed to the runner on a blocking thread, reading the archive from a
    ///    channel ([`CmpService::start_run`]), and the archive received into that channel, its
    ///    end let through only once the checksum matched ([`CmpService::receive`]), while the
    ///    runner takes its jail and streams the archive to it (steps 5–13);
    /// 14. the runner's answer awaited within the deadline ([`CmpService::answer`]).
    ///
    /// [`lifecycle`]: crate::lifecycle
    /// [`Admission`]: crate::admission::Admission
    async fn handle_inner(
        &self,
        op: Operation,
        mut stream: Streaming<AppStreamRequest>,
        client_deadline: Option<(Instant, TimeLimit)>,
        id: u64,
        request_id: uuid::Uuid,
        audit: &mut AuditGuard,
    ) -> Result<Executed, Status> {
        let Some(ctx) = audit.ctx.as_mut() else {
            return Err(crate::status::internal("request context missing"));
        };
        let started = Instant::now();
        // Receiving is bounded by the request's deadline, the archive's wall clock and the
        // longest pause between two messages: a stalled client holds nothing for long. Until
        // the header chose the request's policy, the default's clocks.
        // The set in force when the request began: it runs under it to its end.
        let set = self.cfg.config.current();
        let (plans, plugin) = (&set.plans, set.plugin.clone());
        let default = plans.default_plan().clone();
        let (deadline, _) = default.deadline_from(started, client_deadline.clone());
        let mut clock = ReceiveClock {
            deadline,
            archive_by: started + default.archive.limits.wall_clock,
            archive_secs: default.archive.limits.wall_clock.as_secs(),
            idle: self.cfg.admission.stream_idle,
            holding_slot: false,
        };

        // 1. The header, and the policy it selects (`spec.select`: Argo CD's own variables
        //    only), whose clocks then bound the request from its start.
        let meta = self.receive_header(&clock, &mut stream, ctx).await?;
        let selected = plans
            .select(meta.env.iter().map(|e| (e.name.as_str(), e.value.as_str())))
            .map_err(|why| StreamError::Selection(why).to_status())?;
        let plan = selected.plan.clone();
        // Named in the audit event only once it selected without ambiguity.
        ctx.project = selected
            .project
            .map(|p| vocab::request::bounded(&p, 256).into_owned());
        // The application as Argo CD names it, where the repo-server says (the metadata's
        // `appName` is the last directory of its path).
        if let Some(a) = selected.application {
            ctx.app = vocab::request::bounded(&a, 256).into_owned();
            tracing::Span::current().record("app", ctx.app.as_str());
        }
        let (deadline, limit) = plan.deadline_from(started, client_deadline);
        clock.deadline = deadline;
        clock.archive_by = started + plan.archive.limits.wall_clock;
        clock.archive_secs = plan.archive.limits.wall_clock.as_secs();
        ctx.plan = Some(plan.clone());

        // 2. The first chunk.
        let first = match clock.next(&mut stream).await {
            Ok(m) => m,
            Err(e) => {
                ctx.limit = Some(Limit::Timeout);
                return Err(e.to_status());
            }
        };
        let first = match first {
            None => None,
            Some(m) => match m.request {
                Some(app_stream_request::Request::File(f)) => Some(f.chunk),
                _ => return Err(StreamError::NotAFile.to_status()),
            },
        };

        // 3. A slot. Nothing is read meanwhile (flow control holds the client back), so the
        // wait does not count against the archive's wall clock.
        let queued = Instant::now();
        let slot = match self.admission.admit(deadline).await {
            Ok(s) => s,
            Err(e) => {
                ctx.limit = Some(Limit::Concurrency);
                return Err(e.to_status());
            }
        };
        clock.archive_by += queued.elapsed();
        // Holding a slot (a jail, a UID) now: a pause is tolerated only briefly, or stalled
        // streams would keep every slot until the archive's wall clock and starve honest
        // requests queued behind them.
        clock.idle = clock
            .idle
            .min(Duration::from_secs(crate::status::HELD_STREAM_IDLE_SECS));
        clock.holding_slot = true;

        // 4. The run, and the archive it reads.
        let cancel = CancelToken::new();
        let _guard = ActiveGuard::new(&self.active, id, &cancel);
        let (tx, task) = self.start_run(
            op,
            (&plan, &plugin),
            &meta,
            request_id,
            (deadline, &limit),
            slot,
            &cancel,
            ctx,
            &mut audit.handoff,
        );

        // 4, its archive.
        let received = Self::receive(
            plan.archive.limits.compressed_bytes,
            &mut stream,
            first,
            &tx,
            &meta.checksum,
            &clock,
            &mut ctx.archive,
        )
        .await;
        ctx.timings.received = Some(std::time::SystemTime::now());
        match &received {
            Err(
                StreamError::Stalled(_)
                | StreamError::StalledHoldingSlot(_)
                | StreamError::ReceiveTimeout(_),
            ) => ctx.limit = Some(Limit::Timeout),
            Err(StreamError::TooLarge(_) | StreamError::Checksum) => {
                ctx.limit = Some(Limit::Archive);
            }
            _ => {}
        }
        if let Err(e) = &received {
            let _ = tx.try_send(Chunk::Abort);
            if matches!(e, StreamError::Cancelled) {
                cancel.cancel(CancelReason::Cancelled);
            }
        }
        drop(tx);

        // 14. The answer.
        let out = Self::answer(task, received, (deadline, limit), &cancel, ctx).await;
        match &out {
            Ok(_) => tracing::info!(
                ms = started.elapsed().as_millis() as u64,
                us = started.elapsed().as_micros() as u64,
                "request finished"
            ),
            Err(s) => {
                tracing::warn!(ms = started.elapsed().as_millis() as u64, code = ?s.code(), error = %s.message(), "request failed")
            }
        }
        out
    }

    /// Step 1: the stream's first message must be its metadata; its environment and
    /// `appRelPath` are refused before anything composes or copies them.
    async fn receive_header(
        &self,
        clock: &ReceiveClock,
        stream: &mut Streaming<AppStreamRequest>,
        ctx: &mut Ctx,
    ) -> Result<proto::plugin::ManifestRequestMetadata, Status> {
        let first = match clock.next(stream).await {
            Err(
                e @ (StreamError::Deadline
                | StreamError::Stalled(_)
                | StreamError::StalledHoldingSlot(_)
                | StreamError::ReceiveTimeout(_)),
            ) => {
                return Err(e.to_status());
            }
            Err(e) => return Err(StreamError::Header(e.to_string()).to_status()),
            Ok(None) => return Err(StreamError::Header("EOF".into()).to_status()),
            Ok(Some(m)) => m,
        };
        let Some(app_stream_request::Request::Metadata(meta)) = first.request else {
            return Err(StreamError::NoMetadata.to_status());
        };
        ctx.app = vocab::request::bounded(&meta.app_name, 256).into_owned();
        tracing::Span::current().record("app", ctx.app.as_str());
        ctx.app_rel_path = vocab::request::bounded(&meta.app_rel_path, 1024).into_owned();
        // The audit event names the variables, not a flood of them.
        ctx.env_names = meta
            .env
            .iter()
            .take(256)
            .map(|e| vocab::request::bounded(&e.name, 128).into_owned())
            .collect();
        // (A flood of entries cost a worker thread seconds when composition was quadratic.)
        plugin::env::check_request(meta.env.iter().map(|e| (e.name.as_str(), e.value.as_str())))
            .map_err(|e| StreamError::from(e).to_status())?;
        if meta.app_rel_path.len() > crate::status::MAX_APP_REL_PATH {
            return Err(StreamError::AppRelPath(meta.app_rel_path.len()).to_status());
        }
        match clock.deadline {
            Some(d) => {
                tracing::info!(app_rel_path = %ctx.app_rel_path, deadline_ms = d.saturating_duration_since(Instant::now()).as_millis() as u64, "request received")
            }
            None => tracing::info!(app_rel_path = %ctx.app_rel_path, "request received"),
        }
        Ok(meta)
    }

    /// Step 4: the request's spec from the plan, handed to the runner on a blocking thread
    /// that reads the archive from the returned channel; the result comes back on the
    /// receiver as soon as it exists, and the jail is reclaimed right after, off the
    /// response's critical path (then the slot is free).
    #[allow(clippy::too_many_arguments)]
    fn start_run(
        &self,
        op: Operation,
        (plan, plugin): (&Arc<Plan>, &PluginConfig),
        meta: &proto::plugin::ManifestRequestMetadata,
        request_id: uuid::Uuid,
        (deadline, limit): (Option<Instant>, &TimeLimit),
        slot: crate::admission::Slot,
        cancel: &CancelToken,
        ctx: &mut Ctx,
        handoff_slot: &mut Option<Arc<Mutex<Handoff>>>,
    ) -> (
        mpsc::Sender<Chunk>,
        tokio::sync::oneshot::Receiver<crate::lifecycle::RunResult>,
    ) {
        // The runner creates (and later reclaims) this directory; the service never touches it.
        let tree = self.cfg.work_dir.join(request_id.to_string());
        let env: Vec<(String, String)> = meta
            .env
            .iter()
            .map(|e| (e.name.clone(), e.value.clone()))
            .collect();
        let mut spec = plan.request(
            op,
            plugin,
            tree,
            &meta.app_rel_path,
            &env,
            (deadline, limit.clone()),
        );
        // Chooses a cached tree; the bytes are verified as they arrive all the same.
        spec.task.archive_sha256 = Some(meta.checksum.clone());
        // Decides whether it is worth caching; 0 (not stated) leaves that to the cache.
        spec.task.archive_size = u64::try_from(meta.size).ok().filter(|n| *n > 0);
        ctx.record = Some(spec.record.clone());

        // EOF is only delivered after the checksum matched, so nothing runs on unverified
        // bytes. Eight 64 KiB batches in flight per request: enough to keep the jail busy,
        // and what bounds the server's memory when many requests stream at once (flow
        // control holds the rest at the client).
        let (tx, rx) = mpsc::channel::<Chunk>(8);
        let handoff = Arc::new(Mutex::new(Handoff::Running));
        *handoff_slot = Some(handoff.clone());
        let input = Box::new(ChannelReader {
            rx,
            cur: Vec::new(),
            pos: 0,
        });
        let result_rx = crate::lifecycle::run(&self.runner, spec, input, cancel, slot, move || {
            // The client went away while this ran: its audit event is ours to emit, now that
            // the record says what really ran.
            let abandoned = match std::mem::replace(
                &mut *handoff.lock().unwrap_or_else(|e| e.into_inner()),
                Handoff::RunnerDone,
            ) {
                Handoff::Abandoned(a) => Some(a),
                _ => None,
            };
            if let Some(a) = abandoned {
                a.emit();
            }
        });
        (tx, result_rx)
    }

    /// Step 14: the runner's answer. At the client's deadline the client gives up, so answer
    /// then; for the policy's wall clock the jail kills the command itself and names it, so
    /// it has time to say so.
    async fn answer(
        task: tokio::sync::oneshot::Receiver<crate::lifecycle::RunResult>,
        received: Result<(), StreamError>,
        (deadline, limit): (Option<Instant>, TimeLimit),
        cancel: &CancelToken,
        ctx: &mut Ctx,
    ) -> Result<Executed, Status> {
        let answer_by = match (&limit, deadline) {
            (TimeLimit::Request { .. }, Some(d)) => Some(d + WALL_CLOCK_GRACE),
            (_, d) => d,
        };
        let result = match answer_by {
            Some(d) => match tokio::time::timeout_at(d.into(), task).await {
                Ok(r) => r,
                Err(_) => {
                    // The runner kills its commands (TERM, then KILL) once cancelled.
                    cancel.cancel(CancelReason::Cancelled);
                    ctx.limit = Some(match limit {
                        TimeLimit::Client => Limit::ClientDeadline,
                        _ => Limit::Timeout,
                    });
                    return Err(match limit {
                        TimeLimit::Request { seconds } => {
                            crate::status::request_wall_clock(seconds)
                        }
                        _ => StreamError::Deadline.to_status(),
                    });
                }
            },
            None => task.await,
        };
        ctx.timings.answered = Some(std::time::SystemTime::now());
        let result =
            result.map_err(|e| crate::status::internal(format!("request task failed: {e}")))?;
        match (received, result) {
            (Err(e), _) => Err(e.to_status()),
            (Ok(()), Ok(o)) => Ok(o),
            (Ok(()), Err(e)) => Err(to_status(&e)),
        }
    }

    /// Step 4, the archive: its chunks into the run's channel within the archive's size and
    /// clocks; its end let through only once the SHA-256 of everything received matched the
    /// metadata's checksum (a mismatch aborts the run: nothing executes).
    async fn receive(
        cap: u64,
        stream: &mut Streaming<AppStreamRequest>,
        first: Option<Vec<u8>>,
        tx: &mpsc::Sender<Chunk>,
        checksum: &str,
        clock: &ReceiveClock,
        info: &mut ArchiveInfo,
    ) -> Result<(), StreamError> {
        let mut hasher = Sha256::new();
        let mut total: u64 = 0;
        let mut runner_gone = false;
        // Chunks arrive at 1 KiB (Argo's default); hand them to the blocking extractor in
        // 64 KiB batches so the thread handoff is paid per batch, not per chunk.
        let mut batch: Vec<u8> = Vec::with_capacity(BATCH);
        let mut next = first;
        let mut ended = next.is_none();
        while let Some(chunk) = next.take() {
            total += chunk.len() as u64;
            info.bytes = total;
            if total > cap {
                return Err(StreamError::TooLarge(cap));
            }
            hasher.update(&chunk);
            batch.extend_from_slice(&chunk);
            if batch.len() >= BATCH && !runner_gone {
                let full = std::mem::replace(&mut batch, Vec::with_capacity(BATCH));
                // The runner may already have refused the archive; keep draining to report its error.
                runner_gone = tx.send(Chunk::Data(full)).await.is_err();
            }
            if ended {
                break;
            }
            next = match clock.next(stream).await? {
                None => {
                    ended = true;
                    None
                }
                Some(m) => match m.request {
                    Some(app_stream_request::Request::File(f)) => Some(f.chunk),
                    _ => return Err(StreamError::NotAFile),
                },
            };
        }
        if !batch.is_empty() && !runner_gone {
            let _ = tx.send(Chunk::Data(batch)).await;
        }
        let actual = hex::encode(hasher.finalize());
        info.sha256 = Some(actual.clone());
        if actual != checksum {
            return Err(StreamError::Checksum);
        }
        let _ = tx.send(Chunk::End).await;
        Ok(())
    }
}

/// When receiving a request's stream must end, whichever comes first: the request's deadline,
/// the archive's wall clock (from the metadata on), or a pause longer than the idle timeout.
#[derive(Debug, Clone, Copy)]
struct ReceiveClock {
    deadline: Option<Instant>,
    archive_by: Instant,
    archive_secs: u64,
    idle: Duration,
    holding_slot: bool,
}

impl ReceiveClock {
    /// The stream's next message (`None` at its end), or which bound ended the wait.
    async fn next(
        &self,
        stream: &mut Streaming<AppStreamRequest>,
    ) -> Result<Option<AppStreamRequest>, StreamError> {
        let idle_by = Instant::now() + self.idle;
        let stalled = if self.holding_slot {
            StreamError::StalledHoldingSlot(self.idle.as_secs())
        } else {
            StreamError::Stalled(self.idle.as_secs())
        };
        let mut end = (idle_by, stalled);
        if self.archive_by < end.0 {
            end = (
                self.archive_by,
                StreamError::ReceiveTimeout(self.archive_secs),
            );
        }
        if let Some(d) = self.deadline
            && d < end.0
        {
            end = (d, StreamError::Deadline);
        }
        match tokio::time::timeout_at(end.0.into(), stream.message()).await {
            Err(_) => Err(end.1),
            Ok(Err(s)) if s.code() == tonic::Code::Cancelled => Err(StreamError::Cancelled),
            Ok(Err(s)) => Err(StreamError::Receive(s.message().to_owned())),
            Ok(Ok(m)) => Ok(m),
        }
    }
}

/// Who emits a request's audit event when its client goes away mid-request (the handler's
/// future is dropped): the handler's guard when the runner is done or never started, else the
/// runner's task once it is done, so the event says what really ran.
enum Handoff {
    /// The runner is still working.
    Running,
    /// The runner is done (its record is complete).
    RunnerDone,
    /// The handler is gone; the runner's task emits this.
    Abandoned(Box<Abandoned>),
}

/// A request's audit event waiting for its runner: the client was answered (or went away)
/// before the runner was done, and the event must say what really ran.
struct Abandoned {
    svc: CmpService,
    op: Operation,
    request_id: uuid::Uuid,
    ctx: Ctx,
    started: Instant,
    /// What the client was told; `None`: it went away without an answer.
    answered: Option<Status>,
}

impl Abandoned {
    fn emit(self) {
        let mut ctx = self.ctx;
        let out = Err(match self.answered {
            Some(status) => status,
            None => {
                if ctx.limit.is_none() {
                    ctx.limit = Some(Limit::Cancelled);
                }
                crate::status::client_went_away()
            }
        });
        self.svc
            .account(self.op, self.request_id, ctx, &out, self.started.elapsed());
    }
}

/// Exactly one audit event per request: [`AuditGuard::finish`] on every path the handler
/// returns by, and on drop (the client went away and tonic dropped the handler) either now or,
/// when a runner still works on the request, by the runner's task.
struct AuditGuard {
    svc: CmpService,
    op: Operation,
    request_id: uuid::Uuid,
    started: Instant,
    /// Taken when the event is emitted.
    ctx: Option<Ctx>,
    handoff: Option<Arc<Mutex<Handoff>>>,
}

impl AuditGuard {
    /// The handler answered with `out`. An error answered while the runner still works (the
    /// client's deadline) is audited once the runner is done.
    fn finish(&mut self, out: &Result<Executed, Status>) {
        let Some(ctx) = self.ctx.take() else {
            return;
        };
        if let (Err(status), Some(h)) = (out, &self.handoff) {
            let mut state = h.lock().unwrap_or_else(|e| e.into_inner());
            if matches!(*state, Handoff::Running) {
                *state = Handoff::Abandoned(Box::new(Abandoned {
                    svc: self.svc.clone(),
                    op: self.op,
                    request_id: self.request_id,
                    ctx,
                    started: self.started,
                    answered: Some(status.clone()),
                }));
                return;
            }
        }
        self.svc
            .account(self.op, self.request_id, ctx, out, self.started.elapsed());
    }
}

impl Drop for AuditGuard {
    fn drop(&mut self) {
        let Some(ctx) = self.ctx.take() else {
            return;
        };
        // Logged here, not where the commands are cancelled: a client can go away at any
        // stage (before admission too), and each abandonment is logged exactly once.
        tracing::warn!(
            request_id = %self.request_id,
            rpc = self.op.rpc_name(),
            "request abandoned by the client: its commands (if any) are cancelled"
        );
        let abandoned = Abandoned {
            svc: self.svc.clone(),
            op: self.op,
            request_id: self.request_id,
            ctx,
            started: self.started,
            answered: None,
        };
        if let Some(h) = &self.handoff {
            let mut state = h.lock().unwrap_or_else(|e| e.into_inner());
            if matches!(*state, Handoff::Running) {
                *state = Handoff::Abandoned(Box::new(abandoned));
                return;
            }
        }
        abandoned.emit();
    }
}

struct ActiveGuard {
    list: Arc<Mutex<Vec<(u64, CancelToken)>>>,
    id: u64,
    cancel: CancelToken,
}

impl ActiveGuard {
    /// List `cancel` as request `id`'s among those in flight, until dropped.
    fn new(list: &Arc<Mutex<Vec<(u64, CancelToken)>>>, id: u64, cancel: &CancelToken) -> Self {
        list.lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((id, cancel.clone()));
        Self {
            list: list.clone(),
            id,
            cancel: cancel.clone(),
        }
    }
}

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        // If the handler is dropped (client went away), the runner must stop too
        // (`AuditGuard`'s drop logs the abandonment).
        self.cancel.cancel(CancelReason::Cancelled);
        self.list
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(i, _)| *i != self.id);
    }
}

/// `grpc-timeout` → the instant work must end (minus Argo's 100 ms buffer).
fn grpc_deadline<T>(req: &Request<T>) -> Option<Instant> {
    let v = req.metadata().get("grpc-timeout")?.to_str().ok()?;
    let (num, unit) = v.split_at(v.len().checked_sub(1)?);
    let n: u64 = num.parse().ok()?;
    let d = match unit {
        "H" => Duration::from_secs(n.saturating_mul(3600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    };
    Some(Instant::now() + d.saturating_sub(DEADLINE_BUFFER))
}

enum Chunk {
    Data(Vec<u8>),
    End,
    Abort,
}

/// Blocking reader over the chunk channel.
struct ChannelReader {
    rx: mpsc::Receiver<Chunk>,
    cur: Vec<u8>,
    pos: usize,
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.pos >= self.cur.len() {
            match self.rx.blocking_recv() {
                Some(Chunk::Data(d)) => {
                    self.cur = d;
                    self.pos = 0;
                }
                Some(Chunk::End) => return Ok(0),
                Some(Chunk::Abort) | None => {
                    return Err(io::Error::new(
                        io::ErrorKind::ConnectionAborted,
                        "archive stream aborted",
                    ));
                }
            }
        }
        let n = (self.cur.len() - self.pos).min(buf.len());
        buf[..n].copy_from_slice(&self.cur[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

fn announcement(a: vocab::request::ParameterAnnouncement) -> ParameterAnnouncement {
    ParameterAnnouncement {
        name: a.name,
        title: a.title,
        tooltip: a.tooltip,
        required: a.required,
        item_type: a.item_type,
        collection_type: a.collection_type,
        string: a.string,
        array: a.array,
        map: a.map.into_iter().collect(),
    }
}

#[tonic::async_trait]
impl ConfigManagementPluginService for CmpService {
    async fn generate_manifest(
        &self,
        req: Request<Streaming<AppStreamRequest>>,
    ) -> Result<Response<ManifestResponse>, Status> {
        let done = self.handle(Operation::Generate, req).await?;
        match done.outcome {
            // The reply's share of the server's reply memory is held until the response is
            // written (`reply_memory`).
            Outcome::Manifests(manifests) => Ok(crate::reply_memory::attach(
                Response::new(ManifestResponse {
                    manifests,
                    source_type: String::new(),
                }),
                done.memory,
            )),
            other => Err(crate::status::internal(format!(
                "unexpected outcome {other:?}"
            ))),
        }
    }

    async fn check_plugin_configuration(
        &self,
        req: Request<()>,
    ) -> Result<Response<CheckPluginConfigurationResponse>, Status> {
        self.authenticate(&req)?;
        let plugin = self.cfg.config.current().plugin.clone();
        Ok(Response::new(CheckPluginConfigurationResponse {
            is_discovery_configured: plugin.spec.discover.is_defined(),
            provide_git_creds: plugin.spec.provide_git_creds,
        }))
    }

    async fn match_repository(
        &self,
        req: Request<Streaming<AppStreamRequest>>,
    ) -> Result<Response<RepositoryResponse>, Status> {
        match self.handle(Operation::Match, req).await?.outcome {
            Outcome::Match {
                supported,
                discovery_enabled,
            } => Ok(Response::new(RepositoryResponse {
                is_supported: supported,
                is_discovery_enabled: discovery_enabled,
            })),
            other => Err(crate::status::internal(format!(
                "unexpected outcome {other:?}"
            ))),
        }
    }

    async fn get_parameters_announcement(
        &self,
        req: Request<Streaming<AppStreamRequest>>,
    ) -> Result<Response<ParametersAnnouncementResponse>, Status> {
        let done = self.handle(Operation::Parameters, req).await?;
        match done.outcome {
            Outcome::Parameters(list) => Ok(crate::reply_memory::attach(
                Response::new(ParametersAnnouncementResponse {
                    parameter_announcements: list.into_iter().map(announcement).collect(),
                }),
                done.memory,
            )),
            other => Err(crate::status::internal(format!(
                "unexpected outcome {other:?}"
            ))),
        }
    }
}
