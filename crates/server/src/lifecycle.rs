//! One request's life behind either front door, the CMP service (gRPC, `service`) and the
//! ApplicationSet generator (HTTP, `appset`): its spec runs on a blocking thread ([`run`]), its
//! jail is reclaimed once the result is handed back and its slot freed once its UID is back in
//! the pool; then, exactly once, its audit event and its metrics are made from what it did
//! ([`account`]). The front doors keep their protocol's concerns: streams, deadlines, bodies and
//! status codes.

use std::io::Read;
use std::sync::Arc;
use std::time::Duration;

use supervisor::{CancelToken, Executed, Plan, RequestSpec, Runner};
use tokio::sync::oneshot;
use vocab::record::Limit;
use vocab::request::{Operation, RequestError};

use crate::audit::{AuditSink, Seen};
use crate::metrics::{Finished, Metrics};

/// What the runner answered for one request.
pub(crate) type RunResult = Result<Executed, RequestError>;

/// Runs `spec` on a blocking thread (a request's steps 5–13, docs/supervisor.md), reading its
/// archive from `input`, until done or `cancel` fires. Its result arrives on the returned
/// receiver as soon as it exists; then the jail is reclaimed (step 15) (off the response's critical path), `slot` is dropped (a burst queues for slots
/// rather than running out of UIDs) and `then` runs.
pub(crate) fn run<S: Send + 'static>(
    runner: &Arc<dyn Runner>,
    spec: RequestSpec,
    input: Box<dyn Read + Send>,
    cancel: &CancelToken,
    slot: S,
    then: impl FnOnce() + Send + 'static,
) -> oneshot::Receiver<RunResult> {
    let runner = runner.clone();
    let cancel = cancel.clone();
    let span = tracing::Span::current();
    let (tx, rx) = oneshot::channel();
    tokio::task::spawn_blocking(move || {
        let _e = span.enter();
        let _ = tx.send(runner.execute(&spec, input, &cancel));
        runner.reclaim(&spec);
        drop(slot);
        then();
    });
    rx
}

/// How a request ended, as the front door saw it.
pub(crate) struct Ending<'a> {
    pub op: Operation,
    pub seen: Seen,
    /// What the caller was told, as a gRPC status (the generator's HTTP errors mapped).
    pub result: Result<(), &'a tonic::Status>,
    /// The code the caller saw where it is not the gRPC one (the generator's HTTP status).
    pub code: Option<String>,
    pub elapsed: Duration,
    /// The plan it ran under (the default's before one was chosen).
    pub plan: &'a Plan,
    /// What its run recorded (empty when it was refused before a run).
    pub record: vocab::record::RunRecord,
    /// Manifest or parameter bytes returned.
    pub bytes_out: u64,
    /// Refused before it authenticated: audited within the refusal budget only.
    pub refused: bool,
}

/// Step 16: the request's audit event and metrics, once.
pub(crate) fn account(metrics: &Metrics, audit: &AuditSink, end: Ending<'_>) {
    let mut event = crate::audit::finished(
        end.op,
        end.seen,
        end.result,
        end.elapsed,
        crate::audit::policy_ref(end.plan),
        end.record,
    );
    if let Some(code) = end.code {
        event.code = code;
    }
    let grpc = end
        .result
        .map_or_else(tonic::Status::code, |()| tonic::Code::Ok);
    let limit = event.limit;
    metrics.finished(&Finished {
        rpc: end.op.rpc_name(),
        code: &event.code,
        policy: &event.policy.name,
        duration: end.elapsed,
        bytes_in: event.archive.bytes,
        bytes_out: end.bytes_out,
        kill: crate::metrics::kill_reason(limit),
        rejection: (limit == Some(Limit::Archive)).then_some(match grpc {
            tonic::Code::ResourceExhausted => "limit",
            tonic::Code::DataLoss => "integrity",
            _ => "policy",
        }),
        seccomp: event
            .seccomp_audit
            .iter()
            .map(|e| (e.syscall.as_str(), e.action.as_str(), e.count))
            .collect(),
        egress: event.egress.iter().map(|c| c.decision.as_str()).collect(),
        // The cache holds the CMP's archives; a generator's tree is its request body.
        tree_cache: event
            .tree_cache
            .filter(|_| end.op != Operation::Generator)
            .map(vocab::record::TreeCacheUse::as_str),
        busy: limit == Some(Limit::Concurrency),
    });
    if end.refused {
        audit.emit_refused(&event);
    } else {
        audit.emit(&event);
    }
}
