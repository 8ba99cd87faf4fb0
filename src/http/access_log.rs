//! The access log of the HTTP server: one line per request that no RPC
//! dialect logged already (those are logged by [`crate::rpc::record`] with
//! their protocol and outcome).

use std::{
    net::SocketAddr,
    task::{Context, Poll},
    time::Instant,
};

use axum::{
    extract::{ConnectInfo, Request},
    response::Response,
};
use futures_util::future::{BoxFuture, Either};
use tower::{Layer, Service};

use crate::rpc::ACCESS_LOG;

/// Marks a response whose call [`crate::rpc::record`] already logged, so
/// the access log does not write a second line for it.
#[derive(Debug, Clone, Copy)]
pub struct CallLogged;

/// Logs one line per request: method, path, peer, status, latency. Never
/// bodies or headers, which carry tokens. RPC calls are logged by
/// [`crate::rpc::record`] with their protocol and outcome, and skipped here. A plain layer rather than
/// `middleware::from_fn`, so that with the access log filtered out a request
/// pays nothing for it (no boxed future, no clone of the inner service).
#[derive(Debug, Clone, Copy)]
pub struct AccessLogLayer;

impl<S> Layer<S> for AccessLogLayer {
    type Service = AccessLog<S>;

    fn layer(&self, inner: S) -> AccessLog<S> {
        AccessLog { inner }
    }
}

#[derive(Debug, Clone)]
pub struct AccessLog<S> {
    inner: S,
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
        if !tracing::enabled!(target: ACCESS_LOG, tracing::Level::INFO) {
            return Either::Left(self.inner.call(request));
        }
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
            tracing::info!(
                target: ACCESS_LOG,
                %method,
                path,
                peer = peer.map(|peer| peer.to_string()).unwrap_or_default(),
                status = response.status().as_u16(),
                latency_us = started.elapsed().as_micros() as u64,
                "request"
            );
            Ok(response)
        }))
    }
}
