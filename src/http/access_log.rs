//! The access log of the HTTP server: a line per request that no RPC
//! dialect logged already (those are logged by [`crate::rpc::record`] with
//! their protocol and outcome), as `--access_log` says: every request, or
//! only failed (4xx, 5xx) and slow ones at most once a second per status.

use std::{
    net::SocketAddr,
    sync::Arc,
    task::{Context, Poll},
    time::Instant,
};

use axum::{
    extract::{ConnectInfo, Request},
    response::Response,
};
use futures_util::future::{BoxFuture, Either};
use tower::{Layer, Service};

use crate::{
    logging::{AccessLog as Mode, RateLimit, SLOW_CALL},
    rpc::ACCESS_LOG,
};

/// Marks a response whose call [`crate::rpc::record`] already logged, so
/// the access log does not write a second line for it.
#[derive(Debug, Clone, Copy)]
pub struct CallLogged;

/// Logs a line per request: method, path, peer, status, latency. Never
/// bodies or headers, which carry tokens. RPC calls are logged by
/// [`crate::rpc::record`] with their protocol and outcome, and skipped here.
/// A plain layer rather than `middleware::from_fn`, so that with the access
/// log off or filtered out a request pays nothing for it (no boxed future,
/// no clone of the inner service).
#[derive(Debug, Clone)]
pub struct AccessLogLayer {
    mode: Mode,
    /// Lines of failed and slow requests, one a second per status.
    lines: Arc<RateLimit<u16>>,
}

impl AccessLogLayer {
    pub fn new(mode: Mode) -> Self {
        Self {
            mode,
            lines: Arc::default(),
        }
    }
}

impl<S> Layer<S> for AccessLogLayer {
    type Service = AccessLog<S>;

    fn layer(&self, inner: S) -> AccessLog<S> {
        AccessLog {
            inner,
            layer: self.clone(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct AccessLog<S> {
    inner: S,
    layer: AccessLogLayer,
}

impl<S> Service<Request> for AccessLog<S>
where
    S: Service<Request, Response = Response>,
    S::Future: Send + 'static,
{
    type Response = Response;
    type Error = S::Error;
    type Future = Either<S::Future, BoxFuture<'static, Result<Response, S::Error>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let mode = self.layer.mode;
        if mode == Mode::Off || !tracing::enabled!(target: ACCESS_LOG, tracing::Level::INFO) {
            return Either::Left(self.inner.call(request));
        }
        let lines = Arc::clone(&self.layer.lines);
        let started = Instant::now();
        let method = request.method().clone();
        let path = request.uri().path().to_owned();
        let peer = request
            .extensions()
            .get::<ConnectInfo<SocketAddr>>()
            .map(|ConnectInfo(peer)| *peer);
        let response = self.inner.call(request);
        Either::Right(Box::pin(async move {
            let response = response.await?;
            if response.extensions().get::<CallLogged>().is_some() {
                return Ok(response);
            }
            let status = response.status().as_u16();
            let latency = started.elapsed();
            let left_out = match mode {
                Mode::All => Some(0),
                _ if status < 400 && latency <= SLOW_CALL => None,
                _ => lines.admit(status),
            };
            let Some(left_out) = left_out else {
                return Ok(response);
            };
            tracing::info!(
                target: ACCESS_LOG,
                %method,
                path,
                peer = peer.map(|peer| peer.to_string()).unwrap_or_default(),
                status,
                latency_us = latency.as_micros() as u64,
                left_out,
                "request"
            );
            Ok(response)
        }))
    }
}
