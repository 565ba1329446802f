//! The ApplicationSet plugin generator's HTTP service (Argo CD's `applicationset/services/plugin`
//! client): `POST
//! /api/v1/getparams.execute` with `Authorization: Bearer <token>` and a JSON body
//! `{"applicationSetName": …, "input": {"parameters": {…}}}`, answered with
//! `{"output": {"parameters": [{…}, …]}}`. A command source runs in the same jail as CMP
//! commands (request body on stdin); errors are JSON `{"error", "message"}` with the status the
//! controller reports as `API error with status code <n>: <message>`.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use policy::generator::{GeneratorConfig, Source};
use supervisor::{CancelToken, Plan, Runner};
use tokio::sync::{Semaphore, mpsc, watch};
use vocab::record::Limit;
use vocab::request::{ErrorKind, GENERATOR_REQUEST, Operation, Outcome, TimeLimit};

use crate::audit::{AuditSink, Seen};
use crate::auth::BearerToken;
use crate::listener::{Conn, spawn_tcp_acceptor};
use crate::metrics::Metrics;
use audit_event::ArchiveInfo;

/// The one path the controller calls.
pub const PATH: &str = "/api/v1/getparams.execute";

/// Everything a generator request needs.
#[derive(Debug)]
pub struct AppSetService {
    /// The validated generator config.
    pub config: GeneratorConfig,
    /// Confines the command source.
    pub runner: Arc<dyn Runner>,
    /// Required on every request.
    pub token: BearerToken,
    /// Parent of request trees (the runner creates and removes them).
    pub work_dir: PathBuf,
    /// What the policy means for each request (archive limits, budgets, environment).
    pub plan: Arc<Plan>,
    /// Audit events.
    pub audit: AuditSink,
    /// Prometheus metrics.
    pub metrics: Arc<Metrics>,
    slots: Arc<Semaphore>,
}

/// Client text echoed in an error: at most 256 bytes of it (cut on a character boundary).
fn echoed(s: &str) -> String {
    const MAX: usize = 256;
    if s.len() <= MAX {
        return s.to_owned();
    }
    let mut end = MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &s[..end], s.len())
}

impl AppSetService {
    /// Bundle the pieces; the concurrency limit comes from the config.
    pub fn new(
        config: GeneratorConfig,
        runner: Arc<dyn Runner>,
        token: BearerToken,
        work_dir: PathBuf,
        plan: Arc<Plan>,
        audit: AuditSink,
        metrics: Arc<Metrics>,
    ) -> Self {
        let slots = Arc::new(Semaphore::new(config.concurrency));
        Self {
            config,
            runner,
            token,
            work_dir,
            plan,
            audit,
            metrics,
            slots,
        }
    }
}

/// The runner of a generator without a command source: never asked to run anything.
#[derive(Debug)]
pub struct NoCommands;

impl Runner for NoCommands {
    fn execute(
        &self,
        _spec: &supervisor::RequestSpec,
        _input: Box<dyn std::io::Read + Send>,
        _cancel: &CancelToken,
    ) -> Result<supervisor::Executed, vocab::request::RequestError> {
        Err(vocab::request::RequestError::internal(
            "this generator has no command source",
        ))
    }
    fn reclaim(&self, _spec: &supervisor::RequestSpec) {}
    fn describe(&self) -> &'static str {
        "no commands (static or file source)"
    }
}

/// An HTTP error: status, a short machine word and the message the controller shows.
#[derive(Debug, Clone)]
pub struct HttpError {
    /// Status code.
    pub status: StatusCode,
    /// `error` field.
    pub error: &'static str,
    /// `message` field.
    pub message: String,
}

fn err(status: StatusCode, error: &'static str, message: impl Into<String>) -> HttpError {
    HttpError {
        status,
        error,
        message: message.into(),
    }
}

