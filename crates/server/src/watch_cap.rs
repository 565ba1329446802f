//! Open health watches are capped. `grpc.health.v1.Health/Watch` is open without a token
//! (Kubernetes' gRPC probes cannot send one) and a watch keeps its stream, and the server's
//! memory for it, for as long as the client keeps it open: 200,000 of them on one connection
//! once took the server to 1.25 GB. At most [`MAX_HEALTH_WATCHES`] are open at once, each
//! holding its place until its response body is dropped; more are answered
//! `ResourceExhausted` at once. (`Check` stays uncapped: it answers and ends.)

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::sync::Semaphore;

/// Health watches open at once across all connections.
pub const MAX_HEALTH_WATCHES: usize = 64;

const WATCH_PATH: &str = "/grpc.health.v1.Health/Watch";

/// The layer (one per server).
#[derive(Debug, Clone)]
pub struct CapHealthWatches(Arc<Semaphore>);

impl Default for CapHealthWatches {
    fn default() -> Self {
        Self(Arc::new(Semaphore::new(MAX_HEALTH_WATCHES)))
    }
}

impl<S> tower_layer::Layer<S> for CapHealthWatches {
    type Service = Capped<S>;
    fn layer(&self, inner: S) -> Capped<S> {
        Capped {
            inner,
            places: self.0.clone(),
        }
    }
}

/// The service the layer wraps.
#[derive(Debug, Clone)]
pub struct Capped<S> {
    inner: S,
    places: Arc<Semaphore>,
}

impl<S, ReqB> tower_service::Service<http::Request<ReqB>> for Capped<S>
where
    S: tower_service::Service<http::Request<ReqB>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<ReqB>) -> Self::Future {
        if req.uri().path() != WATCH_PATH {
            return Box::pin(self.inner.call(req));
        }
        let Ok(place) = self.places.clone().try_acquire_owned() else {
            let status = crate::status::health_watches_full(MAX_HEALTH_WATCHES);
            return Box::pin(std::future::ready(Ok(status.into_http())));
        };
        let response = self.inner.call(req);
        Box::pin(async move {
            let response = response.await?;
            Ok(response
                .map(|body| tonic::body::Body::new(crate::reply_memory::Guarded::new(body, place))))
        })
    }
}
