//! The service side of the idle deadline: a request is in flight from its call until its
//! answer's body ended.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::{Extensions, Request, Response};
use http_body::{Body, Frame, SizeHint};
use tonic::transport::server::TlsConnectInfo;

use crate::conn::{RequestGuard, Tracker};

/// A tower layer that counts each request against its [`crate::Conn`], found through the
/// connect info tonic puts into the request's extensions. Add it to a tonic server that
/// serves an [`crate::Incoming`] (`Server::builder().layer(TrackLayer)`).
#[derive(Debug, Clone, Copy, Default)]
pub struct TrackLayer;

impl<S> tower::Layer<S> for TrackLayer {
    type Service = Track<S>;

    fn layer(&self, inner: S) -> Track<S> {
        Track { inner, fixed: None }
    }
}

/// A service whose requests are counted against their connection (see [`TrackLayer`]).
#[derive(Debug, Clone)]
pub struct Track<S> {
    inner: S,
    fixed: Option<Tracker>,
}

impl<S> Track<S> {
    /// `inner`, serving the one connection `tracker` belongs to (a hyper server that builds
    /// one service per connection).
    pub fn for_connection(inner: S, tracker: Tracker) -> Track<S> {
        Track {
            inner,
            fixed: Some(tracker),
        }
    }
}

fn tracker_of(ext: &Extensions) -> Option<&Tracker> {
    ext.get::<Tracker>().or_else(|| {
        ext.get::<TlsConnectInfo<Tracker>>()
            .map(TlsConnectInfo::get_ref)
    })
}

impl<S, B, RB> tower::Service<Request<B>> for Track<S>
where
    S: tower::Service<Request<B>, Response = Response<RB>>,
    S::Future: Send + 'static,
    S::Error: 'static,
    RB: Body + Unpin + 'static,
{
    type Response = Response<TrackedBody<RB>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let guard = self
            .fixed
            .as_ref()
            .or_else(|| tracker_of(req.extensions()))
            .map(Tracker::begin);
        let answer = self.inner.call(req);
        Box::pin(async move {
            let resp = answer.await?;
            Ok(resp.map(|inner| TrackedBody { inner, guard }))
        })
    }
}

/// An answer's body that keeps its request in flight until it ended or was dropped.
#[derive(Debug)]
pub struct TrackedBody<B> {
    inner: B,
    guard: Option<RequestGuard>,
}

impl<B: Body + Unpin> Body for TrackedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let r = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(None) = r {
            self.guard = None;
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