/// The status a jail failure becomes (mapped here, once).
fn status_of(kind: ErrorKind) -> StatusCode {
    match kind {
        ErrorKind::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        ErrorKind::InvalidArgument => StatusCode::BAD_REQUEST,
        ErrorKind::ResourceExhausted => StatusCode::INSUFFICIENT_STORAGE,
        ErrorKind::Cancelled => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

fn json_response(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

fn error_response(e: &HttpError) -> Response<Full<Bytes>> {
    let body = serde_json::json!({"error": e.error, "message": e.message}).to_string();
    let mut r = json_response(e.status, body);
    if e.status == StatusCode::UNAUTHORIZED {
        r.headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    if e.status == StatusCode::METHOD_NOT_ALLOWED {
        r.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("POST"));
    }
    r
}

/// What one request did, for the audit event and metrics.
#[derive(Debug, Default)]
struct Ctx {
    /// Refused before authentication (an unknown endpoint or method, a wrong token): audited
    /// within the refusal budget only.
    refused: bool,
    appset: String,
    bytes_in: u64,
    record: Option<supervisor::record::Recorder>,
    limit: Option<Limit>,
}

impl AppSetService {
    /// Handle one HTTP request (never fails at the HTTP level: errors are JSON responses).
    pub async fn handle(
        self: Arc<Self>,
        req: Request<Incoming>,
        remote: Option<SocketAddr>,
    ) -> Result<Response<Full<Bytes>>, Infallible> {
        let started = Instant::now();
        let request_id = uuid::Uuid::new_v4();
        let span = tracing::info_span!("appset", %request_id, remote = %remote.map(|r| r.to_string()).unwrap_or_default(), appset = tracing::field::Empty);
        let _active = self.metrics.started();
        let mut ctx = Ctx::default();
        let out = tracing::Instrument::instrument(self.serve_one(req, &mut ctx), span).await;
        let elapsed = started.elapsed();
        let (resp, result, bytes_out) = match &out {
            Ok(body) => (
                json_response(StatusCode::OK, body.clone()),
                Ok(()),
                body.len() as u64,
            ),
            Err(e) => (error_response(e), Err(e.clone()), 0),
        };
        self.account(request_id, ctx, result, elapsed, bytes_out);
        Ok(resp)
    }

    fn account(
        &self,
        request_id: uuid::Uuid,
        ctx: Ctx,
        result: Result<(), HttpError>,
        elapsed: Duration,
        bytes_out: u64,
    ) {
        let status = result
            .as_ref()
            .err()
            .map(|e| crate::status::from_http(e.status, &e.message));
        let http_status = result
            .as_ref()
            .map_or_else(|e| e.status, |()| StatusCode::OK);
        crate::lifecycle::account(
            &self.metrics,
            &self.audit,
            crate::lifecycle::Ending {
                op: Operation::Generator,
                seen: Seen {
                    request_id: request_id.to_string(),
                    app: ctx.appset,
                    project: None,
                    archive: ArchiveInfo {
                        bytes: ctx.bytes_in,
                        ..Default::default()
                    },
                    limit: ctx.limit,
                    ..Default::default()
                },
                result: status.as_ref().map_or(Ok(()), Err),
                code: Some(http_status.as_u16().to_string()),
                elapsed,
                plan: &self.plan,
                record: ctx
                    .record
                    .as_ref()
                    .map(supervisor::record::snapshot)
                    .unwrap_or_default(),
                bytes_out,
                refused: ctx.refused,
            },
        );
    }

    async fn serve_one(&self, req: Request<Incoming>, ctx: &mut Ctx) -> Result<String, HttpError> {
        let deadline = Instant::now() + Duration::from_secs(self.config.timeout_seconds);
        if req.uri().path() != PATH {
            ctx.refused = true;
            return Err(err(
                StatusCode::NOT_FOUND,
                "not_found",
                format!(
                    "no such endpoint {}; the generator serves POST {PATH}",
                    echoed(req.uri().path())
                ),
            ));
        }
        if req.method() != Method::POST {
            ctx.refused = true;
            return Err(err(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                format!("{} is not allowed; use POST", echoed(req.method().as_str())),
            ));
        }
        if let Err(e) = self.token.check(
            req.headers()
                .get(header::AUTHORIZATION)
                .map(HeaderValue::as_bytes),
        ) {
            static REFUSED: crate::sparse::Sparse = crate::sparse::Sparse::new();
            REFUSED.warn("request refused: authentication", &e);
            ctx.refused = true;
            return Err(err(StatusCode::UNAUTHORIZED, "unauthorized", e.to_string()));
        }
        let json_type = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|v| {
                v.split(';')
                    .next()
                    .unwrap_or("")
                    .trim()
                    .eq_ignore_ascii_case("application/json")
            })
            .unwrap_or(false);
        if !json_type {
            return Err(err(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "Content-Type must be application/json",
            ));
        }
        let limit = self.config.body_bytes;
        if let Some(len) = req
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
            && len > limit
        {
            ctx.limit = Some(Limit::Body);
            return Err(too_large(limit));
        }
        let body = match tokio::time::timeout_at(
            deadline.into(),
            Limited::new(req.into_body(), limit as usize).collect(),
        )
        .await
        {
            Err(_) => {
                ctx.limit = Some(Limit::Timeout);
                return Err(err(
                    StatusCode::REQUEST_TIMEOUT,
                    "request_timeout",
                    format!(
                        "request body not received within {} s",
                        self.config.timeout_seconds
                    ),
                ));
            }
            Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
                ctx.limit = Some(Limit::Body);
                return Err(too_large(limit));
            }
            Ok(Err(e)) => {
                return Err(err(
                    StatusCode::BAD_REQUEST,
                    "bad_request",
                    format!("reading the body: {e}"),
                ));
            }
            Ok(Ok(b)) => b.to_bytes(),
        };
        ctx.bytes_in = body.len() as u64;
        let appset = validate_body(&body)?;
        tracing::Span::current().record("appset", appset.as_str());
        ctx.appset = appset.clone();

        let Ok(Ok(slot)) =
            tokio::time::timeout_at(deadline.into(), self.slots.clone().acquire_owned()).await
        else {
            ctx.limit = Some(Limit::Concurrency);
            return Err(err(
                StatusCode::SERVICE_UNAVAILABLE,
                "busy",
                format!(
                    "all {} generator slots stayed busy for {} s",
                    self.config.concurrency, self.config.timeout_seconds
                ),
            ));
        };
        let params = match &self.config.source {
            Source::Static(list) => serde_json::Value::Array(
                list.iter()
                    .cloned()
                    .map(serde_json::Value::Object)
                    .collect(),
            )
            .to_string(),
            Source::File(path) => read_params_file(path)?,
            Source::Command(argv) => {
                self.run_command(argv, &appset, body, deadline, slot, ctx)
                    .await?
            }
        };
        tracing::info!(bytes = params.len(), "parameters generated");
        Ok(format!("{{\"output\":{{\"parameters\":{params}}}}}"))
    }

    async fn run_command(
        &self,
        argv: &[String],
        appset: &str,
        body: Bytes,
        deadline: Instant,
        slot: tokio::sync::OwnedSemaphorePermit,
        ctx: &mut Ctx,
    ) -> Result<String, HttpError> {
        let internal = |m: String| err(StatusCode::INTERNAL_SERVER_ERROR, "internal", m);
        let mut tgz = Vec::new();
        archive::pack_tree(
            self.config.data_dir.as_deref(),
            &[(GENERATOR_REQUEST, &body)],
            &|_| false,
            &mut tgz,
        )
        .map_err(|e| internal(format!("packing the request: {e}")))?;
        let mut config = plugin::PluginConfig {
            name: self.config.name.clone(),
            ..Default::default()
        };
        config.spec.generate.command = argv.to_vec();
        let request_env = [("APPLICATIONSET_NAME".to_owned(), appset.to_owned())];
        // The generator's own timeout, unless the policy's wall clock ends sooner.
        let deadline = self.plan.deadline(Some((
            deadline,
            TimeLimit::Request {
                seconds: self.config.timeout_seconds,
            },
        )));
        let spec = self.plan.request(
            Operation::Generator,
            &config,
            self.work_dir.join(uuid::Uuid::new_v4().to_string()),
            ".",
            &request_env,
            deadline,
        );
        ctx.record = Some(spec.record.clone());
        let rx = crate::lifecycle::run(
            &self.runner,
            spec,
            Box::new(std::io::Cursor::new(tgz)),
            &CancelToken::new(),
            slot,
            || {},
        );
        let result = rx
            .await
            .map_err(|_| internal("the sandbox task ended without a result".into()))?;
        if let Some(rec) = &ctx.record {
            ctx.limit = supervisor::record::snapshot(rec).limit.or(ctx.limit.take());
        }
        // The generator's reply is one JSON string, bounded by the same reply memory up to here.
        match result.map(|e| e.outcome) {
            Ok(Outcome::Generated(json)) => Ok(json),
            Ok(other) => Err(internal(format!("unexpected outcome {other:?}"))),
            Err(e) => {
                let kind = e.kind();
                if kind == ErrorKind::DeadlineExceeded {
                    ctx.limit = Some(Limit::Timeout);
                }
                Err(err(status_of(kind), "generator_failed", e.to_string()))
            }
        }
    }
}

fn too_large(limit: u64) -> HttpError {
    err(
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
        format!("request body larger than {limit} bytes"),
    )
}

/// The body must be `{"applicationSetName": string, "input": {"parameters": object}?}`
/// (other fields tolerated, as Go's decoder would). Returns the ApplicationSet's name.
fn validate_body(body: &[u8]) -> Result<String, HttpError> {
    let bad = |m: String| err(StatusCode::BAD_REQUEST, "bad_request", m);
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(bad(
            "empty request body; expected {\"applicationSetName\": …, \"input\": {…}}".into(),
        ));
    }
    let v: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| bad(format!("request body is not JSON: {e}")))?;
    let obj = v
        .as_object()
        .ok_or_else(|| bad("request body must be a JSON object".into()))?;
    let name = match obj.get("applicationSetName") {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(_) => return Err(bad("applicationSetName must be a string".into())),
        None => return Err(bad("applicationSetName is missing".into())),
    };
    match obj.get("input") {
        None | Some(serde_json::Value::Null) => {}
        Some(serde_json::Value::Object(input)) => match input.get("parameters") {
            None | Some(serde_json::Value::Null) | Some(serde_json::Value::Object(_)) => {}
            Some(_) => return Err(bad("input.parameters must be an object".into())),
        },
        Some(_) => return Err(bad("input must be an object".into())),
    }
    Ok(name)
}

