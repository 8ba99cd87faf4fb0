//! Rule "no rebinding": a page of evil.example whose DNS name is made to
//! point at this server (DNS rebinding) calls it as its own origin, so the
//! browser lets it read every answer, and the cross-site rule
//! ([`super::cors`]) sees an `Origin` equal to the `Host`. What gives it
//! away is the `Host`: the attacker's name. So a request that carries an
//! `Origin` (what browsers send on every cross-origin request and on every
//! POST) is served only when its `Host` is an IP literal, a loopback name
//! (`localhost`, `*.localhost`), this machine's name or one of
//! `--allowed_hosts`; others get 403. Requests without an `Origin` (curl,
//! the daemons, tools) are not browsers' and pass.

use axum::{
    extract::{Request, State},
    http::header,
    middleware::Next,
    response::{IntoResponse, Response},
};

use crate::{
    rpc::error::{ApiError, ErrorKind},
    security::AllowedHosts,
};

/// The middleware of the whole router.
pub async fn refuse_rebinding(
    State(allowed): State<AllowedHosts>,
    request: Request,
    next: Next,
) -> Response {
    if !request.headers().contains_key(header::ORIGIN) {
        return next.run(request).await;
    }
    let authority = request
        .uri()
        .authority()
        .map(|authority| authority.as_str().to_owned())
        .or_else(|| {
            request
                .headers()
                .get(header::HOST)
                .and_then(|host| host.to_str().ok())
                .map(str::to_owned)
        });
    match authority {
        Some(authority) if allowed.allows(&authority) => next.run(request).await,
        authority => ApiError::new(
            ErrorKind::CrossSite,
            format!(
                "a page reached this server as {:?}, which is not one of its names: with an \
                 Origin, requests are served only for an IP address, localhost, this \
                 machine's name or a name of --allowed_hosts (DNS rebinding)",
                authority.as_deref().unwrap_or("no Host")
            ),
        )
        .into_response(),
    }
}
