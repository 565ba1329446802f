//! Refused connections are told why. A peer we will not serve — a UID outside the allow list
//! on the unix socket, a plaintext client on a TLS port — gets an answer it can show its user
//! instead of a bare reset ("broken pipe", "h2 protocol error"): HTTP/2 clients a gRPC status
//! on each request, HTTP/1 clients a `400` with the reason. Bounded: a few refusals at once,
//! each for a few seconds; beyond that the connection is simply closed.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::Semaphore;

/// Refusals being answered at once; more are closed without an answer.
const MAX_REFUSALS: usize = 16;
/// How long a refused connection is kept to deliver the answer.
const REFUSAL_TIME: Duration = Duration::from_secs(5);

/// Answers refused connections (cheap to clone; one budget per listener).
#[derive(Clone)]
pub(crate) struct Refuser {
    permits: Arc<Semaphore>,
}

impl Refuser {
    pub(crate) fn new() -> Self {
        Self {
            permits: Arc::new(Semaphore::new(MAX_REFUSALS)),
        }
    }

    /// Serve HTTP/2 on `io`, answering every request with `status`, for at most
    /// [`REFUSAL_TIME`].
    pub(crate) fn grpc<I>(&self, io: I, status: tonic::Status)
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let Ok(permit) = self.permits.clone().try_acquire_owned() else {
            return;
        };
        tokio::spawn(async move {
            let _permit = permit;
            let svc = hyper::service::service_fn(move |_req| {
                let status = status.clone();
                async move {
                    Ok::<_, Infallible>(
                        status.into_http::<http_body_util::Empty<hyper::body::Bytes>>(),
                    )
                }
            });
            let mut b =
                hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new());
            b.timer(hyper_util::rt::TokioTimer::new());
            let conn = b.serve_connection(hyper_util::rt::TokioIo::new(io), svc);
            let _ = tokio::time::timeout(REFUSAL_TIME, conn).await;
        });
    }

    /// Write one HTTP/1.1 `400` whose body is `why`, then close.
    pub(crate) fn http1<I>(&self, mut io: I, why: String)
    where
        I: AsyncWrite + Unpin + Send + 'static,
    {
        let Ok(permit) = self.permits.clone().try_acquire_owned() else {
            return;
        };
        tokio::spawn(async move {
            let _permit = permit;
            let body = format!("{why}\n");
            let reply = format!(
                "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = tokio::time::timeout(REFUSAL_TIME, async {
                let _ = io.write_all(reply.as_bytes()).await;
                let _ = io.shutdown().await;
            })
            .await;
        });
    }
}

/// What the first bytes of a connection on a TLS port say about the client.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum FirstBytes {
    /// A TLS record (handshake): go on with TLS.
    Tls,
    /// HTTP/2 with prior knowledge (a plaintext gRPC client).
    PlaintextH2,
    /// Anything else: an HTTP/1 request or garbage.
    Plaintext,
}

/// Classify a connection by its first bytes (a TLS record starts with content type 22).
pub(crate) fn classify(first: &[u8]) -> FirstBytes {
    match first {
        [0x16, ..] => FirstBytes::Tls,
        b if b.starts_with(b"PRI ") => FirstBytes::PlaintextH2,
        _ => FirstBytes::Plaintext,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tells_tls_from_plaintext() {
        assert_eq!(classify(&[0x16, 3, 1]), FirstBytes::Tls);
        assert_eq!(classify(b"PRI * HTTP/2.0\r\n"), FirstBytes::PlaintextH2);
        assert_eq!(classify(b"POST /api/v1"), FirstBytes::Plaintext);
    }
}