/// A file source: JSON or YAML, an array of objects.
fn read_params_file(path: &std::path::Path) -> Result<String, HttpError> {
    let fail = |m: String| err(StatusCode::INTERNAL_SERVER_ERROR, "internal", m);
    let text = std::fs::read_to_string(path)
        .map_err(|e| fail(format!("reading {}: {e}", path.display())))?;
    let node = plugin::yaml::parse_one(&text)
        .map_err(|e| fail(format!("{}: {e}", path.display())))?
        .ok_or_else(|| fail(format!("{} is empty", path.display())))?;
    let json = plugin::json::Json::from_yaml(&node)
        .map_err(|e| fail(format!("{}: {e}", path.display())))?
        .to_go_string();
    supervisor::parse_generated(&json).map_err(|e| fail(format!("{}: {e}", path.display())))
}

/// One HTTP/1.1 connection (after TLS and the connection cap): requests until the peer closes,
/// each through [`AppSetService::handle`]. Public for the fuzz target, which feeds it bytes.
pub async fn serve_connection<I>(
    svc: Arc<AppSetService>,
    io: I,
    remote: Option<SocketAddr>,
    tracked: Option<Arc<crate::conns::Tracked>>,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let header_timeout = Duration::from_secs(svc.config.timeout_seconds.min(10));
    let service = hyper::service::service_fn(move |req| {
        // Open from the head until the response's body is dropped (written).
        let open = tracked.clone().map(crate::conns::StreamOpen::new);
        let handled = svc.clone().handle(req, remote);
        async move {
            let resp = handled.await?;
            Ok::<_, Infallible>(resp.map(|b| crate::reply_memory::Guarded::new(b, open)))
        }
    });
    let mut b = hyper::server::conn::http1::Builder::new();
    b.timer(TokioTimer::new())
        .header_read_timeout(header_timeout);
    if let Err(e) = b.serve_connection(TokioIo::new(io), service).await {
        tracing::debug!(error = %e, "connection ended");
    }
}

