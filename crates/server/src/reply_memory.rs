//! A response holds its share of the server's reply memory until its body is written.
//!
//! The runner charges a large reply to a server-wide budget when it starts reading it from the
//! jail ([`supervisor::ReplyShare`]); the parsed manifests and the encoded message are each at most
//! that size. The handler puts the share into the response's extensions, and this layer moves
//! it into the response body, which hyper drops once the last byte is written (or the
//! connection is gone): a slow reader keeps its reply's memory charged, so many of them cannot
//! add up beyond the budget.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http_body::{Body, Frame, SizeHint};
use supervisor::ReplyShare;

/// The layer (one per server).
#[derive(Debug, Clone, Copy, Default)]
pub struct HoldReplyMemory;

impl<S> tower_layer::Layer<S> for HoldReplyMemory {
    type Service = Held<S>;
    fn layer(&self, inner: S) -> Held<S> {
        Held(inner)
    }
}

/// The service the layer wraps.
#[derive(Debug, Clone)]
pub struct Held<S>(S);

impl<S, Req, B> tower_service::Service<Req> for Held<S>
where
    S: tower_service::Service<Req, Response = http::Response<B>>,
    S::Future: Send + 'static,
    S::Error: 'static,
    B: 'static,
{
    type Response = http::Response<Guarded<B, Option<ReplyShare>>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let response = self.0.call(req);
        Box::pin(async move {
            let (mut parts, body) = response.await?.into_parts();
            let share = parts.extensions.remove::<ReplyShare>();
            Ok(http::Response::from_parts(parts, Guarded::new(body, share)))
        })
    }
}

/// A response body that holds something (its reply's share, a health watch's place) until
/// it is dropped.
#[derive(Debug)]
pub struct Guarded<B, H> {
    body: B,
    _held: H,
}

impl<B, H> Guarded<B, H> {
    /// `body`, holding `held` while it lives.
    pub fn new(body: B, held: H) -> Self {
        Self { body, _held: held }
    }
}

impl<B: Body + Unpin, H: Unpin> Body for Guarded<B, H> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// Attach `share` to `response` (nothing for a small reply).
pub fn attach<T>(mut response: tonic::Response<T>, share: ReplyShare) -> tonic::Response<T> {
    if share.bytes() > 0 {
        response.extensions_mut().insert(share);
    }
    response
}