/// Serve the generator on `listener` (TLS when configured) until `shutdown`, then stop
/// accepting and give in-flight requests `grace` to finish. Connections are tracked by
/// `registry` (capped, idle ones closed), a request counting as an open stream until its
/// response is written.
pub async fn serve(
    listener: std::net::TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    svc: Arc<AppSetService>,
    registry: Arc<crate::conns::Registry>,
    grace: Duration,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let (stop_tx, stop_rx) = watch::channel(false);
    let (conn_tx, mut conn_rx) = mpsc::channel::<std::io::Result<Conn>>(64);
    let acceptor = spawn_tcp_acceptor(listener, tls, conn_tx, stop_rx, registry);
    let mut tasks = tokio::task::JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            c = conn_rx.recv() => {
                let Some(Ok(conn)) = c else { continue };
                let (remote, tracked) = match tonic::transport::server::Connected::connect_info(&conn) {
                    Some(crate::conns::PeerInfo::Tcp { remote, conn, .. }) => (remote, conn),
                    _ => (None, None),
                };
                tasks.spawn(serve_connection(svc.clone(), conn, remote, tracked));
                // Finished connection tasks are collected as we go.
                while tasks.try_join_next().is_some() {}
            }
        }
    }
    let _ = stop_tx.send(true);
    acceptor.abort();
    tracing::info!(
        active = tasks.len(),
        "shutting down: draining generator requests"
    );
    let _ = tokio::time::timeout(grace, async { while tasks.join_next().await.is_some() {} }).await;
    tasks.abort_all();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_shapes() {
        assert_eq!(
            validate_body(br#"{"applicationSetName":"a","input":{"parameters":{"x":1}}}"#)
                .expect("ok"),
            "a"
        );
        assert!(validate_body(br#"{"applicationSetName":"a","input":{}}"#).is_ok());
        assert!(validate_body(br#"{"applicationSetName":"a"}"#).is_ok());
        for bad in [
            &b""[..],
            b"  \n",
            b"[]",
            b"{",
            br#"{"input":{}}"#,
            br#"{"applicationSetName":1}"#,
            br#"{"applicationSetName":"a","input":[]}"#,
            br#"{"applicationSetName":"a","input":{"parameters":[1]}}"#,
        ] {
            let e = validate_body(bad).expect_err("must refuse");
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{bad:?}");
        }
    }
}
